"""Run directories: where an `optimize` run keeps its results (`<runs root>/<UTC time>-<id>/results.json`),
the `latest` pointer, and how `--resume RUN` finds and reopens a run.

`<runs dir>/latest` (default `.runinfra/runs/latest`) is what `report`, `report --compare` and
`optimize --resume latest` read when given no run. It moves to a new run only when that run's directory lies
inside the runs directory: every run `optimize` names itself, and a `--run-dir` under `--runs-dir`. A
`--run-dir` elsewhere (a CI workspace, a scratch directory, a test's temporary directory) leaves `latest` as
it is, and `optimize` says so: such a run is reported by its directory. A resumed run does not move it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from runinfra_opt import __version__
from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.results import (
    RESULTS_FILE,
    SCHEMA_VERSION,
    RunResults,
    load_results,
    resolve_run,
    save_results,
)
from runinfra_opt.runlock import RunBusy, RunLock

COST_MODEL_FILE = "cost_model.json"


def new_run_dir(runs_root: Path) -> Path:
    """`<runs_root>/<UTC time>-<short id>/`, created."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = runs_root / f"{stamp}-{secrets.token_hex(3)}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def moves_latest(runs_root: Path, run_dir: Path) -> bool:
    """True when a new run in `run_dir` becomes `<runs_root>/latest`."""
    return run_dir.resolve().is_relative_to(runs_root.resolve())


def latest_left_note(runs_root: Path, run_dir: Path) -> str:
    """The line `optimize` prints when a run does not become `latest`."""
    return (
        f"--run-dir {run_dir} lies outside the runs directory {runs_root}: {runs_root / 'latest'} is left as it "
        f"is; report this run with `runinfra-opt report {run_dir}`"
    )


def point_latest(runs_root: Path, run_dir: Path) -> None:
    """Make `<runs_root>/latest` point to `run_dir`: a relative symlink, or a file naming it where symlinks
    are not possible."""
    latest = runs_root / "latest"
    target = os.path.relpath(run_dir.resolve(), runs_root.resolve())
    tmp = runs_root / f".latest-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        if latest.is_dir() and not latest.is_symlink():
            raise OSError("a real directory named latest")
        tmp.replace(latest)
    except OSError:
        tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if latest.is_symlink():
                latest.unlink()
            atomic_write_text(latest, target + "\n")


def resumed_run_dir(spec: str, runs_root: Path) -> Path:
    """The run directory `--resume RUN` names: a directory or its results.json, a run id under the runs root,
    or `latest` (resolved: the run's own directory, whose name is its id)."""
    results_file = resolve_run(spec, runs_root, purpose="resume", option="--resume")
    if results_file.name != RESULTS_FILE or not results_file.is_file():
        raise UserInputError(f"--resume {spec}: no run with a {RESULTS_FILE} there or under {runs_root}")
    return results_file.parent.resolve()


@dataclass
class OpenedRun:
    """A run directory with its results, new or reopened."""

    config: OptimizeConfig
    """The configuration the run measures with (a resumed run keeps the one it started with)."""
    run_dir: Path
    results: RunResults
    resumed: bool
    lock: RunLock
    """Held while the run runs (`release` when it ends): `report` and `--resume` tell a live run by it."""


def _lock(run_dir: Path, what: str) -> RunLock:
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except RunBusy as busy:
        raise UserInputError(
            f"{what}: the run is still running ({busy}); wait for it to end or stop it first"
        ) from None
    return lock


def open_run(config: OptimizeConfig, *, resume: str | None = None) -> OpenedRun:
    """Create the run directory and its results file, or reopen them for `--resume RUN`; either way take the
    run lock (a run that another process still runs is refused)."""
    runs_root = Path(config.runs_root)
    if resume:
        run_dir = resumed_run_dir(resume, runs_root)
        lock = _lock(run_dir, f"--resume {resume}")
        try:
            return _reopen(config, resume, run_dir, lock)
        except BaseException:
            lock.release()
            raise
    if config.run_dir:
        run_dir = Path(config.run_dir)
        if (run_dir / RESULTS_FILE).exists():
            raise UserInputError(f"--run-dir {run_dir}: already holds a run; use --resume {run_dir} to continue it")
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_run_dir(runs_root)
    lock = _lock(run_dir, f"--run-dir {run_dir}")
    results = RunResults(
        tool_version=__version__,
        run_id=run_dir.name,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        config=config.to_dict(),
        owner=lock.owner.to_dict() if lock.owner else None,
    )
    try:
        save_results(results, run_dir / RESULTS_FILE)
    except BaseException:
        lock.release()
        raise
    if moves_latest(runs_root, run_dir):
        with contextlib.suppress(OSError):
            runs_root.mkdir(parents=True, exist_ok=True)
            point_latest(runs_root, run_dir)
    return OpenedRun(config, run_dir, results, resumed=False, lock=lock)


def _reopen(config: OptimizeConfig, resume: str, run_dir: Path, lock: RunLock) -> OpenedRun:
    """The run in `run_dir` (whose lock this process now holds), ready to continue."""
    results = load_results(run_dir / RESULTS_FILE)
    if results.schema_version != SCHEMA_VERSION:
        raise UserInputError(
            f"--resume {resume}: {run_dir / RESULTS_FILE} was written by another runinfra-opt version "
            f"(results schema {results.schema_version}, this one resumes {SCHEMA_VERSION}); start a new run "
            "(`runinfra-opt report` still reads it)"
        )
    stored = OptimizeConfig.from_dict(results.config)
    # Where to write the manifest may change on resume, and where the cluster is and what it may retry;
    # nothing that decides what is measured may.
    if stored.executor == "local" and config.executor == "ray":
        raise UserInputError(
            f"--resume {resume}: the run started with the local executor; resume it without --executor ray"
        )
    stored = stored.with_changes(
        out=config.out,
        runs_root=config.runs_root,
        ray_address=config.ray_address or stored.ray_address,
        trial_resources=config.trial_resources or stored.trial_resources,
        max_retries=config.max_retries,
    )
    if results.status == "running" and results.owner is not None:
        # This process holds the lock now: the one that wrote `running` is gone without a word.
        results.add_note(
            f"died without a word after phase {results.phase} (pid {results.owner.get('pid')} on host "
            f"{results.owner.get('host')})",
            kind="interrupted",
        )
    results.status, results.stopped = "running", None
    results.owner = lock.owner.to_dict() if lock.owner else None
    results.add_note(f"resumed at {datetime.now(UTC).isoformat(timespec='seconds')}")
    return OpenedRun(stored, run_dir, results, resumed=True, lock=lock)
