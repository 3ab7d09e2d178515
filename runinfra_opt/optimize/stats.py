"""Statistics the optimizer decides on: summaries with bootstrap intervals over requests x repeats.

Builds on `runinfra_opt.stats` (percentiles, pooled tokens/s, the paired throughput-ratio bootstrap) and adds
what selection needs: the median over repeats of the throughput ratio, a paired bootstrap interval for a
TTFT-percentile ratio (scipy.stats.bootstrap, seeded), and per-category summaries. Works on the results
file's `RequestResult`s (measured or predicted), which carry the same fields as the engine's records.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, cast

from runinfra_opt import stats as base_stats
from runinfra_opt.engine.protocol import RequestRecord
from runinfra_opt.results import Interval, RequestResult, Summary

RESAMPLES = 2000


def _as_records(records: Sequence[RequestResult]) -> Sequence[RequestRecord]:
    # RequestResult has every attribute the base helpers read (output_tokens, e2e_s, ttft_s, tpot_s, ...).
    return cast(Sequence[RequestRecord], records)


def _keyed(records: Sequence[RequestResult]) -> dict[tuple[str, int], RequestResult]:
    return {(r.request_id, r.repeat): r for r in records}


def pairs(
    records: Sequence[RequestResult], other: Sequence[RequestResult]
) -> list[tuple[RequestResult, RequestResult]]:
    """(record, other record) with the same request id and repeat, in `records` order."""
    index = _keyed(other)
    return [(r, index[(r.request_id, r.repeat)]) for r in records if (r.request_id, r.repeat) in index]


def tokens_per_s(records: Sequence[RequestResult]) -> float:
    return base_stats.tokens_per_s(_as_records(records))


def percentile(values: Sequence[float], which: str) -> float:
    """`which` is p50/p90/p95/p99."""
    return base_stats.percentiles(values, [int(which.lstrip("p"))])[which]


def ttft_at(records: Sequence[RequestResult], which: str) -> float:
    return percentile([r.ttft_s for r in records], which)


def _bootstrap(
    statistic: Callable[..., Any], columns: Sequence[Sequence[float]], *, seed: int, point: float
) -> tuple[float, float]:
    """95% percentile interval of a paired statistic over the rows of `columns` (scipy.stats.bootstrap)."""
    import numpy as np
    from scipy.stats import bootstrap

    data = tuple(np.asarray(c, dtype=float) for c in columns)
    if len(data[0]) < 2 or all(np.all(c == c[0]) for c in data):
        return point, point
    res = bootstrap(
        data,
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=RESAMPLES,
        method="percentile",
        confidence_level=0.95,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def throughput_ratio(
    records: Sequence[RequestResult], baseline: Sequence[RequestResult], *, seed: int = 0
) -> Interval | None:
    """The variant's tokens/s over the baseline's, paired by (request, repeat). Value: the median over repeats
    of each repeat's pooled ratio (the pooled ratio when there is one repeat); interval: the paired bootstrap
    over requests x repeats of `runinfra_opt.stats.speedup`. None when nothing pairs up."""
    matched = pairs(records, baseline)
    if not matched:
        return None
    interval = base_stats.speedup(
        _as_records([r for r, _ in matched]), _as_records([b for _, b in matched]), resamples=RESAMPLES, seed=seed
    )
    if interval is None:  # pragma: no cover - matched is non-empty
        return None
    per_repeat = []
    for repeat in sorted({r.repeat for r, _ in matched}):
        mine = [r for r, _ in matched if r.repeat == repeat]
        theirs = [b for r, b in matched if r.repeat == repeat]
        base_tps = tokens_per_s(theirs)
        if base_tps > 0:
            per_repeat.append(tokens_per_s(mine) / base_tps)
    value = statistics.median(per_repeat) if per_repeat else interval.value
    return Interval(value=value, low=min(interval.low, value), high=max(interval.high, value))


def ttft_ratio(
    records: Sequence[RequestResult], other: Sequence[RequestResult], which: str, *, seed: int = 0
) -> Interval | None:
    """TTFT at percentile `which` of `records` over that of `other`, paired by (request, repeat), with a 95%
    paired bootstrap interval. Below 1.0: `records` reach the first token sooner."""
    matched = pairs(records, other)
    if not matched:
        return None
    q = float(which.lstrip("p"))
    mine = [r.ttft_s for r, _ in matched]
    theirs = [o.ttft_s for _, o in matched]
    base = percentile(theirs, which)
    if base <= 0:
        return None
    point = percentile(mine, which) / base

    def statistic(a: Any, b: Any, axis: int = -1) -> Any:
        import numpy as np

        return np.percentile(a, q, axis=axis) / np.percentile(b, q, axis=axis)

    low, high = _bootstrap(statistic, [mine, theirs], seed=seed, point=point)
    return Interval(value=point, low=min(low, point), high=max(high, point))


def tokens_per_s_interval(records: Sequence[RequestResult], *, seed: int = 0) -> Interval:
    """Pooled tokens/s with a 95% bootstrap interval over requests x repeats."""
    point = tokens_per_s(records)

    def statistic(tokens: Any, seconds: Any, axis: int = -1) -> Any:
        return tokens.sum(axis=axis) / seconds.sum(axis=axis)

    low, high = _bootstrap(
        statistic, [[r.output_tokens for r in records], [r.e2e_s for r in records]], seed=seed, point=point
    )
    return Interval(value=point, low=min(low, point), high=max(high, point))


def summarize(
    records: Sequence[RequestResult], baseline: Sequence[RequestResult] | None = None, *, seed: int = 0
) -> Summary:
    """A variant's Summary from its per-request results: `runinfra_opt.stats.summarize` plus the tokens/s
    interval and, given the baseline's results, the throughput ratio with its interval."""
    summary = base_stats.summarize(_as_records(records))
    if records and any(r.e2e_s > 0 for r in records):
        summary.tokens_per_s_interval = tokens_per_s_interval(records, seed=seed)
    if baseline:
        summary.speedup = throughput_ratio(records, baseline, seed=seed)
    return summary


def by_category(records: Sequence[RequestResult]) -> dict[str, list[RequestResult]]:
    groups: dict[str, list[RequestResult]] = {}
    for r in records:
        groups.setdefault(r.category, []).append(r)
    return groups


def summarize_by_category(
    records: Sequence[RequestResult], baseline: Sequence[RequestResult] | None = None, *, seed: int = 0
) -> dict[str, Summary]:
    """`summarize` per workload category (for `VariantResult.per_category`)."""
    base_groups = by_category(baseline or [])
    return {
        category: summarize(group, base_groups.get(category), seed=seed)
        for category, group in sorted(by_category(records).items())
    }
