"""Phase `confirm`: time the best predicted candidates and the baseline end to end, repeated and interleaved.

Reads `state.requests`, `state.space`, `state.engine`, `results.plan`, the predictions and the baseline pass.
The top `--confirm` predicted candidates (one per distinct behaviour) and the baseline are timed
A B C D per request and repeat, every output checked against the baseline pass's (`--strategy exhaustive`
times every variant instead). The chosen variants are fixed in `results.plan.confirm` before timing starts;
each variant's `measured_requests` is saved after every request, so a resume times only what is missing.
Fills each confirmed variant's `measured`, `per_category`, `confirmed` and `disqualified`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from runinfra_opt import stats
from runinfra_opt.methods import BASELINE, Variant, get_method
from runinfra_opt.optimize.byvariant import pairs_baseline, tie_tolerance, time_by_variant
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.plan import replan_confirmation
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState
from runinfra_opt.records import compare_to_baseline, disqualifying
from runinfra_opt.results import LevelMetrics, RunResults, VariantResult
from runinfra_opt.stats import summarize_by_category, summarize_with_intervals


def rank_predicted(results: RunResults, config: OptimizeConfig) -> list[VariantResult]:
    """Speculative variants, best predicted first (throughput: tokens/s; ttft: TTFT at the percentile, then
    tokens/s). Variants predicted to break `--max-ttft-ms` / `--max-ttft-regression` go last."""
    objective = config.objective
    baseline = results.variant(BASELINE.name)
    base_ttft = baseline.predicted.ttft_s.get(objective.percentile) if baseline and baseline.predicted else None

    def key(v: VariantResult) -> tuple[bool, tuple[float, float], tuple[int, int, str]]:
        assert v.predicted is not None
        ttft = v.predicted.ttft_s.get(objective.percentile)
        breaks = objective.broken_ttft_limit(ttft, base_ttft) is not None
        return (breaks, objective.sort_key(v.predicted.tokens_per_s, ttft), Variant.from_dict(v.variant).simplicity_key)

    ranked = [v for v in results.variants if v.name != BASELINE.name and v.predicted is not None]
    return sorted(ranked, key=key)


def _level_leaders(results: RunResults, config: OptimizeConfig, timed: Collection[str] = ()) -> list[VariantResult]:
    """The serving predictor's best speculative variant at each load level (highest predicted output tokens/s;
    for `--priority ttft` the lowest predicted TTFT at the percentile), in level order, among those not `timed`:
    the candidates that could win a level are measured before the batch-1 ranking fills the remaining slots."""
    by_level: dict[str, list[tuple[float, VariantResult]]] = {}
    for vr in results.variants:
        if vr.name == BASELINE.name or vr.name in timed:
            continue
        for predicted in vr.load_predicted:
            metrics = predicted.metrics
            tps = metrics.output_tokens_per_s.value if metrics.output_tokens_per_s else None
            score = config.objective.score(tps, metrics.ttft_s.get(config.objective.percentile))
            if score is not None:
                by_level.setdefault(predicted.level, []).append((score, vr))
    leaders = []
    for candidates in by_level.values():
        best = max(candidates, key=lambda item: (item[0], -len(item[1].name)))[1]
        if best not in leaders:
            leaders.append(best)
    return leaders


def _behaviour(vr: VariantResult) -> tuple[Any, ...]:
    """What a variant computes, per its simulation: its drafting model and every request's passes. Two
    variants with the same behaviour (e.g. prompt lookup with max match 2 and 3 finding the same candidates)
    cost the same, so timing both would waste the budget."""
    variant = Variant.from_dict(vr.variant)
    drafter = get_method(variant.method).drafter(variant)
    per_request = tuple(
        (r.request_id, r.target_passes, r.draft_passes, r.drafted_tokens, tuple(r.accepted_per_pass))
        for r in vr.predicted_requests
    )
    return (variant.method, drafter.role if drafter else None, per_request)


def _ranked(state: RunState, taken: Sequence[Variant] = ()) -> list[Variant]:
    """The predicted candidates, best first (each load level's predicted leader, then the batch-1 ranking), one
    per behaviour (`_behaviour`); the `taken` variants, and any that behaves as one of them, left out."""
    by_name = {v.name: v for v in state.space}
    seen = {_behaviour(vr) for vr in (state.variant_result(v) for v in taken) if vr.predicted is not None}
    ranked = []
    leaders = _level_leaders(state.results, state.config, {v.name for v in taken})
    for vr in leaders + rank_predicted(state.results, state.config):
        behaviour = _behaviour(vr)
        if behaviour in seen:
            continue  # the same passes as a better-ranked (or equally ranked, simpler) candidate, or a timed one
        seen.add(behaviour)
        ranked.append(by_name[vr.name])
    return ranked


REACH = {"batch 1": 0.10, "load level": 0.15}
"""How far below the best measured figure a candidate's prediction may be and still be timed (one-at-a-time
confirmation): the serving predictor's accuracy targets, |predicted/measured - 1| <= 10% at batch 1 and 15% under
load. A candidate predicted further behind everywhere cannot be expected to win, and its server is not launched."""


def _confirm_sequentially(state: RunState, variants: list[Variant]) -> list[Variant]:
    """Time the candidates one server at a time, in the first ranking's order, deciding before each launch whether
    it is still worth one: the serving predictor is re-fitted on what has been measured (the confirmed baseline's
    repeats and levels, the speculative step terms of the timed candidates, which the first ranking could not
    have: the predictor's `predict(after_confirm=True)`), and the next candidate is the first untimed one of the ranking
    whose re-fitted prediction is within `REACH` of the best measured figure at batch 1 or at some load level.
    Stops after `plan.confirm_slots` candidates or when none is in reach (`plan.confirm_stopped`, and a note).
    The order stays the first ranking's: terms fitted on one or two timed variants re-rank no better
    (`benchmarks/confirm_replay.py`, summary `benchmarks/results/confirm_replay.json`). A resume (whose
    predictions are the first ranking's again until re-fitted) times what is missing of `plan.confirm` and goes on
    choosing."""
    plan, predictor = state.plan, state.predictor
    assert plan.confirm_slots is not None
    assert predictor is not None  # slots are given to the serving predictor's candidates only
    order = _ranked(state)  # before any re-fit: the first ranking
    while True:
        time_by_variant(state, variants, repredict=capacity_repredict(state))
        summarize_measured(state, variants)
        if sum(1 for v in variants if v.is_speculative and predictor.predicts(state, v)) >= plan.confirm_slots:
            return variants
        predictor.predict(state, after_confirm=True, interim=True)
        candidate, behind = None, []
        untimed = {v.name for v in _ranked(state, variants)}  # not timed, nor behaving as a timed one
        for v in (v for v in order if v.name in untimed):
            standing = _standing(state, v, variants)
            if standing is None or any(ratio >= 1 - REACH[kind] for kind, ratio in standing.values()):
                candidate = v
                break
            behind.append(f"{v.name} {max(ratio for _, ratio in standing.values()):.2f}x")
        if candidate is None:
            if behind:
                plan.confirm_stopped = (
                    f"confirmation stopped after {len(variants) - 1} candidate(s) of {plan.confirm_slots}: no other "
                    f"variant is predicted within {REACH['batch 1']:.0%} of the best measured figure at batch 1 or "
                    f"{REACH['load level']:.0%} at a load level (best predicted over best measured: "
                    f"{', '.join(behind[:3])})"
                )
                state.results.add_note(plan.confirm_stopped)
            state.save()
            return variants
        variants.append(candidate)
        assert plan.confirm is not None
        plan.confirm.append(candidate.name)
        state.save()


def _standing(state: RunState, variant: Variant, timed: list[Variant]) -> dict[str, tuple[str, float]] | None:
    """Where `variant`'s prediction stands against the best measured figure among the `timed` variants, at batch
    1 and at each load level: predicted / best measured tokens/s (`--priority ttft`: best measured TTFT /
    predicted TTFT at the percentile), >= 1 when predicted to beat it. None when nothing can be compared."""
    objective = state.config.objective

    def score(tps: float | None, ttft: dict[str, float] | None) -> float | None:
        return objective.rate(tps, (ttft or {}).get(objective.percentile))

    def at_level(metrics: LevelMetrics) -> float | None:
        return score(metrics.output_tokens_per_s.value if metrics.output_tokens_per_s else None, metrics.ttft_s)

    vr = state.variant_result(variant)
    mine = {p.level: at_level(p.metrics) for p in vr.load_predicted}
    if vr.predicted is not None:
        mine["batch 1"] = score(vr.predicted.tokens_per_s, vr.predicted.ttft_s)
    best: dict[str, float] = {}
    base_rows = state.variant_result(BASELINE).measured_requests
    for other in (state.variant_result(v) for v in timed):
        if other.disqualified or other.failed:
            continue
        scores = [(lr.level, at_level(lr.metrics)) for lr in other.load]
        if other.measured is not None:
            # at the baseline's speed, as the predictions are calibrated (a candidate timed beside the baseline:
            # its paired ratio to it, `stats.comparable_tokens_per_s`)
            if other.name == BASELINE.name:
                tps = stats.tokens_per_s(stats.own_repeats(base_rows))
            else:
                tps = stats.comparable_tokens_per_s(other.measured_requests, base_rows)
            scores.append(("batch 1", score(tps, other.measured.ttft_s)))
        for place, value in scores:
            if value is not None:
                best[place] = max(best.get(place, value), value)
    out = {
        place: ("batch 1" if place == "batch 1" else "load level", value / best[place])
        for place, value in mine.items()
        if value is not None and place in best
    }
    return out or None


def capacity_repredict(state: RunState) -> Callable[[], None] | None:
    """What a capacity search calls once its server has warmed up: the run's predictor's capacity predictions."""
    predictor = state.predictor
    return (lambda: predictor.predict_capacity(state)) if predictor is not None else None


def _confirm_variants(state: RunState) -> list[Variant]:
    """Baseline + the candidates to time (stored in the plan so a resume times the same ones)."""
    plan = state.plan
    by_name = {v.name: v for v in state.space}
    if plan.confirm is not None:
        return [by_name[name] for name in plan.confirm]
    config = state.config
    serving = state.results.cost_model.serving is not None  # the serving predictor ran (`optimize.serving`)
    unpredicted = [v for v in state.space if v.is_speculative and state.variant_result(v).predicted is None]
    if config.strategy == "exhaustive" or (unpredicted and not serving):
        chosen = [v for v in state.space if v.is_speculative]
        repeats = plan.repeats
    else:
        ranked = _ranked(state)[: config.confirm]
        if serving:
            ranked += unpredicted  # drafts the serving predictor cannot simulate are timed, not dropped
        base = state.baseline_records()
        baseline_s = sum(base[r.id].e2e_s for r in state.requests if r.id in base)
        candidate_s = []
        beside = baseline_s if pairs_baseline(state) else 0.0  # each candidate's pass comes with a baseline's
        for v in ranked:
            vr = state.variant_result(v)
            candidate_s.append(sum(r.e2e_s for r in vr.predicted_requests) + beside)
        warm = baseline_s / max(len(state.requests), 1) * WARMUP_TOKENS / max(state.max_tokens, 1)
        planned_repeats = plan.repeats
        repeats, count = replan_confirmation(
            remaining_s=state.budget_left(),
            baseline_s=baseline_s,
            candidate_s=candidate_s,
            repeats=planned_repeats,
            warmup_s=warm,
        )
        if config.repeats is not None:
            repeats = config.repeats  # an explicit --repeats is kept even over budget
        if (repeats, count) != (planned_repeats, len(ranked)):
            state.results.add_note(
                f"confirmation reduced to fit the budget: {count} candidate(s) x {repeats} repeat(s) "
                f"(planned {len(ranked)} x {planned_repeats})"
            )
        chosen = ranked[:count]
        if serving and config.executor != "ray" and not getattr(state.engine, "interleaves", True):
            # One server at a time anyway: choose the predicted candidates one by one (`_confirm_sequentially`).
            predicted = [v for v in chosen if v not in unpredicted]
            plan.confirm_slots = len(predicted)
            chosen = predicted[:1] + [v for v in chosen if v in unpredicted]
    plan.confirm = [BASELINE.name] + [v.name for v in chosen]
    plan.repeats = repeats
    state.save()
    return [BASELINE, *chosen]


def run(state: RunState) -> None:
    assert state.engine is not None
    results = state.results
    variants = _confirm_variants(state)
    if state.config.executor == "ray":
        from runinfra_opt.optimize.executors.ray_cluster import time_trials

        time_trials(state, variants)  # one trial per variant, each with its own baseline repeats on its node
    elif state.plan.confirm_slots is not None:
        variants = _confirm_sequentially(state, variants)
    elif not getattr(state.engine, "interleaves", True):
        time_by_variant(state, variants, repredict=capacity_repredict(state))
    else:
        _time_locally(state, variants)
    summarize_measured(state, variants)
    for trial in results.trials:
        if trial.status == "failed":
            note = f"trial {trial.id} failed after {trial.attempts} attempt(s): {trial.error}"
            results.add_note(note, kind="left_out")


def summarize_measured(state: RunState, variants: list[Variant]) -> None:
    """Each timed variant's summaries (against the baseline's repeats), confirmed flag and disqualification."""
    results = state.results
    baseline_rows = state.variant_result(BASELINE).measured_requests
    for variant in variants:
        vr = state.variant_result(variant)
        if not vr.measured_requests or vr.failed:
            continue  # its trial failed (the reason is in results.trials or `failed`, and in the notes)
        vr.confirmed = True
        others = baseline_rows if variant.is_speculative else None
        vr.measured = summarize_with_intervals(vr.measured_requests, others)
        vr.per_category = summarize_by_category(vr.measured_requests, others)
        mismatched = sorted({r.request_id for r in vr.measured_requests if disqualifying(r)})
        ties = sorted(
            {f"{r.request_id} at token {r.first_mismatch}" for r in vr.measured_requests if r.near_tie},
        )
        if ties and variant.is_speculative:
            results.add_note(
                f"{variant.name}: output differs from the baseline's at a numerical near-tie (the baseline's top "
                f"two candidates within --tie-tolerance {tie_tolerance(state):g} nats) on "
                f"{', '.join(ties)}; not disqualified"
            )
        if mismatched and variant.is_speculative:
            vr.disqualified = f"greedy output differs from the baseline's on request(s) {', '.join(mismatched)}"
        elif mismatched:
            results.add_note(
                "the baseline's own output changed between runs on request(s) "
                f"{', '.join(mismatched)} (non-deterministic decoding on this device)"
            )


def _time_locally(state: RunState, variants: list[Variant]) -> None:
    """Every variant and the baseline in this process, A B C D per request and repeat."""
    assert state.engine is not None
    engine = state.engine
    repeats = state.plan.repeats
    reference = state.baseline_records()
    done = {
        (vr.name, r.request_id, r.repeat)
        for vr in (state.variant_result(v) for v in variants)
        for r in vr.measured_requests
    }
    total = len(variants) * len(state.requests) * repeats
    state.reporter.phase("confirm", total, f"confirming {len(variants) - 1} candidate(s) x {repeats} repeat(s)")
    for _ in range(len(done)):
        state.reporter.advance()
    if len(done) < total:
        for variant in variants:  # untimed warm-up per variant (first-call costs stay out of the figures)
            engine.warmup(state.requests[0], variant, max_tokens=WARMUP_TOKENS)
    for repeat in range(repeats):
        for request in state.requests:
            changed = False
            for variant in variants:  # A B C D per request and repeat: drift hits every variant alike
                if (variant.name, request.id, repeat) in done:
                    continue
                record = engine.generate(request, variant, max_tokens=state.max_tokens, repeat=repeat)
                if request.id in reference:
                    compare_to_baseline(record, reference[request.id], tie_tolerance=tie_tolerance(state))
                state.variant_result(variant).measured_requests.append(record)
                changed = True
                state.reporter.advance(f"{request.id} {variant.name}")
            if changed:
                state.save()  # after each request's batch of variants
    state.reporter.end_phase()
