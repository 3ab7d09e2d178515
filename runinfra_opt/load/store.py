"""Raw load records on disk: one JSON line per request, appended as requests complete, read back into a `LevelRun`.

`optimize --engine vllm --load ...` keeps every level's records under `<run dir>/load/`, so that the figures in
results.json can be recomputed and nothing measured is lost when a run is interrupted. A file is a header line,
one line per record in completion order, then an end line; `RecordWriter` streams a level as it is measured, and
`read_run(path, lazy=True)` parses the records each time they are iterated instead of holding them."""

from __future__ import annotations

import json
from array import array
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

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
    fields: dict[str, Any] = {name: data.get(name) for name in _SCALARS if name in data}
    record = LoadRecord(**fields)
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


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


def _header(level: LoadLevel, started_at: float, late_s: float) -> dict[str, Any]:
    return {"level": level_to_dict(level), "started_at": started_at, "late_s": late_s}


def _end(run: LevelRun) -> dict[str, Any]:
    return {
        "end": {
            "requests": run.requests,
            "duration_s": run.duration_s,
            "peak_in_flight": run.peak_in_flight,
            "notes": run.notes,
        }
    }


def write_run(path: Path, run: LevelRun) -> None:
    """The whole run, atomically: a header line, one line per record (in completion order), the end line."""
    if not run.records_kept:
        raise ValueError(f"{run.level.name}: the run's records were streamed, not kept: they are in its file")
    lines = [_dumps(_header(run.level, run.started_at, run.late_s))]
    lines.extend(_dumps(record_to_dict(r)) for r in run.records)
    lines.append(_dumps(_end(run)))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")


class RecordWriter:
    """A `RecordSink` that streams a level's records to `path` as they complete: the header when the level starts,
    each record appended and flushed (one write, so an interrupted level loses at most the line being written),
    the end line when the level ends. Use it as a context manager around one `run_level`; a level that failed
    leaves its file without an end line (an unfinished level, see `read_run`). Opening it truncates `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: TextIO | None = path.open("w", encoding="utf-8")

    def _write(self, data: dict[str, Any]) -> None:
        if self._handle is None:
            raise ValueError(f"{self.path}: the record writer is closed")
        self._handle.write(_dumps(data) + "\n")
        self._handle.flush()

    def start(self, level: LoadLevel, started_at: float, late_s: float) -> None:
        self._write(_header(level, started_at, late_s))

    def add(self, record: LoadRecord) -> None:
        self._write(record_to_dict(record))
        self.records += 1

    def finish(self, run: LevelRun) -> None:
        self._write(_end(run))
        self.close()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class StoredRecords(Collection[LoadRecord]):
    """A file's records, parsed each time they are iterated (in completion order) and never all held at once."""

    def __init__(self, path: Path, count: int) -> None:
        self.path = path
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[LoadRecord]:
        for _, data in _lines(self.path, self._count):
            yield record_from_dict(data)

    def __contains__(self, item: object) -> bool:
        return any(record == item for record in self)

    def __repr__(self) -> str:
        return f"StoredRecords({str(self.path)!r}, {self._count})"


def _lines(path: Path, records: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record dict) for the first `records` record lines of a file that `read_run` validated."""
    if records <= 0:
        return
    with path.open(encoding="utf-8") as handle:
        seen = -1  # the header comes first
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            seen += 1
            if seen == 0:
                continue
            yield number, json.loads(line)
            if seen == records:
                return


def read_run(path: Path, *, lazy: bool = False, unfinished: bool = False) -> LevelRun:
    """A run written by `write_run` or a `RecordWriter`; a corrupt file is a `UserInputError` naming the file and
    line. `lazy`: the records stay on disk (`StoredRecords`; the send lags are kept, 8 bytes a request).
    `unfinished`: read a level that was interrupted (no end line; a torn last line is dropped): its duration is
    its last completion, its peak in flight is counted from the records, and a note says so."""
    records: list[LoadRecord] = []
    lags: array[float] = array("d")
    intervals: array[float] = array("d")  # (sent, done) pairs, for an unfinished level's peak in flight
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    count = 0
    torn = False
    last_done = 0.0
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                if end is not None:
                    raise UserInputError(f"{path}: line {number}: a line after the end line")
                try:
                    data = json.loads(line)
                    if header is None:
                        header = data
                    elif isinstance(data, dict) and "end" in data:
                        end = dict(data["end"])
                    else:
                        record = record_from_dict(data)
                        count += 1
                        last_done = max(last_done, record.done_s)
                        if lazy:
                            lags.append(record.send_lag_s)
                        else:
                            records.append(record)
                        if unfinished:
                            intervals.extend((record.sent_s, record.done_s))
                except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
                    if unfinished and not line.endswith("\n"):
                        torn = True  # the last line, cut short by the interruption
                        continue
                    raise UserInputError(f"{path}: line {number}: not a load record ({exc})") from None
    except OSError as exc:
        raise UserInputError(f"{path}: cannot read load records ({exc.strerror})") from None
    if header is None:
        raise UserInputError(f"{path}: empty load records file")
    if not isinstance(header, dict):
        raise UserInputError(f"{path}: line 1: not a load records header")
    try:
        level = level_from_dict(header["level"])
    except (KeyError, ValueError, TypeError) as exc:
        raise UserInputError(f"{path}: line 1: field level: {exc}") from None
    if end is None and "duration_s" in header:
        end = header  # written before the end line existed: the header carried the run's summary
    notes: list[str] = []
    if end is None:
        if not unfinished:
            raise UserInputError(
                f"{path}: an unfinished level ({count} records and no end line): the run was interrupted"
            )
        notes.append(
            f"{level.name}: an interrupted level: {count} records read back"
            + (" (its last, torn line dropped)" if torn else "")
            + "; duration to its last completion, peak in flight counted from the records"
        )
        end = {"duration_s": last_done, "peak_in_flight": _peak_in_flight(intervals), "notes": []}
    elif "requests" in end and int(end["requests"]) != count:
        raise UserInputError(f"{path}: {count} records, but its end line says {end['requests']}")
    return LevelRun(
        level=level,
        records=StoredRecords(path, count) if lazy else records,
        started_at=float(header.get("started_at", 0.0)),
        duration_s=float(end.get("duration_s", 0.0)),
        peak_in_flight=int(end.get("peak_in_flight", 0)),
        late_s=float(header.get("late_s", 0.010)),
        notes=[*(end.get("notes") or []), *notes],
        send_lag_s=lags if lazy else None,
    )


def _peak_in_flight(intervals: array[float]) -> int:
    """Most requests in flight at once, from (sent, done) pairs."""
    events = sorted([(t, 1 if i % 2 == 0 else -1) for i, t in enumerate(intervals)], key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, step in events:  # a completion at the moment of a send counts first (sorted: -1 before +1)
        current += step
        peak = max(peak, current)
    return peak


def read_runs(paths: Iterable[Path]) -> list[LevelRun]:
    return [read_run(p) for p in paths]
