"""Percentiles and summaries over raw per-request records (never averages of averages).

Pure functions over `RequestRecord`s; numpy is imported inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from runinfra_opt.engine.protocol import RequestRecord
from runinfra_opt.results import Interval, Summary

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def percentiles(values: Sequence[float], ps: Iterable[int] = PERCENTILES) -> dict[str, float]:
    """{"p50": ..., "p90": ...} with linear interpolation; empty input gives an empty dict."""
    if not values:
        return {}
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(arr, p)) for p in ps}


def tokens_per_s(records: Sequence[RequestRecord]) -> float:
    """Output tokens over summed end-to-end time: the workload's decode throughput at batch 1."""
    seconds = sum(r.e2e_s for r in records)
    return sum(r.output_tokens for r in records) / seconds if seconds > 0 else 0.0


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
    )


def paired(
    records: Sequence[RequestRecord], baseline: Sequence[RequestRecord]
) -> list[tuple[RequestRecord, RequestRecord]]:
    """Pairs (variant record, baseline record) with the same request id and repeat."""
    index = {(b.request_id, b.repeat): b for b in baseline}
    return [(r, index[(r.request_id, r.repeat)]) for r in records if (r.request_id, r.repeat) in index]


def speedup(
    records: Sequence[RequestRecord],
    baseline: Sequence[RequestRecord],
    *,
    resamples: int = 2000,
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
