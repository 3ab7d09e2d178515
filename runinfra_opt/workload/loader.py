"""Resolve a workload spec (bundled name or path), read and validate it, fingerprint it, convert it."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import runinfra_opt
from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_open
from runinfra_opt.workload.fingerprint import Fingerprinter, canonical_record
from runinfra_opt.workload.model import Request, Workload
from runinfra_opt.workload.problems import Problems
from runinfra_opt.workload.readers import check_format, detect_format, read_records
from runinfra_opt.workload.records import RecordContext, build_request

DEFAULT_WORKLOAD = "mixed"
DEFAULT_MAX_TOKENS = 128
"""Output cap for requests without max_tokens when the command line gives none."""

BUNDLED_DESCRIPTIONS = {
    "agent": "agent sessions: edit a file and show it again, quote tool output, fill one JSON shape",
    "chat": "open questions, some multi-turn",
    "json": "extract fields from a given text into JSON",
    "code": "modify or extend given code",
    "summarize": "answer or summarize from a long given passage (RAG-like)",
    "mixed": "all four interleaved, a few sampled requests (the default)",
    "history/mixed": "earlier requests of mixed's kinds: the demo distils its drafts from them",
    "history/agent": "earlier agent sessions of agent's kinds, for drafts",
}
HISTORY_DIR = "history"
"""Bundled traffic histories (`workloads/history/NAME.jsonl`, named `history/NAME`): earlier requests of the
same kinds as a bundled sample, for distilling drafts that are then measured on the sample itself."""
_PATH_SUFFIXES = (".jsonl", ".json", ".ndjson", ".csv", ".parquet", ".pq")


def bundled_dir() -> Path:
    """`<repo>/workloads`: the bundled traffic samples."""
    return Path(runinfra_opt.__file__).resolve().parents[1] / "workloads"


def bundled_names() -> list[str]:
    """Samples (`NAME`) first, then histories (`history/NAME`), each sorted."""
    folder = bundled_dir()
    if not folder.is_dir():
        return []
    samples = sorted(p.stem for p in folder.glob("*.jsonl"))
    return samples + sorted(f"{HISTORY_DIR}/{p.stem}" for p in (folder / HISTORY_DIR).glob("*.jsonl"))


def _bundled_file(spec: str) -> Path | None:
    """The file of a bundled name (`NAME` or `history/NAME`), or None when `spec` names none."""
    parts = spec.split("/")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != HISTORY_DIR) or not all(parts):
        return None
    if any(part in (".", "..") or os.sep in part for part in parts):
        return None
    path = bundled_dir().joinpath(*parts[:-1], f"{parts[-1]}.jsonl")
    return path if path.is_file() else None


@dataclass(frozen=True)
class WorkloadSource:
    """Where a workload spec points: the file, its display name and its format."""

    name: str
    path: Path
    format: str
    bundled: bool


def resolve_workload(spec: str, *, format: str | None = None) -> WorkloadSource:
    """A bundled name or a path -> the file and its format (given, or detected from extension + first record)."""
    fmt = check_format(format) if format is not None else None
    path = Path(spec).expanduser()
    bundled = _bundled_file(spec)
    if path.is_file():
        source = WorkloadSource(path.stem, path, "", False)
    elif bundled is not None:
        source = WorkloadSource(spec, bundled, "", True)
    elif path.is_dir():
        raise UserInputError(f"{spec}: is a directory, not a workload file")
    elif path.suffix.lower() in _PATH_SUFFIXES or (
        ("/" in spec or os.sep in spec) and not spec.startswith(f"{HISTORY_DIR}/")
    ):
        raise UserInputError(f"{spec}: no such file")
    else:
        available = ", ".join(bundled_names()) or "none installed"
        raise UserInputError(
            f"unknown workload {spec!r}: not a file, and not a bundled workload (available: {available})"
        )
    if not os.access(source.path, os.R_OK):
        raise UserInputError(f"{spec}: cannot read the file (permission denied)")
    return dataclasses.replace(source, format=fmt or detect_format(source.path))


def _display(source: WorkloadSource, spec: str) -> str:
    return str(source.path) if source.bundled else spec


def _iter_requests(source: WorkloadSource, ctx: RecordContext) -> Iterator[Request]:
    """Validated requests in file order (timestamps still absolute); problems go to ctx.problems."""
    if source.path.stat().st_size == 0:
        ctx.problems.add(None, "file", "empty file: a workload needs at least one request")
        return
    records = 0
    for record in read_records(source.path, source.format, ctx.problems):
        records += 1
        request = build_request(record.data, record.line, ctx, record.labels)
        if request is not None:
            yield request
    if records == 0 and not ctx.problems:
        ctx.problems.add(None, "file", f"no requests in the file (read as {source.format})")


def _relative(request: Request, ctx: RecordContext) -> Request:
    if ctx.timing.mode != "timestamp" or request.arrival_s is None:
        return request
    earliest = ctx.timing.earliest_timestamp or 0.0
    return dataclasses.replace(request, arrival_s=round(request.arrival_s - earliest, 6))


def _max_tokens(default_max_tokens: int | None) -> int:
    value = DEFAULT_MAX_TOKENS if default_max_tokens is None else default_max_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserInputError(f"--max-tokens: must be an integer > 0, got {value!r}")
    return value


def load_workload(spec: str, *, format: str | None = None, default_max_tokens: int | None = None) -> Workload:
    """Read and validate a workload (bundled name or path) in any supported format.

    Raises `InputProblems` (exit 2) listing every problem (up to 20 in full), or `UserInputError` for a bad
    spec or format. Requests without max_tokens get `default_max_tokens` (else `DEFAULT_MAX_TOKENS`).
    """
    source = resolve_workload(spec, format=format)
    max_tokens = _max_tokens(default_max_tokens)
    ctx = RecordContext(Problems(_display(source, spec)), max_tokens)
    requests = list(_iter_requests(source, ctx))
    ctx.problems.raise_if_any()
    requests = [_relative(r, ctx) for r in requests]
    fp = Fingerprinter()
    for request in requests:
        fp.add(request)
    return Workload(
        name=source.name,
        path=str(source.path),
        requests=tuple(requests),
        fingerprint=fp.hexdigest(),
        format=source.format,
        default_max_tokens=max_tokens,
        max_tokens_defaulted=ctx.max_tokens_defaulted,
    )


@dataclass(frozen=True)
class ValidationSummary:
    name: str
    path: str
    format: str
    requests: int
    fingerprint: str
    categories: dict[str, int]


def validate_workload(
    spec: str, *, format: str | None = None, default_max_tokens: int | None = None
) -> ValidationSummary:
    """Validate a workload without holding its requests in memory (large files stream); same errors as load."""
    source = resolve_workload(spec, format=format)
    max_tokens = _max_tokens(default_max_tokens)
    ctx = RecordContext(Problems(_display(source, spec)), max_tokens)
    fp = Fingerprinter()
    count = 0
    categories: Counter[str] = Counter()
    for request in _iter_requests(source, ctx):
        count += 1
        categories[request.category] += 1
        fp.add(request)
    ctx.problems.raise_if_any()
    if ctx.timing.mode == "timestamp":
        # Arrival times are relative to the earliest timestamp, known only now: hash again in a second pass.
        second = RecordContext(Problems(ctx.problems.source), max_tokens)
        fp = Fingerprinter()
        for request in _iter_requests(source, second):
            fp.add(_relative(request, ctx))
    return ValidationSummary(
        source.name, str(source.path), source.format, count, fp.hexdigest(), dict(sorted(categories.items()))
    )


def convert_workload(
    spec: str, out: Path, *, format: str | None = None, default_max_tokens: int | None = None
) -> Workload:
    """Write a workload as native JSONL (normalised fields + unknown fields), atomically; never over its input."""
    if out.suffix.lower() != ".jsonl":
        raise UserInputError(f"{out}: --out must end in .jsonl (convert writes the native JSONL format)")
    if out.is_dir():
        raise UserInputError(f"{out}: is a directory")
    source = resolve_workload(spec, format=format)
    if out.exists() and out.resolve() == source.path.resolve():
        raise UserInputError(f"{out}: is the input file; write the converted workload elsewhere")
    workload = load_workload(spec, format=format, default_max_tokens=default_max_tokens)
    with atomic_open(out) as fh:
        for request in workload.requests:
            record = {**request.extra, **canonical_record(request)}
            fh.write(json.dumps(record, sort_keys=True, ensure_ascii=False, default=str))
            fh.write("\n")
    return workload


@dataclass(frozen=True)
class BundledInfo:
    name: str
    path: str
    requests: int
    categories: dict[str, int]
    description: str
    fingerprint: str


def list_bundled() -> list[BundledInfo]:
    """The bundled workloads (`workloads/*.jsonl`, then `workloads/history/*.jsonl`), each read and validated."""
    infos = []
    for name in bundled_names():
        summary = validate_workload(name)
        infos.append(
            BundledInfo(
                name=name,
                path=summary.path,
                requests=summary.requests,
                categories=summary.categories,
                description=BUNDLED_DESCRIPTIONS.get(name, ""),
                fingerprint=summary.fingerprint,
            )
        )
    return infos


@dataclass(frozen=True)
class WorkloadStream:
    """A validated workload read again from its file on every iteration, never held in memory: for replaying
    large recordings. Requests come in file order with arrival times relative to the earliest (as `load_workload`
    gives them); `in_arrival_order` says whether file order is also arrival order."""

    name: str
    path: str
    format: str
    requests: int
    fingerprint: str
    categories: dict[str, int]
    timing_mode: str
    """`arrival_s`, `timestamp` or `none` (the file records no arrival times)."""
    first_arrival_s: float | None
    """The earliest relative arrival time (None without timing)."""
    in_arrival_order: bool
    """File order never goes back in time (always True without timing)."""
    default_max_tokens: int
    _source: WorkloadSource
    _earliest_timestamp: float | None

    @property
    def has_arrivals(self) -> bool:
        return self.timing_mode != "none"

    def __iter__(self) -> Iterator[Request]:
        ctx = RecordContext(Problems(self.path), self.default_max_tokens)
        ctx.timing.mode = self.timing_mode
        ctx.timing.earliest_timestamp = self._earliest_timestamp
        for request in _iter_requests(self._source, ctx):
            yield _relative(request, ctx)
        if ctx.problems:  # the file changed since it was validated
            ctx.problems.raise_if_any()


def stream_workload(spec: str, *, format: str | None = None, default_max_tokens: int | None = None) -> WorkloadStream:
    """Validate a workload in one streamed pass (same errors as `load_workload`) and return a stream of it."""
    source = resolve_workload(spec, format=format)
    max_tokens = _max_tokens(default_max_tokens)
    ctx = RecordContext(Problems(_display(source, spec)), max_tokens)
    count = 0
    categories: Counter[str] = Counter()
    in_order = True
    previous: float | None = None
    first: float | None = None
    fp = Fingerprinter()
    for request in _iter_requests(source, ctx):
        count += 1
        categories[request.category] += 1
        fp.add(request)
        arrival = request.arrival_s
        if arrival is not None:
            in_order = in_order and (previous is None or arrival >= previous)
            previous = arrival
            first = arrival if first is None else min(first, arrival)
    ctx.problems.raise_if_any()
    timing_mode = ctx.timing.mode or "none"
    earliest = ctx.timing.earliest_timestamp
    first_relative = None
    if first is not None:
        first_relative = round(first - earliest, 6) if timing_mode == "timestamp" and earliest is not None else first
    stream = WorkloadStream(
        name=source.name,
        path=_display(source, spec),
        format=source.format,
        requests=count,
        fingerprint=fp.hexdigest(),
        categories=dict(sorted(categories.items())),
        timing_mode=timing_mode,
        first_arrival_s=first_relative,
        in_arrival_order=in_order,
        default_max_tokens=max_tokens,
        _source=source,
        _earliest_timestamp=earliest,
    )
    if timing_mode != "timestamp":
        return stream
    fp = Fingerprinter()
    for request in stream:  # relative arrival times are known only now: hash again in a second pass
        fp.add(request)
    return dataclasses.replace(stream, fingerprint=fp.hexdigest())
