"""Phase `schedule`: a batch-size -> lookahead schedule, measured as a variant of its own before it may be written.

Under load, when the choice rule (`optimize.kschedule`) picks different lookaheads at different concurrencies for
one family, the schedule built from those choices is timed and served like any variant, and written (allowed to
win a level) only if it measures better than every fixed lookahead of its family at the levels it covers: never
on the strength of its parts (vLLM issue #49548). The proposal is fixed in `results.load.schedule` before
anything is timed, so a resume measures the same one."""

from __future__ import annotations

from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize import kschedule, underload
from runinfra_opt.optimize.byvariant import time_by_variant
from runinfra_opt.optimize.phases.confirm import capacity_repredict, summarize_measured
from runinfra_opt.optimize.state import RunState


def run(state: RunState) -> None:
    results = state.results
    if not underload.levels_of(state) or results.load is None:
        return
    if results.load.schedule is None:
        proposed = kschedule.propose(results)
        if proposed is None:
            return
        variant, schedule = proposed
        results.load.schedule = schedule
        vr = state.variant_result(variant)
        vr.variant = variant.to_dict()
        if variant.name not in results.space:
            results.space.append(variant.name)
        state.save()
    schedule = results.load.schedule
    found = results.variant(schedule.variant)
    assert found is not None
    variant = Variant.from_dict(found.variant)
    if variant not in state.space:
        state.space.append(variant)
    # the baseline is measured already: no launch for it
    time_by_variant(state, [BASELINE, variant], repredict=capacity_repredict(state))
    summarize_measured(state, [variant])
    results.load.schedule = kschedule.verify(results, schedule)
    if not results.load.schedule.written:
        reason = results.load.schedule.reason.removeprefix("not written: ")
        results.add_note(f"k schedule {schedule.variant} not written: {reason}")
    state.save()
