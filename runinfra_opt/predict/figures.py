"""What the serving predictor's calibration reads off measured runs: a level's headline figures as
`load.metrics.level_metrics` computes them (without its bootstrap) with the trimmed means it fits to, and the engine
steps a streamed run shows (plain decoding steps, a speculating server's steps)."""

from __future__ import annotations

import itertools
import statistics
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runinfra_opt.load.metrics import WARMUP_FRACTION, measured_window
from runinfra_opt.load.runner import LevelRun

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.predict.steptable import StepCostTable


@dataclass(frozen=True)
class LevelFigures:
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


def figures(runs: LevelRun | Sequence[LevelRun], warmup_fraction: float = WARMUP_FRACTION) -> LevelFigures:
    """`LevelFigures` of one run or of a level's repeats pooled, as `level_metrics` pools them (no bootstrap)."""
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
    return LevelFigures(
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
apart on 2 CPU cores and a few ms on a GPU, so a fixed gap would not do for both. (vLLM's API server streams one
chunk per sequence per step, with every token the step emitted for it.)"""


def decode_steps(runs: LevelRun | Sequence[LevelRun]) -> list[tuple[int, float]]:
    """(sequences, seconds) of every plain decoding step a measured run shows: the gap between two consecutive
    steps' streamed chunks when both carry the same number of sequences (one chunk each) and no request's first
    token (a prefill) came in between. Read from the client's receive times, so it includes what the server adds
    to a step (scheduling, sampling, output processing) at the run's real context lengths."""
    return [(len(after), seconds) for _, after, seconds in _step_pairs(runs)]


MIN_BATCH_STEPS = 10
"""Decoding steps behind each point of `batch_residuals`."""


def by_batch_groups(rows: Sequence[tuple[Any, ...]], min_steps: int) -> tuple[list[list[Any]], list[Any]]:
    """Rows whose first field is a step's batch size, in ascending batch size, taken in groups of at least
    `min_steps` (a batch size's rows stay in one group); and the rows left over past the last group. A run that
    climbs through many batch sizes shows few steps at any one of them but many across them."""
    groups: list[list[Any]] = []
    group: list[Any] = []
    ordered = sorted(rows, key=lambda row: row[0])
    for i, row in enumerate(ordered):
        group.append(row)
        if len(group) >= min_steps and (i + 1 == len(ordered) or ordered[i + 1][0] != row[0]):
            groups.append(group)
            group = []
    return groups, group


def batch_residuals(
    runs: LevelRun | Sequence[LevelRun], table: StepCostTable, min_steps: int = MIN_BATCH_STEPS
) -> tuple[tuple[float, float], ...]:
    """What a measured run's plain decoding steps (`decode_steps`) take beyond `table`'s, by batch size: the steps
    in groups (`by_batch_groups`), each group's median batch size and median of (measured - `table.step_s(B, 1)`);
    empty with fewer steps than one group. The table is measured up to a few sequences at one context length, and a
    loaded server's steps run at many more sequences at its requests' own context lengths: read at each batch size,
    these correct both where a constant would correct neither (`Corrections.by_batch`)."""
    rows = [(batch, seconds - table.step_s(batch, 1)) for batch, seconds in decode_steps(runs)]
    groups, left = by_batch_groups(rows, min_steps)
    points = [(statistics.median(b for b, _ in g), statistics.median(r for _, r in g)) for g in groups]
    if left and points:  # the few left join the last group's point
        points[-1] = (points[-1][0], statistics.median([points[-1][1]] + [r for _, r in left]))
    return tuple(points)


def speculative_steps(
    runs: LevelRun | Sequence[LevelRun], passes: Mapping[str, Sequence[tuple[int, int]]]
) -> list[tuple[int, float, float]]:
    """(sequences, tokens carried, seconds) of every decoding step a speculative server's measured run shows, with
    the same steps as `decode_steps` (same number of sequences as the step before, no prefill between them).
    `passes[request_id]`: the request's simulated passes after the prefill, (carried, emitted). vLLM streams one
    chunk per sequence per step, however many tokens the step emitted, so a request that served the simulated
    output length in the simulated number of chunks served the simulated passes, and its step carried its pass's
    tokens. Under load greedy output may leave the batch-1 one; such a request is taken to carry its simulated
    mean (1 + drafted tokens per pass) in each step. Steps with a request that has no simulated passes are left
    out."""
    out = []
    for run in [runs] if isinstance(runs, LevelRun) else runs:
        exact: dict[int, Sequence[tuple[int, int]]] = {}
        mean: dict[int, float] = {}
        for record in run.records:
            simulated = passes.get(record.request_id)
            if not simulated:
                continue
            mean[record.index] = statistics.fmean(carried for carried, _ in simulated)
            if len(record.chunk_s) == 1 + len(simulated) and record.output_tokens == 1 + sum(e for _, e in simulated):
                exact[record.index] = simulated
        for _, after, seconds in _step_pairs(run):
            if all(index in mean for index, _ in after):
                carried = sum(exact[i][chunk - 1][0] if i in exact else mean[i] for i, chunk in after)
                out.append((len(after), carried, seconds))
    return out


Chunk = tuple[int, int]
"""A streamed chunk: its record's `index` and its position in `record.chunk_s` (0: the prefill's first token)."""


def _step_pairs(runs: LevelRun | Sequence[LevelRun]) -> Iterator[tuple[list[Chunk], list[Chunk], float]]:
    """(step before, step, seconds between their first chunks) for consecutive decoding steps of the same number
    of sequences with no prefill between them. A step is the chunks received closer together than `SAME_STEP` x
    the run's median inter-chunk gap."""
    for run in [runs] if isinstance(runs, LevelRun) else runs:
        records = [r for r in run.records if r.success]
        gaps = [b - a for r in records for a, b in itertools.pairwise(r.chunk_s)]
        if not gaps:
            continue
        same = SAME_STEP * statistics.median(gaps)
        firsts = sorted(r.chunk_s[0] for r in records if r.chunk_s)
        chunks = sorted((r.chunk_s[i], r.index, i) for r in records for i in range(1, len(r.chunk_s)))
        steps: list[list[tuple[float, int, int]]] = []
        for chunk in chunks:
            if steps and chunk[0] - steps[-1][-1][0] < same:
                steps[-1].append(chunk)
            else:
                steps.append([chunk])
        for before, after in itertools.pairwise(steps):
            if len(before) != len(after):
                continue
            i = bisect_right(firsts, before[-1][0] - same)
            if i < len(firsts) and firsts[i] <= after[0][0] + same:
                continue  # a prefill finished between them (or with them)
            yield [c[1:] for c in before], [c[1:] for c in after], after[0][0] - before[0][0]
