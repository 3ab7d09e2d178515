"""Calibration of the serving predictor: per load level, two corrections fitted on the baseline's measured run(s)
there and applied to every variant's prediction at that level (`predict_level`).

- a per-step overhead (scheduling, sampling, output processing that the table's steps miss), read off the run's
  plain decoding steps when it shows enough of them, else bisected until the predicted output tokens/s (closed
  loop) or mean TPOT (open loop) matches the measured one: fitted to one figure, a burst of long prefills would let
  it take any value that lands the throughput, and a variant, which decodes in fewer steps, would inherit the error;
- a per-request overhead (the send to the engine: HTTP, tokenization), >= 0, refitted so the mean TTFT matches.

The fits use trimmed means (`figures.TRIM`): over a few requests a median jumps as batches change.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runinfra_opt.load.metrics import WARMUP_FRACTION
from runinfra_opt.load.runner import LevelRun, LoadRecord
from runinfra_opt.load.spec import Concurrency, LoadLevel
from runinfra_opt.predict.draftcost import DraftCost
from runinfra_opt.predict.figures import LevelFigures, decode_steps, figures
from runinfra_opt.predict.overhead import NONE as NO_OVERHEAD
from runinfra_opt.predict.overhead import SpecOverhead
from runinfra_opt.predict.serving import VLLM_CPU_SERVER, Corrections, RequestPasses, SchedulerLimits, predict_run
from runinfra_opt.predict.steptable import StepCostTable
from runinfra_opt.records import RequestRecord

FIT_STEPS = 40
"""Most bisections of the step overhead (it stops sooner at `FIT_TOLERANCE_S`)."""
REQUEST_REFITS = 6
"""Most refits of the request overhead for one step overhead (the mean TTFT moves about 1:1 with it)."""
FIT_TOLERANCE_S = 1e-6
MIN_DECODE_STEPS = 10
"""Plain decoding steps a measured run must show for `calibrate(from_steps=True)` to read the step overhead off them."""
MISS = 0.02
"""A calibrated figure further than this (relative) from the measured one is noted."""


@dataclass(frozen=True)
class Calibration:
    """Corrections fitted on the baseline's measured run at one level, with the figures they were fitted to."""

    level: LoadLevel
    corrections: Corrections
    measured: LevelFigures
    raw: LevelFigures
    """The baseline's prediction without corrections."""
    calibrated: LevelFigures
    """The baseline's prediction with them."""
    notes: tuple[str, ...] = ()


def calibrate(
    level: LoadLevel,
    baseline: Sequence[RequestPasses],
    table: StepCostTable,
    measured: LevelRun | Sequence[LevelRun],
    *,
    limits: SchedulerLimits = VLLM_CPU_SERVER,
    warmup_fraction: float = WARMUP_FRACTION,
    from_steps: bool = False,
) -> Calibration:
    """Fit the per-step and per-request overheads at `level` so that the baseline's prediction matches its
    measured run(s): the mean TTFT, and the output tokens/s (closed loop) or mean TPOT (open loop). `from_steps`:
    the runs' records are real streams, so the step overhead is read from their plain decoding steps when they show
    at least `MIN_DECODE_STEPS`."""
    runs = [measured] if isinstance(measured, LevelRun) else list(measured)
    if any(run.level != level for run in runs):
        raise ValueError(f"calibrating {level.name} on a run of another level")
    target = figures(runs, warmup_fraction)
    closed = not level.open_loop
    goal = target.tokens_per_s if closed else target.mean_tpot_s
    if goal is None or target.mean_ttft_s is None:
        what = "output tokens/s" if closed else "TPOT"
        raise ValueError(f"{level.name}: the measured run has no TTFT or {what} to calibrate on")
    ttft_goal: float = target.mean_ttft_s

    def run(step_s: float, request_s: float) -> LevelFigures:
        corrections = Corrections(step_s, request_s)
        return figures(predict_run(level, baseline, table, limits=limits, corrections=corrections), warmup_fraction)

    def fit_request(step_s: float) -> tuple[float, LevelFigures]:
        tried = [(0.0, run(step_s, 0.0))]
        for _ in range(REQUEST_REFITS):
            request_s, got = tried[-1]
            if got.mean_ttft_s is None:
                break
            following = max(0.0, request_s + ttft_goal - got.mean_ttft_s)
            if abs(following - request_s) <= FIT_TOLERANCE_S:
                break
            tried.append((following, run(step_s, following)))
        return min(tried, key=lambda t: abs((t[1].mean_ttft_s or 0.0) - ttft_goal))

    def too_fast(step_s: float) -> bool:
        """The prediction with this step overhead is faster than the measured run."""
        got = fit_request(step_s)[1]
        value = got.tokens_per_s if closed else got.mean_tpot_s
        if value is None:
            return False
        return value > goal if closed else value < goal

    notes: list[str] = []
    steps = decode_steps(runs) if from_steps else []
    if len(steps) >= MIN_DECODE_STEPS:
        step_s = statistics.median(seconds - table.step_s(batch, 1) for batch, seconds in steps)
    else:
        step_s = _bisect_step(level, table, too_fast, notes)
    request_s, calibrated = fit_request(step_s)
    fitted, what = (calibrated.tokens_per_s, "output tokens/s") if closed else (calibrated.mean_tpot_s, "mean TPOT")
    for name, want, got in (("mean TTFT", ttft_goal, calibrated.mean_ttft_s), (what, goal, fitted)):
        if got is not None and abs(got - want) > MISS * want:
            notes.append(f"{level.name}: the calibrated {name} misses the measured one by {(got / want - 1):+.1%}")
    return Calibration(level, Corrections(step_s, request_s), target, run(0.0, 0.0), calibrated, tuple(notes))


def _bisect_step(level: LoadLevel, table: StepCostTable, too_fast: Callable[[float], bool], notes: list[str]) -> float:
    """The step overhead at which the prediction is no longer faster than the measured run (bisection)."""
    low = -0.9 * min(min(row) for row in table.seconds)  # every step keeps a positive duration
    high = max(table.step_s(1, 1), 1e-3)
    while too_fast(high) and high < 60.0:
        low, high = high, high * 2
    if not too_fast(low):
        high = low
        notes.append(f"{level.name}: the table is slower than the measured baseline even at the least step overhead")
    for _ in range(FIT_STEPS):
        if high - low <= FIT_TOLERANCE_S:
            break
        middle = (low + high) / 2
        if too_fast(middle):
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass
class Prediction:
    """A variant's predicted run at one level, raw and (given a calibration) calibrated."""

    level: LoadLevel
    raw: LevelRun
    calibrated: LevelRun | None = None
    corrections: Corrections | None = None
    notes: list[str] = field(default_factory=list)


def predict_level(
    level: LoadLevel,
    requests: Sequence[RequestPasses],
    table: StepCostTable,
    *,
    calibration: Calibration | None = None,
    limits: SchedulerLimits = VLLM_CPU_SERVER,
    overhead: SpecOverhead = NO_OVERHEAD,
    draft: DraftCost | None = None,
) -> Prediction:
    """The raw prediction of `requests` under `level` and, with the baseline's `calibration` at that level,
    the calibrated one (both are `LevelRun`s for `level_metrics`); `overhead` and `draft` are added to both."""
    raw = predict_run(level, requests, table, limits=limits, overhead=overhead, draft=draft)
    if calibration is None:
        return Prediction(level, raw)
    if calibration.level != level:
        raise ValueError(f"a calibration at {calibration.level.name} cannot correct a prediction at {level.name}")
    calibrated = predict_run(
        level, requests, table, limits=limits, corrections=calibration.corrections, overhead=overhead, draft=draft
    )
    return Prediction(level, raw, calibrated, calibration.corrections, list(calibration.notes))


def batch1_run(records: list[RequestRecord], by_id: dict[str, Any]) -> LevelRun:
    """The baseline's measured batch-1 requests as a closed loop of one (what `calibrate` fits to): one after
    another, each token streamed at an even pace between its first token and its end."""
    out = []
    at = 0.0
    for index, record in enumerate(records):
        n = record.output_tokens
        times = [at + record.ttft_s]
        if n > 1:
            gap = (record.e2e_s - record.ttft_s) / (n - 1)
            times += [at + record.ttft_s + gap * i for i in range(1, n)]
        request = by_id.get(record.request_id)
        out.append(
            LoadRecord(
                index=index,
                request_id=record.request_id,
                category=request.category if request else "",
                planned_s=at,
                sent_s=at,
                done_s=at + record.e2e_s,
                success=True,
                ttft_s=record.ttft_s,
                e2e_s=record.e2e_s,
                output_tokens=n,
                prompt_tokens=record.prompt_tokens,
                chunk_s=array("d", times),
                chunk_tokens=array("q", [1] * len(times)),
            )  # fmt: skip
        )
        at += record.e2e_s
    return LevelRun(Concurrency(1), out, started_at=0.0, duration_s=at, peak_in_flight=1)


def calibration_runs(
    measured: list[RequestRecord], passes: list[RequestPasses], by_id: dict[str, Any]
) -> tuple[list[RequestPasses], list[LevelRun]]:
    """The baseline's batch-1 repeats as `calibrate` fits to them: each repeat one pass over the requests every
    repeat holds, in plan order, pooled as a variant's measured figures pool its repeats (a per-request median
    record would be the slower of two repeats: `benchmarks/results/repredict.json`)."""
    by_repeat: dict[int, dict[str, RequestRecord]] = {}
    for record in measured:
        by_repeat.setdefault(record.repeat, {})[record.request_id] = record
    served = [p for p in passes if all(p.request.id in rows for rows in by_repeat.values())] if by_repeat else []
    if not served:
        return [], []
    return served, [batch1_run([rows[p.request.id] for p in served], by_id) for _, rows in sorted(by_repeat.items())]


def as_served(base_passes: list[RequestPasses], runs: list[LevelRun]) -> list[RequestPasses]:
    """The baseline's passes with the output lengths its measured runs served (the median over repeats): under load
    vLLM's greedy output is not batch-invariant, so a request may stop elsewhere than at batch 1, and the calibration
    must serve the run it is fitted to. A baseline
    pass is one token, so its passes follow exactly; a variant's cannot be known and stay as simulated."""
    lengths: dict[str, list[int]] = {}
    for run in runs:
        for record in run.records:
            if record.success and record.output_tokens:
                lengths.setdefault(record.request_id, []).append(record.output_tokens)
    out = []
    for item in base_passes:
        served = lengths.get(item.request.id)
        n = statistics.median_low(served) if served else item.output_tokens
        out.append(replace(item, passes=((1, 1),) * (n - 1)))
    return out
