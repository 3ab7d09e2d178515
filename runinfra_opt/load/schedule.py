"""Schedules: the planned send time of every request under a load level, generated lazily.

A schedule is an iterator of `Planned` (request, planned time after the level's start), produced as it is
consumed: with a `WorkloadStream` (`runinfra_opt.workload.stream_workload`) in arrival order a 100,000-request
recording is planned and replayed without ever being held in memory. Only `replay` of requests that are not in
arrival order sorts them in memory first (a file recorded out of order, or a sequence).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from runinfra_opt.errors import UserInputError
from runinfra_opt.load.spec import Concurrency, LoadLevel, Rate, Replay
from runinfra_opt.workload.model import Request

GAP_BATCH = 4096
"""Random gaps drawn per numpy call (the sequence is the same whatever the batch: one generator, drawn in order)."""


@dataclass(frozen=True, slots=True)
class Planned:
    """One request of a schedule: its position, the request and when to send it (seconds after the level's
    start; None in a closed loop, where a request goes when a slot frees)."""

    index: int
    request: Request
    at_s: float | None


def plan(level: LoadLevel, requests: Iterable[Request]) -> Iterator[Planned]:
    """The schedule of `requests` under `level`, lazily. `replay` raises `UserInputError` when the requests
    record no arrival times (before yielding anything)."""
    if isinstance(level, Replay):
        return _replay(level, requests)
    if isinstance(level, Rate):
        return _rate(level, requests)
    if isinstance(level, Concurrency):
        return (Planned(index, request, None) for index, request in enumerate(requests))
    raise TypeError(f"not a load level: {level!r}")  # pragma: no cover - the union is exhaustive


def _replay(level: Replay, requests: Iterable[Request]) -> Iterator[Planned]:
    in_order = getattr(requests, "in_arrival_order", None)
    if getattr(requests, "has_arrivals", True) is False:
        raise _no_arrivals(requests)
    if in_order is True:
        first = getattr(requests, "first_arrival_s", None)
        source: Iterable[Request] = requests
    else:
        ordered = list(requests)
        if any(r.arrival_s is None for r in ordered):
            raise _no_arrivals(requests)
        ordered.sort(key=lambda r: r.arrival_s or 0.0)  # stable: ties keep file order
        first = ordered[0].arrival_s if ordered else None
        source = ordered
    return _replay_times(level, source, first)


def _replay_times(level: Replay, requests: Iterable[Request], first: float | None) -> Iterator[Planned]:
    previous = -math.inf
    for index, request in enumerate(requests):
        if request.arrival_s is None:
            raise _no_arrivals(requests)
        if request.arrival_s < previous:  # pragma: no cover - validated in order, or sorted above
            raise RuntimeError(f"request {request.id}: arrival_s goes back in time in a stream said to be in order")
        previous = request.arrival_s
        yield Planned(index, request, (request.arrival_s - (first or 0.0)) * level.time_scale)


def _no_arrivals(requests: object) -> UserInputError:
    name = getattr(requests, "name", None)
    where = f"workload {name!r}" if name else "the workload"
    return UserInputError(
        f"--load replay: {where} records no arrival times (arrival_s or timestamp on every request); "
        "use concurrency:N or rate:R instead"
    )


def gaps(level: Rate) -> Iterator[float]:
    """The endless, seeded sequence of gaps between arrivals at `level`: gamma(shape=burstiness,
    scale=1/(rate x burstiness)), mean 1/rate, as `vllm bench serve` draws them; constant 1/rate when the
    burstiness is infinite, 0 when the rate is."""
    if math.isinf(level.per_s):
        while True:
            yield 0.0
    if math.isinf(level.burstiness):
        while True:
            yield 1.0 / level.per_s
    import numpy as np

    rng = np.random.default_rng(level.seed)
    scale = 1.0 / (level.per_s * level.burstiness)
    while True:
        yield from rng.gamma(shape=level.burstiness, scale=scale, size=GAP_BATCH).tolist()


def _rate(level: Rate, requests: Iterable[Request]) -> Iterator[Planned]:
    # The first request goes at once, each later one a gap after the previous. vLLM instead delays the first
    # by a gap too and rescales the whole sequence to last exactly n/rate, which needs every gap in advance;
    # here the sequence is a plain renewal process (its realised rate is in the schedule's summary).
    at = 0.0
    gap = gaps(level)
    for index, request in enumerate(requests):
        if index:
            at += next(gap)
        yield Planned(index, request, at)


@dataclass
class ScheduleSummary:
    """What a schedule offers, counted while it streams (no per-request list is kept)."""

    level: str
    description: str
    requests: int = 0
    categories: dict[str, int] = field(default_factory=dict)
    max_tokens: int = 0
    """The sum of the requests' max_tokens (an upper bound on output tokens)."""
    span_s: float | None = None
    """Planned time of the last request (open loop; None in a closed loop)."""
    peak_per_s: int | None = None
    """Most requests planned within any one-second window (open loop)."""

    @property
    def mean_rate_per_s(self) -> float | None:
        """(requests - 1) / span, as `workload inspect` counts a recording's rate."""
        if self.span_s is None or self.span_s <= 0:
            return None
        return (self.requests - 1) / self.span_s


def summarize(level: LoadLevel, schedule: Iterable[Planned]) -> ScheduleSummary:
    """Consume a schedule and count what it offers, in memory bounded by the busiest second."""
    summary = ScheduleSummary(level.name, level.describe())
    categories: Counter[str] = Counter()
    window: deque[float] = deque()
    peak = 0
    last: float | None = None
    for planned in schedule:
        summary.requests += 1
        categories[planned.request.category] += 1
        summary.max_tokens += planned.request.max_tokens or 0
        if planned.at_s is not None:
            last = planned.at_s
            window.append(planned.at_s)
            while window[0] <= planned.at_s - 1.0:
                window.popleft()
            peak = max(peak, len(window))
    summary.categories = dict(sorted(categories.items()))
    if level.open_loop:
        summary.span_s = last if last is not None else 0.0
        summary.peak_per_s = peak
    return summary
