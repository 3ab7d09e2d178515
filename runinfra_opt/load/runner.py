"""Run one load level: send a schedule's requests on time through an async client and record what happened.

Open-loop levels (replay, rate) send each request at its planned time whatever the server is doing; a closed loop
keeps N requests in flight. Every record carries its planned and actual send time, and the run says so when the
client fell behind (send lag p99 over `LATE_S`): the load offered was then lighter than planned. Records are kept
in the returned `LevelRun`, or streamed to a `sink` so that memory hardly grows with the run's length
(`git show e14cd7e:benchmarks/results/replay_memory.json`)."""

from __future__ import annotations

import asyncio
import itertools
import time
from array import array
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runinfra_opt.load.schedule import Planned
from runinfra_opt.load.spec import Concurrency, LoadLevel
from runinfra_opt.workload.model import Request
from runinfra_opt.workload.sessions import SessionHistory

LATE_S = 0.010
"""A send more than this behind its planned time counts as late; a run whose p99 send lag exceeds it is
flagged (`git show e14cd7e:benchmarks/results/replay_fidelity.json`)."""


class StreamedResult(Protocol):
    """What the runner reads from a client's result (`runinfra_opt.engine.vllm.client.RequestResult`)."""

    success: bool
    status: int | None
    error: str | None
    ttft_s: float | None
    itl_s: list[float]
    chunk_tokens: list[int]
    e2e_s: float | None
    output_tokens: int | None
    prompt_tokens: int | None
    output_text: str


Send = Callable[[Request], Awaitable[StreamedResult]]
_One = Callable[[Planned, float], Coroutine[Any, Any, float]]


class RecordSink(Protocol):
    """Where a level's records go as they complete (`runinfra_opt.load.store.RecordWriter` appends them to a file)."""

    def start(self, level: LoadLevel, started_at: float, late_s: float) -> None:
        """The level is about to start (before the first send)."""

    def add(self, record: LoadRecord) -> None:
        """One request completed (called on the event loop: keep it short)."""

    def finish(self, run: LevelRun) -> None:
        """The level ended (not called when it failed or was cancelled)."""


@dataclass(slots=True)
class LoadRecord:
    """One request under one load level. Times are seconds after the level's start (`time.perf_counter`)."""

    index: int
    request_id: str
    category: str
    planned_s: float
    """When it was due: its scheduled time (open loop) or when a slot freed (closed loop)."""
    sent_s: float
    done_s: float
    success: bool
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    chunk_s: array[float] = field(default_factory=lambda: array("d"))
    """Arrival time of each streamed chunk that carried output (after the level's start)."""
    chunk_tokens: array[int] = field(default_factory=lambda: array("q"))
    """Tokens in each of those chunks (speculation may deliver several at once)."""

    @property
    def send_lag_s(self) -> float:
        return self.sent_s - self.planned_s

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1), as `vllm bench serve` counts it; None below two tokens."""
        if not self.success or self.e2e_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between successive output chunks."""
        times = self.chunk_s
        return [b - a for a, b in zip(times, times[1:], strict=False)]


@dataclass
class LevelRun:
    """One level's raw records (in completion order) and how the run went."""

    level: LoadLevel
    records: Collection[LoadRecord]
    """In memory (a list), or read from disk each time they are iterated (`runinfra_opt.load.store.read_run(path,
    lazy=True)`); empty when the runner streamed them to a sink without keeping them (see `send_lag_s`)."""
    started_at: float
    """Wall-clock time (epoch seconds) of the level's start."""
    duration_s: float
    """Level start to the last completion."""
    peak_in_flight: int
    late_s: float = LATE_S
    notes: list[str] = field(default_factory=list)
    send_lag_s: array[float] | None = None
    """Every request's send lag, in completion order, where the records are not in memory (streamed to a sink,
    or read lazily); None where `records` is the list of them."""

    def send_lags(self) -> list[float]:
        if self.send_lag_s is not None:
            return self.send_lag_s.tolist()
        return [r.send_lag_s for r in self.records]

    @property
    def requests(self) -> int:
        return len(self.send_lag_s) if self.send_lag_s is not None else len(self.records)

    @property
    def records_kept(self) -> bool:
        """False when the runner streamed the records to a sink without keeping them (nothing to compute from)."""
        return self.send_lag_s is None or len(self.records) == len(self.send_lag_s)

    @property
    def late_requests(self) -> int:
        lags = self.send_lag_s if self.send_lag_s is not None else (r.send_lag_s for r in self.records)
        return sum(1 for lag in lags if lag > self.late_s)


class SessionGate:
    """Holds each later turn of a session until its predecessor was answered and its think time passed, and
    sends it with the session's history built from the answers this server gave."""

    def __init__(self, start: float) -> None:
        self.history = SessionHistory()
        self._start = start
        self._answered: dict[str, tuple[int, float]] = {}
        """Per session: the last answered turn and when its answer completed (seconds after the start)."""
        self._changed = asyncio.Condition()

    async def open(self, request: Request, due: float) -> tuple[Request, float]:
        """(the request as it is sent, when it became due): not before its predecessor's answer + think time."""
        if request.continues_session:
            assert request.session_id is not None
            assert request.turn is not None
            session, previous = request.session_id, request.turn - 1
            async with self._changed:
                await self._changed.wait_for(lambda: self._answered.get(session, (0, 0.0))[0] >= previous)
            due = max(due, self._answered[session][1] + (request.think_s or 0.0))
            delay = self._start + due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        return self.history.expand(request), due

    async def close(self, sent: Request, answer: str, done: float) -> None:
        if sent.session_id is None or sent.turn is None:
            return
        self.history.answer(sent, answer)
        async with self._changed:
            self._answered[sent.session_id] = (sent.turn, done)
            self._changed.notify_all()


def _record(planned: Planned, due: float, sent: float, done: float, result: StreamedResult) -> LoadRecord:
    request = planned.request
    record = LoadRecord(
        index=planned.index,
        request_id=request.id,
        category=request.category,
        planned_s=due,
        sent_s=sent,
        done_s=done,
        success=bool(result.success),
        status=result.status,
        error=result.error,
        ttft_s=result.ttft_s,
        e2e_s=result.e2e_s,
        prompt_tokens=result.prompt_tokens,
    )
    chunks = list(result.chunk_tokens)
    streamed = sum(chunks)
    record.output_tokens = int(result.output_tokens) if result.output_tokens is not None else streamed
    if result.ttft_s is not None and len(result.itl_s) + 1 == len(chunks):
        at = sent + result.ttft_s
        record.chunk_s.append(at)
        for gap in result.itl_s:
            at += gap
            record.chunk_s.append(at)
        record.chunk_tokens.extend(chunks)
    elif record.output_tokens:  # no per-chunk timing: every token counts at completion
        record.chunk_s.append(done)
        record.chunk_tokens.append(record.output_tokens)
    return record


async def run_level(
    level: LoadLevel,
    schedule: Iterable[Planned],
    send: Send,
    *,
    on_result: Callable[[LoadRecord, StreamedResult], None] | None = None,
    late_s: float = LATE_S,
    sink: RecordSink | None = None,
    keep_records: bool = True,
) -> LevelRun:
    """Send the schedule's requests through `send` under `level` and record each one. `on_result` sees every
    record with the client's full result (output ids for a losslessness check, say) as it completes; only the
    compact `LoadRecord` is kept. `sink` receives every record as it completes; with `keep_records=False` the
    returned run holds no records (only their send lags), so memory stays bounded however long the level.
    An exception from `send` ends the level (a client returns failures as data)."""
    if not keep_records and sink is None:
        raise ValueError("keep_records=False needs a sink: the records would be lost")
    items = iter(schedule)
    first = next(items, None)  # opening the schedule (a file, the random generator) is not the client's lateness
    if first is not None:
        items = itertools.chain([first], items)
    started_at = time.time()
    if sink is not None:
        sink.start(level, started_at, late_s)
    start = time.perf_counter()
    records: list[LoadRecord] = []
    lags: array[float] = array("d")
    in_flight = 0
    peak = 0

    gate = SessionGate(start)

    async def one(planned: Planned, due: float) -> float:
        """Send one request (a session's later turn once its predecessor was answered, with the session's history);
        return when it completed (seconds after the start)."""
        nonlocal in_flight, peak
        request, due = await gate.open(planned.request, due)
        sent = time.perf_counter() - start
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            result = await send(request)
        finally:
            in_flight -= 1
        done = time.perf_counter() - start
        if request.session_id is not None:
            await gate.close(request, result.output_text or "", done)
        record = _record(planned, due, sent, done, result)
        if keep_records:
            records.append(record)
        else:
            lags.append(record.send_lag_s)
        if sink is not None:
            sink.add(record)
        if on_result is not None:
            on_result(record, result)
        return done

    if isinstance(level, Concurrency):
        await _closed_loop(level.concurrency, items, one, start)
    else:
        await _open_loop(items, one, start)
    run = LevelRun(level, records, started_at, time.perf_counter() - start, peak, late_s)
    if not keep_records:
        run.send_lag_s = lags
    run.notes.extend(lateness_notes(run))
    if sink is not None:
        sink.finish(run)
    return run


async def _open_loop(schedule: Iterable[Planned], one: _One, start: float) -> None:
    pending: set[asyncio.Task[float]] = set()
    failures: list[BaseException] = []

    def finished(task: asyncio.Task[float]) -> None:
        pending.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            failures.append(error)

    try:
        for planned in schedule:
            if planned.at_s is None:
                raise ValueError("an open-loop level needs planned times (a closed-loop schedule was given)")
            delay = start + planned.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if failures:
                raise failures[0]
            task = asyncio.create_task(one(planned, planned.at_s))
            pending.add(task)
            task.add_done_callback(finished)
        while pending:
            await asyncio.wait(set(pending))
        if failures:
            raise failures[0]
    finally:  # nothing of the level outlives it
        for task in list(pending):
            task.cancel()
        if pending:
            await asyncio.wait(set(pending))


async def _closed_loop(concurrency: int, schedule: Iterable[Planned], one: _One, start: float) -> None:
    items = iter(schedule)  # shared by the workers: one event loop, so `next` needs no lock

    async def worker() -> None:
        free = time.perf_counter() - start
        for planned in items:
            free = await one(planned, free)  # the next request is due when this one completed

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*workers)
    finally:  # on an error (or cancellation) no worker may go on sending, nor outlive the level
        for task in workers:
            task.cancel()
        await asyncio.wait(workers)


def lateness_notes(run: LevelRun) -> list[str]:
    """A warning when the client, not the server, was late: its send lag p99 over `run.late_s`."""
    lags = run.send_lags()
    if not lags:
        return []
    from runinfra_opt.stats import percentiles

    lag = percentiles(lags, (50, 99))
    if lag["p99"] <= run.late_s:
        return []
    what = "the load offered was lighter than planned" if run.level.open_loop else "requests waited on the client"
    return [
        f"{run.level.name}: the client fell behind its schedule (send lag p50 {lag['p50'] * 1000:.1f} ms, "
        f"p99 {lag['p99'] * 1000:.1f} ms; {run.late_requests} of {len(lags)} requests more than "
        f"{run.late_s * 1000:g} ms late): {what}, so these figures bound the client, not the server"
    ]
