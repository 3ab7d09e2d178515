"""Raw load records on disk: one JSON line per request, appended as requests complete, read back into a `LevelRun`.

`optimize --engine vllm --load ...` keeps every level's raw records under `<run dir>/load/` so that the figures
in `results.json` can be recomputed (paired ratios against the baseline, a resume) and nothing measured is lost
when a run is interrupted. The first line is a header (the level, when it started, its duration and peak in
flight, its notes), written when the level ends; a file without it is an unfinished level and is not read back.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.load.runner import LevelRun, LoadRecord
from runinfra_opt.load.spec import Concurrency, LoadLevel, Rate, Replay

_SCALARS = (
    "index", "request_id", "category", "planned_s", "sent_s", "done_s", "success", "status", "error", "ttft_s",
    "e2e_s", "output_tokens", "prompt_tokens",
)  # fmt: skip


def record_to_dict(record: LoadRecord) -> dict[str, Any]:
    data = {name: getattr(record, name) for name in _SCALARS}
    data["chunk_s"] = [round(t, 6) for t in record.chunk_s]
    data["chunk_tokens"] = list(record.chunk_tokens)
    return data


def record_from_dict(data: dict[str, Any]) -> LoadRecord:
    record = LoadRecord(**{name: data.get(name) for name in _SCALARS if name in data})
    record.chunk_s = array("d", data.get("chunk_s") or [])
    record.chunk_tokens = array("q", data.get("chunk_tokens") or [])
    return record


def level_to_dict(level: LoadLevel) -> dict[str, Any]:
    if isinstance(level, Replay):
        return {"model": "replay", "time_scale": level.time_scale}
    if isinstance(level, Concurrency):
        return {"model": "concurrency", "concurrency": level.concurrency}
    return {"model": "rate", "per_s": level.per_s, "burstiness": level.burstiness, "seed": level.seed}


def level_from_dict(data: dict[str, Any]) -> LoadLevel:
    model = data.get("model")
    if model == "replay":
        return Replay(float(data.get("time_scale", 1.0)))
    if model == "concurrency":
        return Concurrency(int(data["concurrency"]))
    if model == "rate":
        return Rate(float(data["per_s"]), float(data.get("burstiness", 1.0)), int(data.get("seed", 0)))
    raise ValueError(f"unknown load model {model!r}")


def write_run(path: Path, run: LevelRun) -> None:
    """The whole run, atomically: a header line, then one line per record (in completion order)."""
    header = {
        "level": level_to_dict(run.level),
        "started_at": run.started_at,
        "duration_s": run.duration_s,
        "peak_in_flight": run.peak_in_flight,
        "late_s": run.late_s,
        "notes": run.notes,
    }
    lines = [json.dumps(header, separators=(",", ":"))]
    lines.extend(json.dumps(record_to_dict(r), separators=(",", ":")) for r in run.records)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")


def read_run(path: Path) -> LevelRun:
    """A run written by `write_run`; a corrupt file is a `UserInputError` naming the file and line."""
    records: list[LoadRecord] = []
    header: dict[str, Any] | None = None
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                    if header is None:
                        header = data
                    else:
                        records.append(record_from_dict(data))
                except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
                    raise UserInputError(f"{path}: line {number}: not a load record ({exc})") from None
    except OSError as exc:
        raise UserInputError(f"{path}: cannot read load records ({exc.strerror})") from None
    if header is None:
        raise UserInputError(f"{path}: empty load records file")
    try:
        level = level_from_dict(header["level"])
    except (KeyError, ValueError, TypeError) as exc:
        raise UserInputError(f"{path}: line 1: field level: {exc}") from None
    return LevelRun(
        level=level,
        records=records,
        started_at=float(header.get("started_at", 0.0)),
        duration_s=float(header.get("duration_s", 0.0)),
        peak_in_flight=int(header.get("peak_in_flight", 0)),
        late_s=float(header.get("late_s", 0.010)),
        notes=list(header.get("notes") or []),
    )


def read_runs(paths: Iterable[Path]) -> list[LevelRun]:
    return [read_run(p) for p in paths]
