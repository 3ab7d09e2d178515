"""The phases of an `optimize` run, one module each, run in order by `optimize.pipeline`.

Each module's docstring says what the phase reads from the run state and what it fills; `run(state)` does the
work and, where later phases need in-memory state that a resume must rebuild, `restore(state)` rebuilds it
from the results on disk.
"""
