"""Statistics over raw per-request records (never averages of averages): percentiles, pooled tokens/s, paired
throughput and TTFT ratios with bootstrap intervals over requests x repeats, per-category summaries.

Pure functions over `RequestRecord`s (measured or predicted); numpy and scipy are imported inside the functions
that need them. `summarize` is what `bench` prints; `summarize_with_intervals` adds what `optimize` decides on
(the tokens/s interval and the median-over-repeats throughput ratio).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from runinfra_opt.records import RequestRecord
from runinfra_opt.results import Interval, Summary

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
RESAMPLES = 2000
BOOTSTRAP_CELLS = 4_000_000
"""`bootstrap_interval` resamples in batches above this many resampled values per column (memory, not results)."""


def percentiles(values: Sequence[float], ps: Iterable[int] = PERCENTILES) -> dict[str, float]:
    """{"p50": ..., "p90": ...} with linear interpolation; empty input gives an empty dict (lists or arrays)."""
    if len(values) == 0:
        return {}
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(arr, p)) for p in ps}


def percentile(values: Sequence[float], which: str) -> float:
    """`which` is p50/p90/p95/p99."""
    return percentiles(values, [int(which.lstrip("p"))])[which]


def tokens_per_s(records: Sequence[RequestRecord]) -> float:
    """Output tokens over summed end-to-end time: the workload's decode throughput at batch 1."""
    seconds = sum(r.e2e_s for r in records)
    return sum(r.output_tokens for r in records) / seconds if seconds > 0 else 0.0


def own_repeats(baseline: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The baseline's own repeats: its records not timed in a candidate's trial (all of them when every one
    was, as on the Ray executor)."""
    return [b for b in baseline if b.trial is None] or list(baseline)


def comparable_tokens_per_s(
    records: Sequence[RequestRecord], baseline: Sequence[RequestRecord], *, seed: int = 0
) -> float:
    """What a variant's throughput is ranked by: its tokens/s; for records timed in a trial beside the baseline
    (`RequestRecord.trial`), its paired ratio to the baseline's requests of that trial times the baseline's own
    tokens/s (`own_repeats`), so that variants timed minutes apart on a machine whose speed moves compare at one
    speed, the baseline's."""
    if not any(r.trial is not None for r in records):
        return tokens_per_s(records)
    ratio = throughput_ratio(records, baseline, seed=seed)
    return ratio.value * tokens_per_s(own_repeats(baseline)) if ratio else tokens_per_s(records)


def ttft_at(records: Sequence[RequestRecord], which: str) -> float:
    return percentile([r.ttft_s for r in records], which)


def mean_accepted_per_pass(records: Sequence[RequestRecord]) -> float | None:
    """Mean draft tokens accepted per target pass over every pass of every record (speculative records only)."""
    accepted = [n for r in records for n in r.accepted_per_pass]
    return sum(accepted) / len(accepted) if accepted else None


def acceptance_rate(records: Sequence[RequestRecord]) -> float | None:
    """Accepted draft tokens over drafted tokens, summed over the records."""
    drafted = sum(r.drafted_tokens for r in records)
    return sum(r.accepted_tokens for r in records) / drafted if drafted else None


def lossless(records: Sequence[RequestRecord]) -> bool | None:
    """False if any compared record differs from the baseline; True if all compared ones match; None if none was
    compared (sampled requests, or no baseline)."""
    compared = [r.lossless for r in records if r.lossless is not None]
    if not compared:
        return None
    return all(compared)


def near_ties_only(records: Sequence[RequestRecord]) -> bool:
    """True when some records differ from the baseline and every one of them differs at a near-tie."""
    differing = [r for r in records if r.lossless is False]
    return bool(differing) and all(r.near_tie for r in differing)


def summarize(records: Sequence[RequestRecord]) -> Summary:
    """Aggregate figures for one variant from its raw records (all requests x repeats)."""
    tpots = [t for r in records if (t := r.tpot_s) is not None]
    return Summary(
        tokens_per_s=tokens_per_s(records),
        ttft_s=percentiles([r.ttft_s for r in records]),
        tpot_s=percentiles(tpots),
        e2e_s=percentiles([r.e2e_s for r in records]),
        mean_accepted_per_pass=mean_accepted_per_pass(records),
        acceptance_rate=acceptance_rate(records),
        target_passes=sum(r.target_passes for r in records),
        draft_passes=sum(r.draft_passes for r in records),
        output_tokens=sum(r.output_tokens for r in records),
        lossless=lossless(records),
        near_ties_only=near_ties_only(records),
    )


def paired(
    records: Sequence[RequestRecord], baseline: Sequence[RequestRecord]
) -> list[tuple[RequestRecord, RequestRecord]]:
    """Pairs (record, baseline record) with the same request id, repeat and trial, in `records` order (the trial
    is None for every record of a run whose variants were timed in one process; a distributed run pairs each
    variant only with the baseline repeats timed beside it on its node)."""
    index = {(b.request_id, b.repeat, b.trial): b for b in baseline}
    return [
        (r, index[(r.request_id, r.repeat, r.trial)]) for r in records if (r.request_id, r.repeat, r.trial) in index
    ]


def speedup(
    records: Sequence[RequestRecord],
    baseline: Sequence[RequestRecord],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval | None:
    """Ratio of the variant's tokens/s to the baseline's over paired (request, repeat) records, with a 95%
    percentile-bootstrap interval that resamples the pairs. None when nothing pairs up."""
    pairs = paired(records, baseline)
    if not pairs:
        return None
    import numpy as np

    tokens = np.array([[r.output_tokens, b.output_tokens] for r, b in pairs], dtype=float)
    seconds = np.array([[r.e2e_s, b.e2e_s] for r, b in pairs], dtype=float)

    def ratio(t: np.ndarray, s: np.ndarray) -> np.ndarray:
        variant = t[..., 0].sum(-1) / s[..., 0].sum(-1)
        base = t[..., 1].sum(-1) / s[..., 1].sum(-1)
        return variant / base

    point = float(ratio(tokens, seconds))
    if len(pairs) == 1:
        return Interval(value=point, low=point, high=point)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pairs), size=(resamples, len(pairs)))
    samples = ratio(tokens[idx], seconds[idx])
    low, high = np.percentile(samples, [2.5, 97.5])
    return Interval(value=point, low=float(low), high=float(high))


def _bootstrap(
    statistic: Callable[..., Any],
    columns: Sequence[Sequence[float]],
    *,
    seed: int,
    point: float,
    batch: int | None = None,
) -> tuple[float, float]:
    """95% percentile interval of a paired statistic over the rows of `columns` (scipy.stats.bootstrap); `batch`
    resamples at a time (None: all at once)."""
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
        batch=batch,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_interval(statistic: Callable[..., Any], columns: Sequence[Sequence[float]], *, seed: int = 0) -> Interval:
    """`statistic(*columns, axis=-1)` (vectorized, over paired rows: requests x repeats) with its 95% percentile
    bootstrap interval that resamples the rows."""
    import numpy as np

    point = float(statistic(*(np.asarray(c, dtype=float) for c in columns), axis=-1))
    rows = len(columns[0]) if columns else 0
    # scipy holds (resamples at a time x rows) values per column: bound that to ~32 MB for long runs.
    batch = None if rows * RESAMPLES <= BOOTSTRAP_CELLS else max(1, BOOTSTRAP_CELLS // max(rows, 1))
    low, high = _bootstrap(statistic, columns, seed=seed, point=point, batch=batch)
    return Interval(value=point, low=min(low, point), high=max(high, point))


def throughput_ratio(
    records: Sequence[RequestRecord], baseline: Sequence[RequestRecord], *, seed: int = 0
) -> Interval | None:
    """The variant's tokens/s over the baseline's, paired by (request, repeat). Value: the median over repeats
    of each repeat's pooled ratio (the pooled ratio when there is one repeat); interval: the paired bootstrap
    over requests x repeats of `speedup`. None when nothing pairs up."""
    matched = paired(records, baseline)
    if not matched:
        return None
    interval = speedup([r for r, _ in matched], [b for _, b in matched], seed=seed)
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
    records: Sequence[RequestRecord], other: Sequence[RequestRecord], which: str, *, seed: int = 0
) -> Interval | None:
    """TTFT at percentile `which` of `records` over that of `other`, paired by (request, repeat), with a 95%
    paired bootstrap interval. Below 1.0: `records` reach the first token sooner."""
    matched = paired(records, other)
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


def tokens_per_s_interval(records: Sequence[RequestRecord], *, seed: int = 0) -> Interval:
    """Pooled tokens/s with a 95% bootstrap interval over requests x repeats."""
    point = tokens_per_s(records)

    def statistic(tokens: Any, seconds: Any, axis: int = -1) -> Any:
        return tokens.sum(axis=axis) / seconds.sum(axis=axis)

    low, high = _bootstrap(
        statistic, [[r.output_tokens for r in records], [r.e2e_s for r in records]], seed=seed, point=point
    )
    return Interval(value=point, low=min(low, point), high=max(high, point))


def summarize_with_intervals(
    records: Sequence[RequestRecord], baseline: Sequence[RequestRecord] | None = None, *, seed: int = 0
) -> Summary:
    """`summarize` plus the tokens/s interval and, given the baseline's records, the throughput ratio with its
    interval (what `optimize` decides on)."""
    summary = summarize(records)
    if records and any(r.e2e_s > 0 for r in records):
        summary.tokens_per_s_interval = tokens_per_s_interval(records, seed=seed)
    if baseline:
        summary.speedup = throughput_ratio(records, baseline, seed=seed)
    return summary


def relative_mad(values: Sequence[float]) -> float | None:
    """Median absolute deviation from the median, over the median (a robust relative spread; None for no values
    or a median of 0)."""
    if not values:
        return None
    middle = statistics.median(values)
    if middle == 0:
        return None
    return statistics.median(abs(v - middle) for v in values) / abs(middle)


def by_category(records: Sequence[RequestRecord]) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.category, []).append(r)
    return groups


def summarize_by_category(
    records: Sequence[RequestRecord], baseline: Sequence[RequestRecord] | None = None, *, seed: int = 0
) -> dict[str, Summary]:
    """`summarize_with_intervals` per workload category (for `VariantResult.per_category`)."""
    base_groups = by_category(baseline or [])
    return {
        category: summarize_with_intervals(group, base_groups.get(category), seed=seed)
        for category, group in sorted(by_category(records).items())
    }
