"""Phase `extend`: with `--repeats auto` (the default), confirm until the answer is clear.

Reads the confirmed variants' measured records, `results.plan`, the baseline pass and `config.objective`. Runs
after `confirm`; an explicit `--repeats N` skips it (fixed repeats). Repeats are added only on the local executor
with an engine that interleaves variants (the transformers engine); elsewhere (`--executor ray`, the vLLM engine's
server per variant) the certainty is recorded with why none was added.

1. **Drift.** The baseline's tokens/s in the baseline pass and in every confirmation repeat should agree; when
   their relative median absolute deviation exceeds `SPREAD_LIMIT` (10%, the rejection limit of vLLM's K
   tuner), the repeat farthest from the median is timed again, every confirmed variant with
   it (they were interleaved, so the drift hit them all), once per run; a note says so either way.
2. **Stopping rule.** The leading lossless candidate (the fastest by measured tokens/s; `--priority ttft`: the
   lowest TTFT) is compared with the baseline and with the runner-up by paired bootstrap intervals. The answer is
   unclear when the interval against the baseline straddles the decision threshold (`Objective.threshold`), or
   the interval against a runner-up that could still pay straddles 1.0 without lying within +-`EQUIVALENT` (2%:
   then either choice is as good). While it is unclear, fewer than `MAX_ADDED_REPEATS` repeats were added and one
   more repeat of the baseline, the leader (and the runner-up when that comparison is unclear) fits the time
   left, that repeat is added, interleaved A B C per request.

Every added or re-measured repeat is fixed in `results.plan` (`added`, `remeasured`) and saved before it is timed,
and every record as it is measured, so a resume times only what is missing. Fills `results.certainty` (how sure
the decision is) and refreshes the confirmed variants' measured summaries.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from runinfra_opt import stats
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.objective import THROUGHPUT, TTFT, rank
from runinfra_opt.optimize.decision.eligibility import lossless
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState
from runinfra_opt.records import RequestRecord, compare_to_baseline, disqualifying
from runinfra_opt.results import AddedRepeat, Certainty, Interval, VariantResult

SPREAD_LIMIT = 0.10
"""Relative MAD of the baseline's tokens/s over its repeats above which a repeat is re-measured once."""
MAX_ADDED_REPEATS = 3
EQUIVALENT = 0.02
"""A leader whose interval against the runner-up lies within 1 +- this is as good as it: the order is clear
enough (the tie rule then picks the simpler one)."""


def _why_no_repeats(state: RunState) -> str | None:
    """Why this run cannot add repeats (None: it can)."""
    assert state.engine is not None
    if state.config.executor != "local":
        return f"under --executor {state.config.executor} each trial times its own baseline repeats on its node"
    if not getattr(state.engine, "interleaves", True):
        return (
            f"the {state.engine.name} engine times variant by variant (a server each), so a repeat could not be "
            "interleaved"
        )
    return None


def run(state: RunState) -> None:
    config, results = state.config, state.results
    if config.repeats is not None:
        return  # an explicit --repeats N: the planned repeats only
    if not state.variant_result(BASELINE).measured_requests:
        return
    why_not = _why_no_repeats(state)
    if why_not is not None:
        certainty, _ = assess(state)
        certainty.summary += f" No repeats added: {why_not}."
        results.certainty = certainty
        state.save()
        return
    warmed: set[str] = set()
    _fill(state, warmed)
    if not state.plan.drift_checked:
        _check_drift(state, warmed)
    while True:
        certainty, extend = assess(state)
        if certainty.clear or not extend:
            break
        if len(state.plan.added) >= MAX_ADDED_REPEATS:
            certainty.summary += f" Stopped after {MAX_ADDED_REPEATS} added repeats (the limit)."
            break
        cost_s = sum(_seconds_per_repeat(state.variant_result(v)) for v in extend)
        if cost_s > state.budget_left():
            certainty.summary += (
                f" One more repeat ({cost_s:.0f} s) does not fit the {max(state.budget_left(), 0):.0f} s left."
            )
            break
        repeat = _next_repeat(state)
        state.plan.added.append(
            AddedRepeat(repeat=repeat, variants=[v.name for v in extend], why=certainty.summary)
        )
        state.save()
        _fill(state, warmed)
    _refresh(state)
    results.certainty = certainty
    state.save()


def _confirmed(state: RunState) -> list[Variant]:
    by_name = {v.name: v for v in state.space}
    return [by_name[name] for name in state.plan.confirm or [] if name in by_name]


def _next_repeat(state: RunState) -> int:
    used = [state.plan.repeats - 1] + [a.repeat for a in state.plan.added]
    used += [r.repeat for r in state.variant_result(BASELINE).measured_requests]
    return max(used) + 1


def _seconds_per_repeat(vr: VariantResult) -> float:
    repeats = {r.repeat for r in vr.measured_requests}
    return sum(r.e2e_s for r in vr.measured_requests) / max(len(repeats), 1)


def _wanted(state: RunState) -> list[tuple[int, list[Variant]]]:
    """(repeat, variants) for every re-measured and added repeat (what this phase must have timed)."""
    by_name = {v.name: v for v in state.space}
    confirmed = _confirmed(state)
    out = [(repeat, confirmed) for repeat in state.plan.remeasured]
    out += [(a.repeat, [by_name[n] for n in a.variants if n in by_name]) for a in state.plan.added]
    return out


def _fill(state: RunState, warmed: set[str]) -> None:
    """Time every (variant, request, repeat) of `_wanted` not measured yet, A B C per request, saving after each
    request's batch of variants."""
    assert state.engine is not None
    engine = state.engine
    reference = state.baseline_records()
    todo = []
    for repeat, variants in _wanted(state):
        for request in state.requests:
            batch = []
            for variant in variants:
                done = {(r.request_id, r.repeat) for r in state.variant_result(variant).measured_requests}
                if (request.id, repeat) not in done:
                    batch.append(variant)
            if batch:
                todo.append((repeat, request, batch))
    if not todo:
        return
    state.reporter.phase("extend", sum(len(b) for _, _, b in todo), "confirming until the answer is clear")
    for _, _, batch in todo:
        for variant in batch:
            if variant.name not in warmed:
                engine.warmup(state.requests[0], variant, max_tokens=WARMUP_TOKENS)
                warmed.add(variant.name)
    for repeat, request, batch in todo:
        for variant in batch:
            record = engine.generate(request, variant, max_tokens=state.max_tokens, repeat=repeat)
            if request.id in reference:
                compare_to_baseline(record, reference[request.id], tie_tolerance=state.config.tie_tolerance)
            state.variant_result(variant).measured_requests.append(record)
            state.reporter.advance(f"{request.id} {variant.name} (repeat {repeat + 1})")
        state.save()
    state.reporter.end_phase()


def baseline_spread(state: RunState) -> tuple[float | None, dict[int, float], float | None]:
    """(relative MAD, the baseline's tokens/s per complete confirmation repeat, in the baseline pass) over the
    planned requests."""
    wanted = {r.id for r in state.requests}
    rows = state.variant_result(BASELINE).measured_requests
    per_repeat: dict[int, float] = {}
    for repeat in sorted({r.repeat for r in rows}):
        mine = [r for r in rows if r.repeat == repeat and r.request_id in wanted]
        if {r.request_id for r in mine} == wanted:
            per_repeat[repeat] = stats.tokens_per_s(mine)
    passed = [r for r in state.baseline_records().values() if r.request_id in wanted]
    reference = stats.tokens_per_s(passed) if passed else None
    values = list(per_repeat.values()) + ([reference] if reference else [])
    return (stats.relative_mad(values) if len(values) >= 2 else None), per_repeat, reference


def _check_drift(state: RunState, warmed: set[str]) -> None:
    results, plan = state.results, state.plan
    spread, per_repeat, reference = baseline_spread(state)
    plan.drift_checked = True
    if spread is None or spread <= SPREAD_LIMIT or not per_repeat:
        state.save()
        return
    values = list(per_repeat.values()) + ([reference] if reference else [])
    middle = statistics.median(values)
    worst = max(per_repeat, key=lambda r: abs(per_repeat[r] - middle))
    shown = ", ".join(f"repeat {r + 1} {v:.1f}" for r, v in per_repeat.items())
    if reference:
        shown = f"baseline pass {reference:.1f}, " + shown
    plan.remeasured.append(worst)
    for variant in _confirmed(state):
        vr = state.variant_result(variant)
        vr.measured_requests = [r for r in vr.measured_requests if r.repeat != worst]
    state.save()  # the intent and the removal together: a resume times the repeat again
    _fill(state, warmed)
    after, per_repeat_after, _ = baseline_spread(state)
    again = per_repeat_after.get(worst)
    results.add_note(
        f"the baseline drifted over the confirmation (relative MAD {spread:.0%} > {SPREAD_LIMIT:.0%}; tokens/s: "
        f"{shown}): repeat {worst + 1} was rejected and measured again"
        + (f" ({again:.1f} tokens/s; relative MAD now {after:.0%})" if again is not None and after is not None else "")
        + ("; still above the limit, so the intervals are wider than usual" if after and after > SPREAD_LIMIT else "")
    )


def _straddles(interval: Interval | None, threshold: float) -> bool:
    return interval is not None and interval.low <= threshold <= interval.high


def _text(interval: Interval | None) -> str:
    return "not paired" if interval is None else f"{interval.value:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"


def _lead_with_the_tie_winner(state: RunState, pool: list[VariantResult]) -> None:
    """Put first (in place) the variant the batch-1 decision picks from `pool`, sorted by tokens/s (the first of the
    shared ranking, `objective.rank`): the certainty is then about the variant the decision names, not a faster
    one within the tie, and the runner-up is the next fastest other."""
    from runinfra_opt.optimize.decision.rule import simplicity_key

    chosen = rank(
        pool,
        lambda vr: stats.tokens_per_s(vr.measured_requests),
        lambda vr: simplicity_key(state.results, Variant.from_dict(vr.variant)),
    )[0]
    pool.remove(chosen)
    pool.insert(0, chosen)


def assess(state: RunState) -> tuple[Certainty, list[Variant]]:
    """How sure the decision is now, and the variants one more repeat should time (empty: nothing to add)."""
    config = state.config
    base = state.variant_result(BASELINE).measured_requests
    spread = baseline_spread(state)[0]
    added = len(state.plan.added)
    pool = [
        vr
        for vr in (state.variant_result(v) for v in _confirmed(state))
        if Variant.from_dict(vr.variant).is_speculative and vr.measured_requests and lossless(vr)
    ]
    if not pool or not base:
        return Certainty(clear=True, summary="no lossless speculative candidate was measured.", added_repeats=added,
                         baseline_spread=spread), []  # fmt: skip
    objective = config.objective
    higher_is_better = objective.measure.higher_is_better

    def compare(records: Sequence[RequestRecord], other: Sequence[RequestRecord]) -> Interval | None:
        return objective.ratio(records, other, seed=config.seed)

    threshold = objective.threshold
    if higher_is_better:
        pool.sort(key=lambda vr: -stats.tokens_per_s(vr.measured_requests))
        _lead_with_the_tie_winner(state, pool)
    else:
        pool.sort(key=lambda vr: stats.ttft_at(vr.measured_requests, objective.percentile))
    leader = pool[0]
    vs_base = compare(leader.measured_requests, base)
    runner = pool[1] if len(pool) > 1 else None
    vs_runner = compare(leader.measured_requests, runner.measured_requests) if runner else None
    runner_may_pay = False
    if runner is not None:
        runner_vs_base = compare(runner.measured_requests, base)
        if runner_vs_base is not None:
            runner_may_pay = runner_vs_base.high >= threshold if higher_is_better else runner_vs_base.low <= threshold
    base_unclear = _straddles(vs_base, threshold)
    equivalent = vs_runner is not None and vs_runner.low >= 1 - EQUIVALENT and vs_runner.high <= 1 + EQUIVALENT
    runner_unclear = runner_may_pay and _straddles(vs_runner, 1.0) and not equivalent
    measure = f"{(TTFT if objective.on_ttft else THROUGHPUT).words} at batch 1"  # what `objective.ratio` judged
    if vs_base is None:
        where = "cannot be judged against"
    elif base_unclear:
        where = "straddles"
    else:
        where = "lies above" if vs_base.low > threshold else "lies below"
    parts = [f"{leader.name} vs the baseline ({measure}) {_text(vs_base)} {where} the {threshold:.2f} threshold"]
    if runner is not None:
        verdict = (
            "straddles 1.00"
            if runner_unclear
            else "is within 2% either way"
            if equivalent
            else "does not matter (the runner-up cannot pay)"
            if not runner_may_pay
            else "excludes 1.00"
        )
        parts.append(f"vs the runner-up {runner.name} {_text(vs_runner)} {verdict}")
    clear = not base_unclear and not runner_unclear
    summary = ("clear" if clear else "unclear") + ": " + "; ".join(parts)
    summary += f" (after {added} added repeat{'s' if added != 1 else ''})." if added else "."
    certainty = Certainty(
        clear=clear,
        summary=summary,
        leader=leader.name,
        runner_up=runner.name if runner else None,
        vs_baseline=vs_base,
        vs_runner_up=vs_runner,
        threshold=threshold,
        added_repeats=added,
        baseline_spread=spread,
    )
    by_name = {v.name: v for v in state.space}
    extend = [BASELINE, by_name[leader.name]] + ([by_name[runner.name]] if runner and runner_unclear else [])
    return certainty, ([] if clear else extend)


def _refresh(state: RunState) -> None:
    """The confirmed variants' measured summaries again, over every record (added and re-measured ones too)."""
    baseline_rows = state.variant_result(BASELINE).measured_requests
    for variant in _confirmed(state):
        vr = state.variant_result(variant)
        if not vr.measured_requests:
            continue
        others = baseline_rows if variant.is_speculative else None
        vr.measured = stats.summarize_with_intervals(vr.measured_requests, others)
        vr.per_category = stats.summarize_by_category(vr.measured_requests, others)
        mismatched = sorted({r.request_id for r in vr.measured_requests if disqualifying(r)})
        if mismatched and variant.is_speculative:
            vr.disqualified = f"greedy output differs from the baseline's on request(s) {', '.join(mismatched)}"
