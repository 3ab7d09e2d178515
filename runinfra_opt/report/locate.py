"""Loading the run a report names (a directory, a results.json, a run id, `latest`: see
`runinfra_opt.results.resolve_run`), and writing a report."""

from __future__ import annotations

from pathlib import Path

from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.results import RESULTS_FILE, RunResults, load_results, recognise_death, resolve_run

DEFAULT_RUNS_DIR = Path(".runinfra/runs")


def load_run(run: str, runs_dir: Path = DEFAULT_RUNS_DIR) -> RunResults:
    """Resolve and load a run; every failure is one clear UserInputError naming the file. A run whose process
    died without a word reads as `status: died` (`results.recognise_death`)."""
    path = resolve_run(run, runs_dir)
    path = path / RESULTS_FILE if path.is_dir() else path
    return recognise_death(load_results(path), path)


def write_report(path: Path, text: str) -> None:
    """Write a rendered report atomically, with the usual permissions (umask): reports are meant to be shared."""
    atomic_write_text(path, text)
