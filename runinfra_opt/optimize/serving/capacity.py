"""The serving predictor's capacity predictions, beside its batch-1 and load-level ones (`serving.levels`, which calls
`predict_capacities` with the same passes, table, corrections and speculative terms): every predictable variant's
highest sustained rate, by bisection over offered rates on the modelled scheduler (`predict.serving.predict_run`),
judged on the predicted records exactly as a measured run is judged (`optimize.capacity.judge`). Called from the
phases `predict` and `repredict`, before any search, and again after each search's warm-up
(`optimize.predictor.Serving.predict_capacity`); once searches have warmed their servers up, the steps are priced by
batch size from the baseline's warm-up (`_warmup_corrections`) and the speculative terms from the launched variants'
(`_warmup_overheads`). The searches themselves are `optimize.capacity`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from runinfra_opt.load import capacity as search_rules
from runinfra_opt.load.cycle import cycle, original_id
from runinfra_opt.methods import BASELINE
from runinfra_opt.optimize import capacity
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import CapacityCorrections, CapacitySpecOverheads, SpecTerms, VariantCapacity

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.predict.draftcost import DraftCost
    from runinfra_opt.predict.overhead import SpecOverhead
    from runinfra_opt.predict.serving import Corrections, RequestPasses
    from runinfra_opt.predict.steptable import StepCostTable

PREDICT_TOLERANCE = 0.02
"""The predicted capacity is bisected until its bracket is within 2%."""


def _level_passes(state: RunState, items: list[RequestPasses]) -> list[RequestPasses]:
    """The predictor's requests for one offered rate, cycled as `capacity.level_requests` cycles the planned ones."""
    by_id = {item.request.id: item for item in items}
    requests = cycle([item.request for item in items], capacity.requests_per_rate(state))
    return [dataclasses.replace(by_id[original_id(r)], request=r) for r in requests]


def _predicted_verdict(
    state: RunState, rate: float, passes: list[RequestPasses], table: StepCostTable,
    corrections: Corrections | None, overhead: SpecOverhead, draft: DraftCost | None = None,
) -> bool:  # fmt: skip
    from runinfra_opt.predict.serving import Corrections, predict_run

    level, items = capacity.offered(state, rate), _level_passes(state, passes)
    run = predict_run(level, items, table, corrections=corrections or Corrections(), overhead=overhead, draft=draft)
    return capacity.judge(state, run, rate).passed


def predict_capacities(
    state: RunState,
    passes: dict[str, list[RequestPasses]],
    table: StepCostTable,
    corrections: Corrections | None,
    overheads: dict[str, SpecOverhead],
    drafts: dict[str, DraftCost] | None = None,
) -> None:
    """Every predictable variant's predicted capacity into `capacity.predicted` (when capacity may decide); `drafts`:
    the draft-model variants' proposers (`optimize.serving.draft_cost`). Once the baseline's server has warmed up
    for its search, every variant (the baseline included) is predicted with its steps' cost by batch size read off
    that warm-up (`_warmup_corrections`); before, with the batch-1 `corrections`."""
    from runinfra_opt.predict.overhead import NONE as NO_OVERHEAD

    if not capacity.may_decide(state):
        return
    fitted = _warmup_corrections(state, table, corrections) or corrections
    under_load = _warmup_overheads(state, passes, table, fitted, drafts or {}) if fitted is not None else {}
    for name, items in passes.items():
        if not items:
            continue
        vr = state.results.variant(name)
        if vr is None:
            continue
        mean_e2e = sum(r.e2e_s for r in vr.predicted_requests) / max(len(vr.predicted_requests), 1)
        start = 1.0 / mean_e2e if mean_e2e > 0 else 1.0
        overhead = under_load.get(name) or overheads.get(name, NO_OVERHEAD)
        draft = (drafts or {}).get(name)

        def sustained(
            rate: float,
            items: list[RequestPasses] = items,
            overhead: SpecOverhead = overhead,
            draft: DraftCost | None = draft,
        ) -> bool:
            return _predicted_verdict(state, rate, items, table, fitted, overhead, draft)

        vc = vr.capacity or VariantCapacity()
        floor, top = search_rules.floor(capacity.baseline_e2e(state)), capacity.ceiling(state)
        vc.predicted = _bisect(sustained, min(max(start, floor), top), top, floor)
        vr.capacity = vc


def _warmup_corrections(state: RunState, table: StepCostTable, batch1: Corrections | None) -> Corrections | None:
    """The batch-1 `corrections` with the step's by batch size (`predict.figures.batch_residuals`) read off the
    baseline's warm-up, from the batch-1 step correction at one sequence: the table is measured up to a few
    sequences at one context length, the searched rates step many more at the requests' own. None before the
    warm-up or when it shows too few decoding steps. Nothing judges the warm-up, and its rate rises through the
    searched ones without holding any, so the baseline's prediction is not fitted on a run it is checked by. The
    warm-up's requests are the rates' (copies included), so its steps are the searched steps' kind. Recorded in
    `results.cost_model.serving.capacity_corrections`."""
    from runinfra_opt.load.store import read_run
    from runinfra_opt.predict.figures import batch_residuals
    from runinfra_opt.predict.serving import Corrections

    vr = state.results.variant(BASELINE.name)
    records = vr.capacity.warmup_records if vr and vr.capacity else None
    path = state.run_dir / records if records else None
    if path is None or not path.exists():
        return None
    points = batch_residuals(read_run(path), table)
    if not points:
        return None
    base = batch1 or Corrections()
    if points[0][0] > 1:  # anchored at batch 1 by the batch-1 fit (a warm-up rarely steps one sequence alone)
        points = ((1.0, base.step_s), *points)
    recorded = state.results.cost_model.serving
    assert recorded is not None  # the table the predictions price steps with
    recorded.capacity_corrections = CapacityCorrections(
        by_batch=[[b, s] for b, s in points],
        request_s=base.request_s,
        fitted_to=f"the baseline's warm-up for its capacity search ({records}): decoding steps by batch size",
    )
    return Corrections(base.step_s, base.request_s, by_batch=points)


def _warmup_overheads(
    state: RunState,
    passes: dict[str, list[RequestPasses]],
    table: StepCostTable,
    corrections: Corrections,
    drafts: dict[str, DraftCost],
) -> dict[str, SpecOverhead]:
    """The speculative step terms under load for each variant of a method whose launched variants have warmed up
    for their searches: both terms fitted (`predict.overhead.fit`) on those warm-ups' steps by batch size
    (`predict.overhead.warmup_samples`, beyond the table and the baseline's warm-up `corrections`). A variant's
    own warm-up counts toward its terms: nothing judges it, and it holds none of the searched rates. A copy of a
    planned request (`load.cycle`) carries its original's simulated passes (greedy: the same output). Variants
    of a method none of whose variants warmed up keep the batch-1 terms. Recorded in
    `results.cost_model.serving.capacity_spec_overheads`."""
    from runinfra_opt.load.store import read_run
    from runinfra_opt.predict.overhead import Sample, fit, warmup_samples

    method = {v.name: v.method for v in state.space if v.is_speculative}
    samples: dict[str, list[Sample]] = {}
    for vr in state.results.variants:
        records = vr.capacity.warmup_records if vr.capacity else None
        if vr.name not in method or vr.name not in passes or not records or not (state.run_dir / records).exists():
            continue
        planned = {item.request.id: item.passes for item in passes[vr.name]}
        by_id = {r.id: planned[original_id(r)] for r in capacity.level_requests(state) if original_id(r) in planned}
        run = read_run(state.run_dir / records)
        found = warmup_samples(vr.name, run, by_id, table, corrections.step_at, drafts.get(vr.name))
        samples.setdefault(method[vr.name], []).extend(found)
    fitted = {family: fit(rows) for family, rows in samples.items() if rows}
    out = {name: fitted[family] for name, family in method.items() if family in fitted}
    recorded = state.results.cost_model.serving
    if fitted and recorded is not None:
        recorded.capacity_spec_overheads = CapacitySpecOverheads(
            by_method={family: SpecTerms.model_validate(terms.to_dict()) for family, terms in fitted.items()},
            method="least squares over the launched variants' capacity warm-ups, their decoding steps grouped by "
            "batch size, beyond the table and the baseline's warm-up step corrections",
        )
    return out


def _bisect(check: Callable[[float], bool], start: float, ceiling: float, floor: float) -> float:
    """The highest rate in [`floor`, `ceiling`] that `check(rate)` holds at, to `PREDICT_TOLERANCE` (0 when not
    even at the floor)."""
    low, high = None, None
    rate = start
    for _ in range(11):  # out from the start by doubling or halving until bracketed
        if check(rate):
            low = rate
            if high is not None or rate >= ceiling:
                break
            rate = min(rate * 2, ceiling)
        else:
            high = rate
            if low is not None or rate <= floor:
                break
            rate = max(rate / 2, floor)
    if low is None:
        return 0.0
    if high is None:
        return low
    while high / low - 1 > PREDICT_TOLERANCE:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if check(middle) else (low, middle)
    return low
