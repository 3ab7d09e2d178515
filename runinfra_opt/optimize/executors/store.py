"""Trial files: `<run dir>/trials/<trial>.json`, one per finished (or failed) trial, written atomically as it
arrives on the driver. They are the durable record of a distributed confirmation: `results.json` is merged
from them, so a driver that dies between the two loses nothing, and `--resume` skips every trial done."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pydantic import Field, ValidationError

from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import TrialResult

TRIALS_DIR = "trials"


class TrialFile(TrialResult):
    """A trial with its records (results.json keeps the records in the variants instead)."""

    baseline_requests: list[RequestRecord] = Field(default_factory=list)
    measured_requests: list[RequestRecord] = Field(default_factory=list)

    def summary(self) -> TrialResult:
        return TrialResult.model_validate(self.model_dump(exclude={"baseline_requests", "measured_requests"}))


def trial_path(run_dir: Path, trial_id: str) -> Path:
    """A file name from the id (readable, and unique through a short hash of the id)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", trial_id).strip("._") or "trial"
    digest = hashlib.sha256(trial_id.encode()).hexdigest()[:8]
    return run_dir / TRIALS_DIR / f"{safe}-{digest}.json"


def write_trial(run_dir: Path, trial: TrialFile) -> Path:
    path = trial_path(run_dir, trial.id)
    atomic_write_text(path, trial.model_dump_json(indent=1))
    return path


def read_trials(run_dir: Path) -> dict[str, TrialFile]:
    """Every trial file of the run, by trial id (a corrupt one is a clear error naming it)."""
    found: dict[str, TrialFile] = {}
    folder = run_dir / TRIALS_DIR
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.json")):
        try:
            trial = TrialFile.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserInputError(f"{path}: corrupt trial file ({exc}); delete it to run the trial again") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise UserInputError(f"{path}: field {loc}: {first['msg']}; delete it to run the trial again") from None
        found[trial.id] = trial
    return found
