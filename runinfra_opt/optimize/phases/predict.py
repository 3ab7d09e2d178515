"""Phases `predict` and `repredict`: every variant's TTFT and end-to-end time per request, simulated.

Reads `state.requests`, `state.space`, `state.engine`, `state.cost`, the baseline pass and the profile. The
simulator replays each variant's passes per request from the profiling pass; the cost model turns passes into
time. `predict` (before confirmation) fits the generate loop's overheads to the profiling pass's baseline
(these predictions rank the candidates); `repredict` (after it) fits them to the confirmation's baseline
repeats, timed interleaved with the candidates, so that predicted and measured figures come from the same
stretch of time. Fills each variant's `predicted_requests` and `predicted`, and
`results.cost_model.in_process`'s `calibrated` / `calibrated_after_confirm`. Cheap: both run again on resume. Both
phases ask the run's predictor (`optimize.predictor`): this module is the in-process one's (`predict`), the
serving predictor's is `optimize.serving.predict`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize.simulate import simulate
from runinfra_opt.optimize.state import RunState
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import FittedCosts
from runinfra_opt.stats import summarize_with_intervals
from runinfra_opt.workload.model import Request

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods.simulation import ExpectedSimResult, SimResult
    from runinfra_opt.predict.costmodel import CostModel


def run(state: RunState) -> None:
    assert state.predictor is not None  # the pipeline skips the phase without one
    state.predictor.predict(state)


def run_after_confirm(state: RunState) -> None:
    assert state.predictor is not None
    state.predictor.predict(state, after_confirm=True)


def _predicted_result(
    request: Request, sim: SimResult | ExpectedSimResult, prompt_len: int, ttft: float, e2e: float
) -> RequestRecord:
    from runinfra_opt.methods.simulation import SimResult

    n = int(sim.output_tokens)
    if isinstance(sim, SimResult):
        target, draft, drafted = sim.target_passes, sim.draft_passes, sim.drafted
        accepted, per_pass = sim.accepted, list(sim.accepted_per_pass)
    else:
        target, draft, drafted = round(sim.target_passes), round(sim.draft_passes), round(sim.drafted)
        accepted, per_pass = round(sim.accepted), []
    return RequestRecord(
        request_id=request.id,
        category=request.category,
        greedy=request.greedy,
        prompt_tokens=prompt_len,
        output_tokens=n,
        ttft_s=ttft,
        e2e_s=e2e,
        tpot_s=(e2e - ttft) / (n - 1) if n > 1 else None,
        target_passes=target,
        draft_passes=draft,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        accepted_per_pass=per_pass,
    )


def predict(state: RunState, *, after_confirm: bool = False) -> None:
    """Predict every variant per request. Before confirmation the overheads are fitted to the profiling
    pass's baseline (these predictions rank the candidates); after it, to the confirmation's baseline
    repeats, timed interleaved with the candidates, so that predicted and measured figures come from the same
    stretch of time (a burst of load during the single profiling pass does not skew the comparison). No
    speculative measurement of the confirmation enters either fit."""
    from runinfra_opt.predict.batch1 import predict_request

    assert state.engine is not None
    results = state.results
    recorded = results.cost_model.in_process
    assert recorded is not None  # phase `cost` measured it (or `restore` read it)
    if after_confirm:
        confirmed_baseline = state.variant_result(BASELINE).measured_requests
        if not confirmed_baseline:
            return
        results.profile["ranking_predicted_tokens_per_s"] = {
            v.name: v.predicted.tokens_per_s for v in results.variants if v.predicted is not None
        }
        cost = _fit_overheads(state, confirmed_baseline)
        recorded.calibrated_after_confirm = FittedCosts.model_validate(cost.to_dict())
    else:
        cost = _fit_overheads(state, list(state.baseline_records().values()))
        recorded.calibrated = FittedCosts.model_validate(cost.to_dict())
    predicted: dict[str, list[RequestRecord]] = {}
    for variant in state.space:
        rows = []
        for request in state.requests:
            sim = simulate(state, variant, request)
            if sim is None:
                continue
            prompt_len = len(state.engine.prompts.prompt_ids(request))
            ttft, e2e = predict_request(sim, prompt_len, cost, variant)
            rows.append(_predicted_result(request, sim, prompt_len, ttft, e2e))
        predicted[variant.name] = rows
    base_rows = predicted.get(BASELINE.name, [])
    for variant in state.space:
        vr = state.variant_result(variant)
        vr.predicted_requests = predicted[variant.name]
        if vr.predicted_requests:
            others = base_rows if variant.is_speculative else None
            vr.predicted = summarize_with_intervals(vr.predicted_requests, others)


def _fit_overheads(state: RunState, baseline: Sequence[RequestRecord]) -> CostModel:
    """The measured cost model with generate-loop overheads fitted to `baseline` (measured baseline requests)
    and the per-round overheads to the calibration runs. `state.cost` itself stays the raw measured model."""
    from runinfra_opt.methods.simulation import SimResult
    from runinfra_opt.predict.batch1 import Observation, calibrate_overheads, calibrate_round_overhead

    assert state.cost is not None
    base = state.baseline_records()
    observations = [
        Observation(r.prompt_tokens, r.output_tokens, r.ttft_s, r.e2e_s) for r in baseline if r.output_tokens
    ]
    cost = calibrate_overheads(state.cost, observations) if observations else state.cost
    by_name = {v.name: v for v in state.space}
    runs: dict[str, list[tuple[SimResult, int, Variant, float, float]]] = {}
    requests = state.request_by_id()
    repeats: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in state.results.profile.get("calibration", []):
        repeats.setdefault((item["variant"], item["request_id"]), []).append(item)
    for (name, request_id), items in repeats.items():
        variant, request = by_name.get(name), requests.get(request_id)
        if variant is None or request is None or request.id not in base:
            continue
        sim = simulate(state, variant, request, max_tokens=items[0].get("max_tokens"))
        if isinstance(sim, SimResult):  # the median run: first token, and the time after it
            ttft = statistics.median(float(i["ttft_s"]) for i in items)
            after = statistics.median(float(i["e2e_s"]) - float(i["ttft_s"]) for i in items)
            prompt_len = int(items[0]["prompt_tokens"])
            runs.setdefault(variant.method, []).append((sim, prompt_len, variant, ttft, ttft + after))
    for method, method_runs in runs.items():
        cost = calibrate_round_overhead(cost, method, method_runs)
    return cost
