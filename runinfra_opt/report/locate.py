"""Finding a run's results file from what the user typed: a directory, a results.json, a run id, `latest`."""

from __future__ import annotations

from pathlib import Path

from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.results import RunResults, load_results

DEFAULT_RUNS_DIR = Path(".runinfra/runs")


def resolve_run(run: str, runs_dir: Path = DEFAULT_RUNS_DIR) -> Path:
    """The results.json that `run` names: a run directory, a results file, a run id under `runs_dir`, or
    `latest` (`runs_dir/latest`: a link to the newest run, or a file holding its directory name)."""
    path = Path(run)
    if run != "latest" and path.exists():
        return path / "results.json" if path.is_dir() else path
    if run == "latest":
        latest = runs_dir / "latest"
        if latest.is_dir():
            return latest / "results.json"
        if latest.is_file():
            # A plain file naming the newest run (where symbolic links are not available).
            name = latest.read_text(encoding="utf-8").strip()
            if name:
                target = Path(name) if Path(name).is_absolute() else runs_dir / name
                return target / "results.json"
        if latest.is_symlink():
            raise UserInputError(f"{latest}: points to a run that no longer exists ({latest.readlink()})")
        raise UserInputError(
            f"no run to report: {latest} does not exist; run `runinfra-opt optimize` first, "
            "or pass a run directory or a results.json"
        )
    by_id = runs_dir / run
    if by_id.is_dir():
        return by_id / "results.json"
    raise UserInputError(f"{run}: no such run directory, results file or run id under {runs_dir}")


def load_run(run: str, runs_dir: Path = DEFAULT_RUNS_DIR) -> RunResults:
    """Resolve and load a run; every failure is one clear UserInputError naming the file."""
    return load_results(resolve_run(run, runs_dir))


def write_report(path: Path, text: str) -> None:
    """Write a rendered report atomically, with the usual permissions (umask): reports are meant to be shared."""
    atomic_write_text(path, text)
