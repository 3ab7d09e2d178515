"""Capacity: the highest arrival rate one server sustains, judged on one run per offered rate.

- **A level's verdict** (`verdict`): a run at an offered rate is sustained when the server kept up (no request
  failed, nothing was preempted, the queue did not grow through the run: `queue_grew`) and, with SLOs, at least
  the attainment share of its requests succeeded within every SLO (TTFT and TPOT, bounds inclusive). Without an
  SLO only keeping up counts (capacity at saturation). Under Poisson arrivals the queue's growth is read from
  the first and last third of sends; under a recorded pattern, whose thirds differ by design (a recording's
  bursts need not be spread evenly), from the same recorded requests in the first and last round of the sample
  (`load.cycle`), and not at all in a run of one round.
- **The search** (`RateSearch`): start at a predicted rate, step out by `STEP` (growing geometrically) until one
  rate is sustained and one missed, then halve the bracket geometrically until the missed rate is within
  `TOLERANCE` of the sustained one, at most `MAX_LEVELS` rates. The capacity is the highest sustained rate
  below the lowest missed one, with the bracket as its interval.
- **An unclear verdict** (`unclear`): with SLOs, a rate whose attainment's 95% Wilson interval holds the asked
  share (33 of 36 requests against 90%: [78%, 97%]; all of them within the SLOs is as clear as 36 requests can
  show) is one run's chance as much as the server's; the search runs it again (`optimize.capacity`) and judges
  the rate on every run of it pooled (`pooled`): sustained when every run kept up and the pooled share attains.
- **A warm-up** (`ramp`): a server's first heavy load, judged by nothing, offered at a rate rising from one
  request in flight to the ceiling, so that its decoding steps show every batch size the searched rates reach.
- **The target** (`peak_rate`): the recorded traffic's peak over `PEAK_WINDOW_S`.

Pure functions of the records (measured or predicted: the serving predictor writes the same records), so the
search and its prediction are judged alike."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from runinfra_opt.load.runner import LevelRun, LoadRecord
from runinfra_opt.load.spec import Replay
from runinfra_opt.results import CapacityLevel, Interval
from runinfra_opt.stats import percentiles

TOLERANCE = 0.10
"""The search stops when the lowest missed rate is within this of the highest sustained one (10%)."""
MAX_LEVELS = 6
"""Offered rates per server at most (the budget may allow fewer)."""
STEP = 1.25
"""The step out from the start while the bracket is still open: the n-th step in the same direction multiplies
the rate by STEP**n (1.25, then 1.56, 1.95, ...), so a prediction off by 2x is bracketed in four levels."""
QUEUE_GROWTH = 2.0
"""The queue grew when the median TTFT of the run's last third of sends is at least this many times that of its
first third, and longer by at least half a request's length (a burst in a Poisson schedule moves TTFT, not by a
request's length)."""
MIN_SPAN_E2E = 3.0
"""A rate is measurable when its schedule spans at least this many batch-1 request lengths: faster, the requests
all arrive before the first completes, and the run measures a burst of N, not a rate (`ceiling`)."""
FLOOR_IN_FLIGHT = 0.25
"""The lowest rate worth offering keeps a quarter of a request in flight on average (rate x batch-1 length):
slower, requests rarely overlap, so a server that misses the SLOs there misses them alone (`floor`)."""
RAMP_FROM_IN_FLIGHT = 1.0
"""A warm-up's arrivals start at one request in flight on average (rate x batch-1 length) and rise to the ceiling
(`ramp`)."""
PEAK_WINDOW_S = 60.0
"""The recorded traffic's peak rate is the most arrivals within any window this long, per second (the mean rate
over the whole recording when it is shorter)."""


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def queue_grew(
    records: Iterable[LoadRecord], request_s: float | None = None, *, recorded: bool = False
) -> tuple[bool, str]:
    """Whether requests waited longer and longer through the run (`QUEUE_GROWTH`), and the figures in words.
    `request_s`: a request's length alone on the server (batch 1); without it, the first third's median
    end-to-end time, which an overloaded server already stretches (48 summarize requests at 5.65/s on vLLM: 24.6 s
    against 2.8 s alone, so a TTFT from 2.8 to 9.7 s did not count as growth). `recorded`: the arrivals are a
    recorded pattern, compared round to round (`_rounds`); else the first and the last third of sends."""
    done = sorted((r for r in records if r.success and r.ttft_s is not None), key=lambda r: r.sent_s)
    if recorded:
        rounds = _rounds(done)
        if len(rounds) < 2:
            return False, ""
        last = rounds[-1]
        again = {original for original, _ in last}
        first = [r for original, r in rounds[0] if original in again]
        last_records = [r for _, r in last]
        over = ("the recorded sample's first round", f"the same requests in round {len(rounds)}")
    else:
        third = len(done) // 3
        if third < 1:
            return False, ""
        first, last_records = done[:third], done[-third:]
        over = ("the first third of sends", "the last")
    ttft_first = _median([r.ttft_s for r in first if r.ttft_s is not None]) or 0.0
    ttft_last = _median([r.ttft_s for r in last_records if r.ttft_s is not None]) or 0.0
    length = request_s if request_s is not None else _median([r.e2e_s for r in first if r.e2e_s is not None]) or 0.0
    grew = ttft_last >= QUEUE_GROWTH * ttft_first and ttft_last - ttft_first >= 0.5 * length
    text = f"TTFT median {ttft_first * 1000:.0f} ms over {over[0]}, {ttft_last * 1000:.0f} ms over {over[1]}"
    return grew, text


def _rounds(records: Sequence[LoadRecord]) -> list[list[tuple[str, LoadRecord]]]:
    """`records` by round of the sample they repeat (`load.cycle`: the recorded requests, then their copies
    `<id>+1`, `<id>+2`, ...), each as (the recorded request's id, the record); a suffix counts only where the
    request it names was sent too."""
    ids = {r.request_id for r in records}
    by_round: dict[int, list[tuple[str, LoadRecord]]] = {}
    for record in records:
        original, plus, n = record.request_id.rpartition("+")
        copy = int(n) if plus and n.isdigit() and original in ids else 0
        by_round.setdefault(copy, []).append((original if copy else record.request_id, record))
    return [by_round[k] for k in sorted(by_round)]


def _meets(record: LoadRecord, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    if not record.success:
        return False
    if slo_ttft_ms is not None and (record.ttft_s is None or record.ttft_s * 1000 > slo_ttft_ms):
        return False
    tpot = record.tpot_s
    return slo_tpot_ms is None or tpot is None or tpot * 1000 <= slo_tpot_ms


def verdict(
    run: LevelRun,
    rate: float,
    *,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    attainment: float,
    preemptions: int | None = None,
    kv_cache_peak: float | None = None,
    request_s: float | None = None,
) -> CapacityLevel:
    """Whether the server sustained `rate` in `run` (see the module's docstring), with the reason when it did not;
    `request_s`: a request's length at batch 1 (`queue_grew`)."""
    records = list(run.records)
    failed = sum(not r.success for r in records)
    grew, growth = queue_grew(records, request_s, recorded=isinstance(run.level, Replay))
    reasons = []
    if failed:
        reasons.append(f"{failed} of {len(records)} requests failed")
    if preemptions:
        kv = f", KV cache up to {kv_cache_peak:.0%}" if kv_cache_peak is not None else ""
        reasons.append(f"the server preempted {preemptions} time(s){kv}")
    if grew:
        reasons.append(f"the queue grew through the run ({growth})")
    kept_up = not reasons
    attained = None
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        met = sum(_meets(r, slo_ttft_ms, slo_tpot_ms) for r in records)
        attained = met / len(records) if records else 0.0
        if attained < attainment:
            reasons.append(
                f"{met} of {len(records)} requests ({share_text(attained, attainment)}) within the SLOs, "
                f"below {share_text(attainment)}"
            )
    ttft = [r.ttft_s for r in records if r.success and r.ttft_s is not None]
    tpot = [t for r in records if (t := r.tpot_s) is not None]
    return CapacityLevel(
        rate=rate,
        requests=len(records),
        attained=attained,
        ttft_s=percentiles(ttft) if ttft else {},
        tpot_s=percentiles(tpot) if tpot else {},
        kept_up=kept_up,
        passed=not reasons,
        reason="; ".join(reasons),
        preemptions=preemptions,
        kv_cache_peak=kv_cache_peak,
    )


def rate_text(rate: float) -> str:
    """A rate in requests/s as people read it: three significant digits and never an exponent (0.217, 1.87, 42.5;
    1,250 from 100 up)."""
    return f"{rate:,.0f}" if abs(rate) >= 100 else f"{rate:.3g}"


def share_text(share: float, other: float | None = None) -> str:
    """`share` as a percentage with the fewest decimals (up to 2) that tell it apart from `other`: 89.6% missed
    against 90% reads "89.6%", not "90%"."""
    for digits in range(2):
        text = f"{share:.{digits}%}"
        if other is None or share == other or text != f"{other:.{digits}%}":
            return text
    return f"{share:.2%}"


def attainment_interval(met: int, requests: int) -> tuple[float, float]:
    """The 95% Wilson interval of a share of `met` requests in `requests` (scipy's binomial test)."""
    from scipy.stats import binomtest

    if requests <= 0:
        return 0.0, 1.0
    ci = binomtest(met, requests).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def _met(level: CapacityLevel) -> int:
    return round((level.attained or 0.0) * level.requests)


def pooled(levels: Sequence[CapacityLevel], attainment: float) -> list[tuple[float, bool]]:
    """(rate, sustained) per offered rate, in the order first offered, each judged on all its runs: sustained when
    every run kept up and, with SLOs, the share of all their requests within the SLOs attains `attainment`."""
    by_rate: dict[float, list[CapacityLevel]] = {}
    for level in levels:
        by_rate.setdefault(level.rate, []).append(level)
    out = []
    for rate, runs in by_rate.items():
        if any(run.attained is None for run in runs):
            out.append((rate, all(run.passed for run in runs)))
            continue
        requests = sum(run.requests for run in runs)
        share = sum(_met(run) for run in runs) / requests if requests else 0.0
        out.append((rate, all(run.kept_up for run in runs) and share >= attainment))
    return out


def unclear(levels: Sequence[CapacityLevel], attainment: float) -> bool:
    """Whether the runs of one rate leave its verdict to chance: every run kept up (a growing queue, a failure or
    a preemption is clear), some request missed the SLOs (every request within them is as clear as that many
    requests can show), and the 95% interval of their pooled attainment holds `attainment` (no SLO: never)."""
    if not levels or any(level.attained is None or not level.kept_up for level in levels):
        return False
    met, requests = sum(_met(level) for level in levels), sum(level.requests for level in levels)
    low, high = attainment_interval(met, requests)
    return met < requests and low <= attainment <= high


@dataclass(frozen=True)
class Estimate:
    """A search's answer: the highest sustained rate, the lowest missed one above it, and how it ended."""

    value: float
    low: float
    high: float
    status: str
    """bracketed (within the tolerance, or the levels ran out with a bracket), at_least (every rate sustained),
    below (none sustained)."""

    def interval(self) -> Interval:
        return Interval(value=self.value, low=self.low, high=self.high)


@dataclass(frozen=True)
class RateSearch:
    """The offered rates of a search that brackets the knee (see the module's docstring)."""

    start: float
    tolerance: float = TOLERANCE
    max_levels: int = MAX_LEVELS
    ceiling: float | None = None
    """The highest measurable rate (`ceiling`); the search offers nothing above it."""
    floor: float | None = None
    """The lowest rate worth offering (`floor`); the search offers nothing below it."""

    def __post_init__(self) -> None:
        if not (self.start > 0 and math.isfinite(self.start)):
            raise ValueError(f"a rate search starts at a rate > 0, not {self.start}")

    @staticmethod
    def bracket(tried: Sequence[tuple[float, bool]]) -> tuple[float | None, float | None]:
        """(highest sustained rate below the lowest missed one, lowest missed rate); None where there is none."""
        missed = [rate for rate, ok in tried if not ok]
        high = min(missed) if missed else None
        sustained = [rate for rate, ok in tried if ok and (high is None or rate < high)]
        return (max(sustained) if sustained else None), high

    def next_rate(self, tried: Sequence[tuple[float, bool]]) -> float | None:
        """The next rate to offer after `tried` (rate, sustained) pairs, or None when the search is done."""
        if not tried:
            return self.start if self.ceiling is None else min(self.start, self.ceiling)
        if len(tried) >= self.max_levels:
            return None
        low, high = self.bracket(tried)
        if low is not None and high is not None:
            return None if high / low - 1 <= self.tolerance else math.sqrt(low * high)
        # steps out so far: every rate on the open side of the first one offered (a rate sustained once and missed
        # when run again (`optimize.capacity`) reopens the bracket below it, and the steps start over from it)
        first = tried[0][0]
        if high is None:
            run = sum(1 for rate, ok in tried if ok and rate >= first)
        else:
            run = sum(1 for rate, ok in tried if not ok and rate <= first)
        factor = STEP ** max(run, 1)
        if high is None and low is not None:
            if self.ceiling is not None and low >= self.ceiling * (1 - 1e-9):
                return None  # sustained the highest measurable rate: capacity is at least that
            return low * factor if self.ceiling is None else min(low * factor, self.ceiling)
        if self.floor is not None and high is not None and high <= self.floor * (1 + 1e-9):
            return None  # missed even the lowest rate worth offering: the SLOs are not met without contention
        lower = (high or self.start) / factor
        return lower if self.floor is None else max(lower, self.floor)

    def estimate(self, tried: Sequence[tuple[float, bool]]) -> Estimate | None:
        if not tried:
            return None
        low, high = self.bracket(tried)
        if low is None:
            assert high is not None
            return Estimate(0.0, 0.0, high, "below")
        if high is None:
            return Estimate(low, low, low, "at_least")
        return Estimate(low, low, high, "bracketed")


def ceiling(requests: int, e2e_s: float) -> float:
    """The highest measurable rate for `requests` per run whose batch-1 length is `e2e_s` (`MIN_SPAN_E2E`)."""
    return requests / (MIN_SPAN_E2E * max(e2e_s, 1e-6))


def floor(e2e_s: float) -> float:
    """The lowest rate worth offering for requests whose batch-1 length is `e2e_s` (`FLOOR_IN_FLIGHT`)."""
    return FLOOR_IN_FLIGHT / max(e2e_s, 1e-6)


def ramp(requests: int, e2e_s: float) -> list[float]:
    """Send times (seconds from the first) of a warm-up of `requests` whose batch-1 length is `e2e_s`: the rate
    rises geometrically, request by request, from `RAMP_FROM_IN_FLIGHT` requests in flight to the `ceiling`, so the
    batch climbs through every size up to the largest one the searched rates reach, each rate's share of requests
    the same. Offered at one rate (the ceiling), all requests arrive within a few steps of one another, run as one
    batch and finish together, and the steps show one batch size. Evenly at the ceiling when it is no higher."""
    low, high = RAMP_FROM_IN_FLIGHT / max(e2e_s, 1e-6), ceiling(requests, e2e_s)
    if requests < 2 or high <= low:
        return [i / high for i in range(max(requests, 0))]
    times = [0.0]
    for i in range(1, requests):
        times.append(times[-1] + 1.0 / (low * (high / low) ** (i / (requests - 1))))
    return times


def peak_rate(arrivals: Sequence[float], window_s: float = PEAK_WINDOW_S) -> float | None:
    """The most arrivals within any `window_s` seconds, per second; over a recording shorter than the window, its
    mean rate ((n - 1) / span). None for fewer than two arrivals or no span."""
    times = sorted(arrivals)
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    span = times[-1] - times[0]
    if span < window_s:
        return (len(times) - 1) / span
    most, start = 0, 0
    for end, at in enumerate(times):
        while times[start] <= at - window_s:
            start += 1
        most = max(most, end - start + 1)
    return most / window_s


def servers_needed(target_rate: float, capacity: float) -> int | None:
    """ceil(target / capacity); None when the capacity is zero (no rate sustained)."""
    if capacity <= 0:
        return None
    return max(1, math.ceil(target_rate / capacity - 1e-9))
