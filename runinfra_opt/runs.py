"""When a run becomes the project's `latest`.

`<runs dir>/latest` (default `.runinfra/runs/latest`) is what `report`, `report --compare` and
`optimize --resume latest` read when given no run. It moves to a new run only when that run's directory lies
inside the runs directory: every run `optimize` names itself, and a `--run-dir` under `--runs-dir`. A
`--run-dir` elsewhere (a CI workspace, a scratch directory, a test's temporary directory) leaves `latest` as
it is, and `optimize` says so: such a run is reported by its directory. A resumed run does not move it.
"""

from __future__ import annotations

from pathlib import Path


def moves_latest(runs_root: Path, run_dir: Path) -> bool:
    """True when a new run in `run_dir` becomes `<runs_root>/latest`."""
    return run_dir.resolve().is_relative_to(runs_root.resolve())


def latest_left_note(runs_root: Path, run_dir: Path) -> str:
    """The line `optimize` prints when a run does not become `latest`."""
    return (
        f"--run-dir {run_dir} lies outside the runs directory {runs_root}: {runs_root / 'latest'} is left as it "
        f"is; report this run with `runinfra-opt report {run_dir}`"
    )
