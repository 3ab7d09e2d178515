"""The in-process engine's batch-1 model: one request's (TTFT, end-to-end) seconds under one variant, from its
simulated passes and the measured `CostModel`, and the calibrations that fit the model's overheads to measured
requests.

`predict_request`: TTFT = request overhead + the draft's prefill and round-0 steps + the target's prefill over
prompt + round-0 candidates; end-to-end = TTFT + per later round the target's forward over its chunk, the draft's
steps and the step overhead; every round adds its candidate search (from a search table) and the method's
calibrated round overhead plus its cost per drafted token. `calibrate_overheads` fits the request and step
overheads to the baseline's measured requests; `calibrate_round_overhead` fits the per-method round terms to a few
timed speculative requests.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from runinfra_opt.methods import Variant, get_method
from runinfra_opt.methods.simulation import ExpectedSimResult, SimResult
from runinfra_opt.predict.costmodel import CostModel, RoleCost


def role_for(variant: Variant) -> str | None:
    """The cost-model role that drafts for `variant` (None: no drafting model)."""
    drafter = get_method(variant.method).drafter(variant)
    return drafter.role if drafter is not None else None


@dataclass(frozen=True)
class Observation:
    """One measured baseline request: the input of `calibrate_overheads`."""

    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    e2e_s: float


def _theil_sen(points: Sequence[tuple[float, float]], min_slope: float | None = 0.0) -> tuple[float, float]:
    """Robust line through (x, y): the median of pairwise slopes (clamped at >= `min_slope` unless None), then
    the median intercept."""
    slopes = [(y1 - y0) / (x1 - x0) for i, (x0, y0) in enumerate(points) for x1, y1 in points[i + 1 :] if x1 != x0]
    slope = statistics.median(slopes) if slopes else 0.0
    if min_slope is not None:
        slope = max(slope, min_slope)
    return statistics.median(y - slope * x for x, y in points), slope


def _copy(cost: CostModel, **changes: Any) -> CostModel:
    """`cost` with `changes`, its per-method dicts copied (a calibration never alters the model it starts from)."""
    fresh: dict[str, Any] = {
        "round_overhead_s": dict(cost.round_overhead_s),
        "drafted_token_overhead_s": dict(cost.drafted_token_overhead_s),
        "search": dict(cost.search),
    }
    return replace(cost, **(fresh | changes))


def calibrate_overheads(cost: CostModel, baseline: Iterable[Observation]) -> CostModel:
    """Calibrate the target's time to first token and the per-step overhead from measured greedy baseline
    requests (the same requests, on the same machine, that the prediction is for).

    - With at least 3 requests of at least 2 distinct prompt lengths, TTFT is fitted as a robust line
      (Theil-Sen) over prompt length: it becomes the target's `prefill_line` and includes the request
      overhead (so `request_overhead_s` is 0). Otherwise `request_overhead_s` is the median of
      (TTFT - prefill(P)) from the table, negative when the table over-estimates.
    - `step_overhead_s` is the median per-step residual of (e2e - TTFT - sum of one-token forwards): the
      generate loop's Python cost and the longer real contexts. It may be negative; a step's sum stays >= 0.
    """
    observations = list(baseline)
    target = cost.target
    request_overhead = cost.request_overhead_s
    points = [(float(o.prompt_tokens), o.ttft_s) for o in observations]
    if len(points) >= 3 and len({x for x, _ in points}) >= 2:
        target = replace(target, prefill_line=_theil_sen(points))
        request_overhead = 0.0
    elif points:
        request_overhead = statistics.median(t - target.prefill(int(x)) for x, t in points)
        # Same bound as for steps: at most 80% of the table's prefill may be taken back.
        request_overhead = max(request_overhead, -0.8 * statistics.median(target.prefill(int(x)) for x, _ in points))
    step_residuals, one_token = [], []
    for obs in observations:
        steps = obs.output_tokens - 1
        if steps > 0:
            forwards = sum(target.forward(1, obs.prompt_tokens + i) for i in range(1, steps + 1))
            step_residuals.append((obs.e2e_s - obs.ttft_s - forwards) / steps)
            one_token.append(forwards / steps)
    step_overhead = statistics.median(step_residuals) if step_residuals else cost.step_overhead_s
    if one_token:
        # A table measured while the machine was busier than during the baseline can over-estimate a step;
        # the correction may take back at most 80% of it, so no predicted step shrinks to nothing (a zero
        # predicted time would make throughput infinite).
        step_overhead = max(step_overhead, -0.8 * statistics.median(one_token))
    return _copy(cost, roles={**cost.roles, "target": target}, request_overhead_s=request_overhead,
                 step_overhead_s=step_overhead)  # fmt: skip


def _rounds(sim: SimResult, prompt_len: int) -> list[tuple[int, int]]:
    """(chunk, context before the pass) for every target pass (the baseline records no accepted counts: 0)."""
    out, context = [], prompt_len
    for i, chunk in enumerate(sim.chunks):
        out.append((chunk, context))
        context += (sim.accepted_per_pass[i] if i < len(sim.accepted_per_pass) else 0) + 1
    return out


def _draft_round(role: RoleCost, drafted: int, context: int, overhead: float) -> float:
    """A later round's drafting: the first forward re-reads 2 tokens, the rest 1 each."""
    if drafted <= 0:
        return 0.0
    total = role.forward(2, context) + overhead
    total += sum(role.forward(1, context + j) + overhead for j in range(1, drafted))
    return total


def predict_request(
    sim: SimResult | ExpectedSimResult, prompt_len: int, cost: CostModel, variant: Variant
) -> tuple[float, float]:
    """Predicted (TTFT, end-to-end) seconds of one request under `variant`, from its simulated passes."""
    target = cost.target
    step = cost.step_overhead_s
    role_name = role_for(variant)
    drafter = cost.role(role_name) if role_name else None
    per_round = cost.round_overhead_s.get(variant.method, 0.0) if variant.is_speculative else 0.0
    per_drafted = cost.drafted_token_overhead_s.get(variant.method, 0.0) if variant.is_speculative else 0.0

    def verify(chunk: int, context: int) -> float:
        """A later round's target pass with its step overhead and round terms (never below 0)."""
        return max(max(target.forward(chunk, context) + step, 0.0) + per_round + per_drafted * (chunk - 1), 0.0)

    search = cost.search.get(variant.method) if variant.is_speculative else None
    if sim.output_tokens == 0:
        return cost.request_overhead_s, cost.request_overhead_s
    rounds = _rounds(sim, prompt_len) if isinstance(sim, SimResult) else []

    def search_s(i: int) -> float:
        """Round i's candidate search (over the sequence as it is before that round's pass)."""
        if search is None or not isinstance(sim, SimResult) or i >= len(sim.searched):
            return 0.0
        chunk, context = rounds[i]
        return search.round(sim.searched[i], chunk - 1, context)

    # Round 0: draft prefill + its further steps, then the target's prefill over prompt + candidates.
    first_drafted = sim.first_chunk - 1
    ttft = cost.request_overhead_s + per_round + per_drafted * first_drafted + search_s(0)
    if drafter is not None and first_drafted > 0:
        ttft += drafter.prefill(prompt_len) + step
        ttft += sum(max(drafter.forward(1, prompt_len + j) + step, 0.0) for j in range(1, first_drafted))
    prefill = target.prefill(prompt_len + first_drafted)
    # The calibrated (negative) request overhead may take back at most 80% of this request's own prefill, as
    # `calibrate_overheads` bounds it for the typical one: a short prompt is never predicted to cost nothing.
    ttft = max(ttft + prefill, 0.2 * prefill)

    decode = 0.0
    if isinstance(sim, SimResult):
        for i, (chunk, context) in enumerate(rounds[1:], start=1):
            decode += verify(chunk, context) + search_s(i)
            if drafter is not None:
                decode += _draft_round(drafter, chunk - 1, context, step)
    else:
        # Expected counts: chunk sizes are known in expectation only; use the mean context.
        context = prompt_len + sim.output_tokens // 2
        for chunk, weight in sim.later_chunks.items():
            one = verify(chunk, context)
            if drafter is not None:
                one += _draft_round(drafter, chunk - 1, context, step)
            decode += weight * one
    return ttft, ttft + decode


MIN_DRAFTED_SPREAD = 0.5
"""Drafted tokens per target pass that the calibration runs must span (max - min) before a cost per drafted token
is fitted; over a narrower span the slope is noise, and one overhead per round is fitted instead."""


def calibrate_round_overhead(
    cost: CostModel, method: str, runs: Iterable[tuple[SimResult, int, Variant, float, float]]
) -> CostModel:
    """Set `round_overhead_s[method]` and `drafted_token_overhead_s[method]` from measured speculative runs:
    (sim, prompt_len, variant, measured TTFT, measured e2e). Each run gives a point from its rounds after the
    first: (drafted tokens per pass, (measured - predicted without these terms) time after the first token per
    pass); a robust line through them (Theil-Sen, the slope may be negative) gives the cost per round (intercept)
    and per drafted token (slope). The variants of one method differ in how many tokens they draft a round (the
    lookahead, the matches found), and on this CPU a round costs more with more drafted tokens than the forward
    table says (every drafted position's logits are processed in `generate`). The first token is left out: its
    time is the prefill's, whose noise, spread over the few passes of a short run on a long prompt, would swamp
    the rounds'. When the runs span less
    than `MIN_DRAFTED_SPREAD` drafted tokens a pass (one lookahead), only the round overhead is fitted: the
    median, at least 0."""
    base = _copy(cost)
    base.round_overhead_s.pop(method, None)
    base.drafted_token_overhead_s.pop(method, None)
    points = []
    for sim, prompt_len, variant, ttft, e2e in runs:
        later = sim.target_passes - 1
        if later >= 1:
            predicted_ttft, predicted = predict_request(sim, prompt_len, base, variant)
            drafted = sim.drafted - (sim.first_chunk - 1)
            points.append((drafted / later, ((e2e - ttft) - (predicted - predicted_ttft)) / later))
    if not points:
        return base
    xs = [x for x, _ in points]
    if len(points) >= 2 and max(xs) - min(xs) >= MIN_DRAFTED_SPREAD:
        intercept, slope = _theil_sen(points, min_slope=None)
        base.round_overhead_s[method] = intercept
        base.drafted_token_overhead_s[method] = slope
    else:
        base.round_overhead_s[method] = max(statistics.median(y for _, y in points), 0.0)
    return base


def ideal_speedup(acceptance: float, lookahead: int, cost_ratio: float) -> float:
    """Leviathan et al. (2023), eq. for the expected wall-time improvement of speculative decoding: with
    per-token acceptance rate a, lookahead k and draft/target cost ratio c,
    (1 - a^(k+1)) / ((1 - a)(k c + 1)). Assumes verification of k+1 tokens costs one target step, which is
    not true on a CPU (see the measured T(k)); for docs and sanity checks only."""
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    if lookahead < 1 or cost_ratio < 0:
        raise ValueError("lookahead must be >= 1 and cost_ratio >= 0")
    tokens = lookahead + 1 if acceptance == 1.0 else (1 - acceptance ** (lookahead + 1)) / (1 - acceptance)
    return tokens / (lookahead * cost_ratio + 1)
