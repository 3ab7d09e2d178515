"""A load level's headline figures as `runinfra_opt.load.metrics.level_metrics` computes them, without its
bootstrap, and the trimmed means the serving predictor's calibration fits to (`runinfra_opt.load.predict`)."""

from __future__ import annotations

import itertools
import statistics
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from runinfra_opt.load.metrics import WARMUP_FRACTION, measured_window
from runinfra_opt.load.runner import LevelRun


@dataclass(frozen=True)
class Figures:
    """A level's headline figures as `level_metrics` computes them (its point values; None: not measured), and
    the trimmed means the calibration fits to (`TRIM`: smoother in the corrections than medians over a few
    requests, and robust to a stray slow request, which a plain mean is not)."""

    tokens_per_s: float | None
    """Output tokens/s over the measured windows."""
    ttft_s: float | None
    """TTFT p50."""
    tpot_s: float | None
    """TPOT p50."""
    mean_ttft_s: float | None
    mean_tpot_s: float | None


TRIM = 0.1
"""The share of the lowest and of the highest values that the fitted means leave out."""


def figures(runs: LevelRun | Sequence[LevelRun], warmup_fraction: float = WARMUP_FRACTION) -> Figures:
    """`Figures` of one run or of a level's repeats pooled, as `level_metrics` pools them (without its bootstrap)."""
    tokens = seconds = 0.0
    ttft: list[float] = []
    tpot: list[float] = []
    for run in [runs] if isinstance(runs, LevelRun) else runs:
        window = measured_window(run, warmup_fraction)
        seconds += window.seconds
        for record in run.records:
            if not record.success:
                continue
            streamed = sum(record.chunk_tokens)
            scale = record.output_tokens / streamed if streamed and record.output_tokens else 1.0
            times = zip(record.chunk_s, record.chunk_tokens, strict=True)
            tokens += scale * sum(n for t, n in times if window.start_s <= t <= window.end_s)
            if window.steady and not window.start_s <= record.sent_s <= window.end_s:
                continue
            if record.ttft_s is not None:
                ttft.append(record.ttft_s)
            if record.tpot_s is not None:
                tpot.append(record.tpot_s)
    return Figures(
        tokens / seconds if seconds > 0 else None,
        statistics.median(ttft) if ttft else None,
        statistics.median(tpot) if tpot else None,
        _trimmed_mean(ttft),
        _trimmed_mean(tpot),
    )


def _trimmed_mean(values: list[float]) -> float | None:
    if not values:
        return None
    cut = int(len(values) * TRIM)
    return statistics.fmean(sorted(values)[cut : len(values) - cut])


SAME_STEP = 0.25
"""Streamed chunks received closer together than this share of the run's median inter-chunk gap (about one step)
are taken as one engine step's: a step's chunks reach the client within a millisecond or two, steps are ~30-70 ms
apart on 2 CPU cores and a few ms on a GPU, so a fixed gap would not do for both."""


def decode_steps(runs: LevelRun | Sequence[LevelRun]) -> list[tuple[int, float]]:
    """(sequences, seconds) of every plain decoding step a measured run shows: the gap between two consecutive
    steps' streamed chunks when both carry the same number of sequences (one chunk each: no speculation) and no
    request's first token (a prefill) came in between. Read from the client's receive times, so it includes what
    the server adds to a step (scheduling, sampling, output processing) at the run's real context lengths."""
    out: list[tuple[int, float]] = []
    for run in [runs] if isinstance(runs, LevelRun) else runs:
        gaps = [b - a for r in run.records if r.success for a, b in itertools.pairwise(r.chunk_s)]
        if not gaps:
            continue
        same = SAME_STEP * statistics.median(gaps)
        firsts = sorted(r.chunk_s[0] for r in run.records if r.success and r.chunk_s)
        steps: list[list[float]] = []
        for t in sorted(t for r in run.records if r.success for t in r.chunk_s[1:]):
            if steps and t - steps[-1][-1] < same:
                steps[-1].append(t)
            else:
                steps.append([t])
        for before, after in itertools.pairwise(steps):
            if len(before) != len(after):
                continue
            i = bisect_right(firsts, before[-1] - same)
            if i < len(firsts) and firsts[i] <= after[0] + same:
                continue  # a prefill finished between them (or with them)
            out.append((len(after), after[0] - before[0]))
    return out
