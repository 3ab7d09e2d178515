"""Phase `write`: build the manifest from the results, validate it against its schema and write it (`--out`).

Reads `results` (the decision) and `config.out`. Marks the run complete.
"""

from __future__ import annotations

from pathlib import Path

from runinfra_opt.optimize.state import RunState


def run(state: RunState) -> None:
    from runinfra_opt.manifest import build_manifest, write_manifest

    path = Path(state.config.out)
    write_manifest(path, build_manifest(state.results))
    state.results.status = "complete"
    state.results.add_note(f"manifest written to {path}", kind="manifest")
