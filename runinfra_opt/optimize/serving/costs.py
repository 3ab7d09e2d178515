"""The serving predictor's costs: the step-cost table on the baseline's server (`measure`, phase `cost`), each
draft model's agreement with the target and its own table (`profile`, phase `profile`), and the tables as the
predictions price steps with them (`step_table`, `draft_cost`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from runinfra_opt.engine.protocol import StepCostMeter
from runinfra_opt.methods import Variant
from runinfra_opt.optimize.state import RunState
from runinfra_opt.predict.serving import predictable
from runinfra_opt.results import (
    CostModelRecord,
    ServingCosts,
    StepCostsRecord,
)

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.predict.draftcost import DraftCost
    from runinfra_opt.predict.steptable import StepCostTable

def measure(state: RunState) -> None:
    """Phase `cost` on a serving engine: the step-cost table on the baseline's server, as far as the run can use it
    (steps of up to the largest closed loop's concurrency, 1 at batch 1 only, each sequence carrying up to 1 + the
    largest predictable lookahead). When the server does not allow the measurement (e.g. no prefix-cache
    metrics), nothing is predicted and every variant is timed, with the reason in `phases_skipped` and the notes;
    a server that died shows again in the baseline phase."""
    from runinfra_opt.errors import EngineError

    assert state.engine is not None
    engine = cast(StepCostMeter, state.engine)
    max_batch, max_prefill = _limits(state)
    max_tokens = 1 + max([v.lookahead for v in state.space if predictable(v, _draft_models(state))] + [0])
    state.reporter.phase("cost", None, "measuring step costs on the baseline's server")
    try:
        measurement = engine.step_costs(max_batch, max_tokens, max_prefill)
    except EngineError as exc:
        reason = f"the step costs could not be measured on the baseline's server: {str(exc).splitlines()[0]}"
        for phase in ("cost", "profile", "predict", "repredict"):
            state.results.phases_skipped[phase] = reason
        state.results.add_note(f"{reason}; every variant is timed", kind="left_out")
        return
    finally:
        state.reporter.end_phase()
    measured = StepCostsRecord.model_validate(measurement.to_dict())
    state.results.cost_model = CostModelRecord(serving=ServingCosts(step_costs=measured))
    state.save()


def _limits(state: RunState) -> tuple[int | None, int]:
    """The largest batch a step of this run can hold (None: an open loop's in-flight count is unbounded) and the most
    prompt tokens one step can prefill. A capacity search (`--priority capacity`) offers open-loop rates whatever
    the load levels are."""
    from runinfra_opt.load import Concurrency
    from runinfra_opt.optimize import underload

    levels = underload.levels_of(state)
    closed = not state.config.objective.on_capacity and all(isinstance(level, Concurrency) for level in levels)
    max_batch = max([1] + [level.concurrency for level in levels if isinstance(level, Concurrency)]) if closed else None
    return max_batch, most_prefill_tokens(state, max_batch)


def _draft_models(state: RunState) -> dict[str, list[Variant]]:
    """The space's variants drafted by a separate draft model, by the drafter's role."""
    from runinfra_opt.methods import get_method

    out: dict[str, list[Variant]] = {}
    for variant in state.space:
        drafter = get_method(variant.method).drafter(variant)
        if drafter is not None and drafter.model is not None:
            out.setdefault(drafter.role, []).append(variant)
    return out


def profiled(state: RunState) -> set[str]:
    """The drafter roles the serving predictor can price: agreement flags and a step-cost table both recorded."""
    recorded = state.results.cost_model.serving
    tables = recorded.draft_step_costs if recorded is not None else {}
    agreement = state.results.profile.get("agreement", {})
    return {role for role in tables if role in agreement}


def profile(state: RunState) -> None:
    """Phase `profile` on a serving engine, for each draft model of the space (saved as each finishes; a resume does
    the rest):

    - its **agreement** with the target: one teacher-forced forward of the draft, in-process (transformers,
      float32), over each greedy request's prompt and the baseline server's output ids (`engine.hf.profile`). The
      server computes in its own dtype (bfloat16 on a CPU): where the draft's top two tokens are nearly tied the
      server's draft may pick the other one, so an agreement flag can differ from the server's at such positions
      (the simulated acceptance, not the greedy output, which stays the target's);
    - its **cost**: the step-cost table of the draft alone, measured as the target's is, on a server of its own
      launched beside the baseline's (`StepCostMeter.draft_step_costs`; one launch per draft, counted among the
      run's servers).

    A draft whose table cannot be measured is left to be timed, with a note."""
    from runinfra_opt.engine.hf.profile import teacher_forced_agreement
    from runinfra_opt.errors import EngineError
    from runinfra_opt.models import load_model
    from runinfra_opt.optimize.byvariant import record_launches
    from runinfra_opt.optimize.state import agreement_bits

    drafts = _draft_models(state)
    recorded = state.results.cost_model.serving
    if not drafts or recorded is None:
        return
    assert state.engine is not None
    engine = cast(StepCostMeter, state.engine)
    results = state.results
    agreement: dict[str, dict[str, str]] = results.profile.setdefault("agreement", {})
    tables = recorded.draft_step_costs
    base = state.baseline_records()
    greedy = [r for r in state.requests if r.greedy and r.id in base]
    seqs = [(state.engine.prompts.prompt_ids(r), list(base[r.id].output_ids or [])) for r in greedy]
    max_batch, max_prefill = _limits(state)
    state.reporter.phase("profile", 2 * len(drafts), "profiling the draft models")
    for role, variants in drafts.items():
        spec = variants[0].draft
        assert spec is not None
        if role not in agreement and seqs:
            model = load_model(spec, device="cpu", dtype="float32")
            flags = teacher_forced_agreement(model, seqs)
            agreement[role] = {r.id: agreement_bits(f) for r, f in zip(greedy, flags, strict=True)}
            del model
            state.save()
        state.reporter.advance(f"{role}: agreement")
        if role not in tables:
            max_tokens = 1 + max(v.lookahead for v in variants)
            try:
                measurement = engine.draft_step_costs(spec, max_batch, max_tokens, max_prefill)
                tables[role] = StepCostsRecord.model_validate(measurement.to_dict())
            except EngineError as exc:
                results.add_note(
                    f"the step costs of {role} could not be measured on a server of its own: "
                    f"{str(exc).splitlines()[0]}; its variants are timed",
                    kind="left_out",
                )
            record_launches(state)
            state.save()
        state.reporter.advance(f"{role}: step costs")
    state.reporter.end_phase()


def most_prefill_tokens(state: RunState, max_batch: int | None) -> int:
    """The most prompt tokens one step of this run can prefill: the `max_batch` longest prompts of the workload
    together (all of them under an open loop), at most the server's token budget per step. The step-cost table
    needs prefill lengths up to there and no further (a long prefill row is a large share of the measurement)."""
    from runinfra_opt.predict.serving import VLLM_CPU_SERVER

    assert state.engine is not None
    lengths = sorted((len(state.engine.prompts.prompt_ids(r)) for r in state.requests), reverse=True)
    together = sum(lengths if max_batch is None else lengths[:max_batch])
    return max(1, min(together, VLLM_CPU_SERVER.max_num_batched_tokens))


def step_table(state: RunState) -> StepCostTable:
    """The measured table as the predictor prices steps with it: each row non-decreasing in the tokens per sequence
    (`StepCostTable.monotone`; the results keep the measured cells)."""
    from runinfra_opt.predict.steptable import StepCostTable

    recorded = state.results.cost_model.serving
    assert recorded is not None
    return StepCostTable.from_dict(recorded.step_costs.table.model_dump()).monotone()


def draft_cost(state: RunState, variant: Variant) -> DraftCost | None:
    """What `variant`'s draft model adds to a step (`predict.draftcost`), from its recorded step-cost table (made
    non-decreasing as the target's); None for a variant without a draft model or before the table is measured."""
    from runinfra_opt.methods import get_method
    from runinfra_opt.predict.draftcost import DraftCost
    from runinfra_opt.predict.steptable import StepCostTable

    drafter = get_method(variant.method).drafter(variant)
    recorded = state.results.cost_model.serving
    measured = recorded.draft_step_costs.get(drafter.role) if drafter and recorded is not None else None
    if measured is None:
        return None
    return DraftCost(StepCostTable.from_dict(measured.table.model_dump()).monotone(), variant.lookahead)
