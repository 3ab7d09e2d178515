"""Serving metrics per load level, from the raw per-request records of one or more runs (repeats) of it.

Tokens/s, requests/s, TTFT, TPOT, ITL, end-to-end latency and goodput (the share of requests within every SLO),
over each run's measured window (warm-up and drain left out, or the whole run when it is too short: see
`MeasuredWindow`), with 95% bootstrap intervals over requests x repeats. Records are only iterated, so a run
read lazily from its file (`store.read_run(path, lazy=True)`) is measured without holding it in memory."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any

from runinfra_opt.load.runner import LevelRun
from runinfra_opt.results import Interval, LevelMetrics, MeasuredWindow
from runinfra_opt.stats import bootstrap_interval, percentiles

WARMUP_FRACTION = 0.1
"""The share of a run's first sends treated as warm-up (their tokens inside the window still count)."""


def records_frame(run: LevelRun) -> Any:
    """One row per request of a run (pandas DataFrame, in index order): planned/sent/done times, send lag,
    success, status, error, TTFT, TPOT, e2e and token counts. Chunk times are left out."""
    import pandas as pd

    _check_kept(run)
    columns = [
        "index", "request_id", "category", "planned_s", "sent_s", "send_lag_s", "done_s", "success", "status",
        "error", "ttft_s", "tpot_s", "e2e_s", "output_tokens", "prompt_tokens",
    ]  # fmt: skip
    rows = [{name: getattr(record, name) for name in columns} for record in run.records]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values("index", kind="stable").reset_index(drop=True)


def measured_window(run: LevelRun, warmup_fraction: float = WARMUP_FRACTION) -> MeasuredWindow:
    """The window of `run` that throughput is measured over: from the send of the first request after the first
    `warmup_fraction` of sends to the last send, after which fewer and fewer requests are in flight. A run too
    short for that (fewer than three requests, or a window shorter than the median request's end-to-end time)
    is measured over its whole span, first send to last completion, and the window says so (`steady`)."""
    import numpy as np

    _check_kept(run)
    if not run.records:
        return MeasuredWindow(start_s=0.0, end_s=0.0, warmup_requests=0, steady=False)
    sent_times: array[float] = array("d")
    e2e: array[float] = array("d")
    last_done = -math.inf
    for r in run.records:  # one pass: the records may be read from disk
        sent_times.append(r.sent_s)
        last_done = max(last_done, r.done_s)
        if r.success and r.e2e_s is not None:
            e2e.append(r.e2e_s)
    sent = np.sort(np.frombuffer(sent_times, dtype=float))
    warmup = int(len(sent) * warmup_fraction)
    start, end = float(sent[warmup]), float(sent[-1])
    too_short = len(sent) < 3 or end <= start or (bool(e2e) and end - start < float(np.median(e2e)))
    if too_short:
        return MeasuredWindow(start_s=float(sent[0]), end_s=last_done, warmup_requests=0, steady=False)
    return MeasuredWindow(start_s=start, end_s=end, warmup_requests=warmup, steady=True)


def _window_tokens(run: LevelRun, window: MeasuredWindow) -> Any:
    """Per record (in `run.records` order): output tokens of a successful request that arrived inside the window."""
    import numpy as np

    counts = np.zeros(len(run.records))
    for i, record in enumerate(run.records):
        if not record.success or not record.chunk_s:
            continue
        times = np.frombuffer(record.chunk_s, dtype=float)
        tokens = np.frombuffer(record.chunk_tokens, dtype=np.int64).astype(float)
        streamed = tokens.sum()
        if streamed > 0 and record.output_tokens and streamed != record.output_tokens:
            tokens *= record.output_tokens / streamed  # chunks counted without log-probs: trust `usage`
        counts[i] = tokens[(times >= window.start_s) & (times <= window.end_s)].sum()
    return counts


def _window_shares(run: LevelRun, window: MeasuredWindow) -> list[float]:
    """Per record (in `run.records` order): its share of the window's length, in proportion to the time it was in
    flight inside the window (sent to done, clipped to the window); equal shares when none overlaps it. A bootstrap
    resample then varies both what requests produced and how long they took: with equal shares, answers all
    capped at one length would collapse the interval to a point."""
    count = len(run.records)
    if not count:
        return []
    overlaps = [max(0.0, min(r.done_s, window.end_s) - max(r.sent_s, window.start_s)) for r in run.records]
    total = sum(overlaps)
    if total <= 0:
        return [window.seconds / count] * count
    return [window.seconds * overlap / total for overlap in overlaps]


def level_metrics(
    runs: Sequence[LevelRun],
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    warmup_fraction: float = WARMUP_FRACTION,
    seed: int = 0,
) -> LevelMetrics:
    """Metrics of one load level over its runs (repeats), from their raw records: output tokens/s inside the
    measured windows (each chunk counted at its arrival), requests/s, TTFT, TPOT, ITL and end-to-end percentiles
    of the successful requests sent inside them, and with SLOs the goodput (the share of those requests that
    succeeded within every SLO, bounds inclusive, as in `vllm bench serve`)."""
    import numpy as np

    if not runs:
        raise ValueError("level_metrics needs at least one run")
    level = runs[0].level
    if any(run.level != level for run in runs):
        raise ValueError("level_metrics pools runs of one load level only")
    windows = [measured_window(run, warmup_fraction) for run in runs]
    tokens: list[float] = []
    shares: list[float] = []
    completed = good_completed = 0
    ttft: list[float] = []
    tpot: list[float] = []
    itl: array[float] = array("d")  # every measured request's chunk gaps (8 bytes each, not a record each)
    e2e: list[float] = []
    good_flags: list[float] = []
    lags: array[float] = array("d")
    succeeded = failed = 0
    for run, window in zip(runs, windows, strict=True):
        for count, share in zip(_window_tokens(run, window).tolist(), _window_shares(run, window), strict=True):
            if share > 0 or count > 0:  # one never in flight inside the window adds nothing to either sum
                tokens.append(count)
                shares.append(share)
        for record in run.records:
            lags.append(record.send_lag_s)
            succeeded += record.success
            failed += not record.success
            good = record.success and _meets(record.ttft_s, record.tpot_s, slo_ttft_ms, slo_tpot_ms)
            if record.success and window.start_s <= record.done_s <= window.end_s:
                completed += 1
                good_completed += good
            if window.steady and not window.start_s <= record.sent_s <= window.end_s:
                continue
            good_flags.append(float(good))
            if not record.success:
                continue
            if record.ttft_s is not None:
                ttft.append(record.ttft_s)
            if record.tpot_s is not None:
                tpot.append(record.tpot_s)
            if record.e2e_s is not None:
                e2e.append(record.e2e_s)
            itl.frombytes(np.diff(np.frombuffer(record.chunk_s, dtype=float)).tobytes())
    gaps: Any = np.frombuffer(itl, dtype=float)
    lag_values: Any = np.frombuffer(lags, dtype=float)
    seconds = sum(w.seconds for w in windows)
    throughput = None
    if seconds > 0 and tokens:
        throughput = bootstrap_interval(_tokens_per_s, [tokens, shares], seed=seed)
    has_slo = slo_ttft_ms is not None or slo_tpot_ms is not None
    goodput = None
    if has_slo and good_flags:
        goodput = bootstrap_interval(np.mean, [good_flags], seed=seed)
    notes = [note for run in runs for note in run.notes]
    if any(not w.steady for w in windows):
        notes.append(
            f"{level.name}: {sum(not w.steady for w in windows)} of {len(windows)} run(s) too short to exclude "
            "warm-up and drain: measured from the first send to the last completion"
        )
    return LevelMetrics(
        level=level.name,
        description=level.describe(),
        runs=len(runs),
        requests=len(lags),
        succeeded=succeeded,
        failed=failed,
        windows=windows,
        output_tokens_per_s=throughput,
        requests_per_s=completed / seconds if seconds > 0 else None,
        ttft_s=percentiles(ttft),
        tpot_s=percentiles(tpot),
        itl_s=percentiles(gaps),
        e2e_s=percentiles(e2e),
        send_lag_s=percentiles(lag_values),
        late_requests=sum(run.late_requests for run in runs),
        peak_in_flight=max(run.peak_in_flight for run in runs),
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
        goodput=goodput,
        goodput_requests_per_s=good_completed / seconds if has_slo and seconds > 0 else None,
        notes=notes,
    )


def _check_kept(run: LevelRun) -> None:
    if not run.records_kept:
        raise ValueError(
            f"{run.level.name}: the run's records were streamed to a sink, not kept: read them back from its file "
            "(runinfra_opt.load.store.read_run(path, lazy=True))"
        )


def _rows(run: LevelRun, warmup_fraction: float) -> dict[int, tuple[float, float]]:
    """Per request index: (its output tokens inside the run's window, its share of the window's length)."""
    window = measured_window(run, warmup_fraction)
    tokens = _window_tokens(run, window)
    shares = _window_shares(run, window)
    return {
        record.index: (float(count), share)
        for record, count, share in zip(run.records, tokens, shares, strict=True)
    }


def throughput_ratio(
    runs: Sequence[LevelRun],
    baseline: Sequence[LevelRun],
    *,
    warmup_fraction: float = WARMUP_FRACTION,
    seed: int = 0,
) -> Interval | None:
    """Output tokens/s of `runs` over that of `baseline` at the same load level, over their measured windows, with
    a 95% paired bootstrap interval: the i-th run is paired with the i-th baseline run (repeats timed side by
    side) and requests by their position in the schedule. None when nothing pairs up."""
    columns: list[list[float]] = [[], [], [], []]
    for run, base in zip(runs, baseline, strict=False):
        if run.level != base.level:
            raise ValueError(f"throughput_ratio compares one load level: {run.level.name} vs {base.level.name}")
        mine, theirs = _rows(run, warmup_fraction), _rows(base, warmup_fraction)
        for index in sorted(mine.keys() & theirs.keys()):
            for column, value in zip(columns, (*mine[index], *theirs[index]), strict=True):
                column.append(value)
    if not columns[0] or sum(columns[1]) <= 0 or sum(columns[2]) <= 0 or sum(columns[3]) <= 0:
        return None
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):  # resamples at +inf (see `_ratio`)
        interval = bootstrap_interval(_ratio, columns, seed=seed)
    if not all(math.isfinite(x) for x in (interval.value, interval.low, interval.high)):
        return None  # too few requests streamed inside the baseline's window for a ratio (a run too short)
    return interval


def _ratio(tokens: Any, shares: Any, base_tokens: Any, base_shares: Any, axis: int = -1) -> Any:
    """Tokens/s over the baseline's; +inf for a resample in which the baseline streamed nothing inside its
    window (a short run), so that such resamples push the interval to infinity rather than vanish."""
    import numpy as np

    mine = _tokens_per_s(tokens, shares, axis)
    theirs = _tokens_per_s(base_tokens, base_shares, axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(theirs > 0, mine / np.where(theirs > 0, theirs, 1.0), np.inf)


def _tokens_per_s(tokens: Any, shares: Any, axis: int = -1) -> Any:
    """Tokens over time; 0 for a resample whose requests were none of them in flight inside the window (they
    streamed nothing there either)."""
    import numpy as np

    seconds = shares.sum(axis=axis)
    return np.where(seconds > 0, tokens.sum(axis=axis) / np.where(seconds > 0, seconds, 1.0), 0.0)


def _meets(ttft_s: float | None, tpot_s: float | None, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    if slo_ttft_ms is not None and (ttft_s is None or ttft_s * 1000 > slo_ttft_ms):
        return False
    return slo_tpot_ms is None or tpot_s is None or tpot_s * 1000 <= slo_tpot_ms
