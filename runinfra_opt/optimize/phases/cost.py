"""Phases `cost` and `check_cost`: the run's predictor measures its costs (`optimize.predictor`), recorded in
`results.cost_model` and `<run dir>/cost_model.json`; the in-process predictor's cost model is checked against the
baseline pass.

The in-process predictor's costs (`measure`) read `state.engine` and `state.space`: forward/prefill times of the
target and of each variant's drafter, measured or read from the cache, and the candidate search of methods that
declare one (prompt lookup), fitted into the cost model `state.cost` (`restore` rebuilds it on resume). The serving
predictor's are the step-cost table on the baseline's own server (`optimize.serving.measure`; that server then
serves the baseline pass too).

`check_cost` (after the baseline pass) compares the raw model's prediction of the baseline pass with its
measured time and measures once again when a cached model is too slow (measured on a busy machine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.optimize.rundir import COST_MODEL_FILE
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import CostModelRecord, CostProvenance, CostSampleRecord, FittedCosts, InProcessCosts

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.predict.costmodel import CostModel, CostSample

COST_MISMATCH = 0.30
"""A cost model whose raw prediction of the measured baseline pass is slower than it by more than this was
probably measured on a busy machine: measure it again (once) when it came from the cache."""


def restore(state: RunState) -> None:
    from runinfra_opt.predict.costmodel import CostModel

    recorded = state.results.cost_model.in_process
    if recorded is not None:  # a serving engine's step-cost table needs no state of its own
        state.cost = CostModel.from_dict(recorded.fitted.model_dump())


def run(state: RunState) -> None:
    assert state.predictor is not None  # the pipeline skips the phase without one
    state.predictor.measure_costs(state)
    _write(state)


def measure(state: RunState) -> None:
    """The in-process predictor's costs (`optimize.predictor.InProcess`): the forward-cost tables, measured or read
    from the cache, fitted."""
    from runinfra_opt.engine.protocol import drafters_of, searches_of
    from runinfra_opt.predict.costmodel import fit_cost_model

    results = state.results
    engine = state.profiling_engine()
    drafters = drafters_of(state.space)
    quick = state.config.quick_cost
    state.reporter.phase("cost", engine.cost_steps(drafters, quick=quick), "measuring costs")
    samples, provenance = engine.measure_costs(
        drafters,
        remeasure=state.config.remeasure_cost,
        quick=quick,
        on_step=lambda role: state.reporter.advance(role),
        searches=searches_of(state.space),
    )
    state.cost = fit_cost_model(samples)
    state.reporter.end_phase()
    results.cost_model = CostModelRecord(in_process=_measured(state.cost, samples, provenance))


def _measured(cost: CostModel, samples: list[CostSample], provenance: dict[str, Any]) -> InProcessCosts:
    return InProcessCosts(
        fitted=FittedCosts.model_validate(cost.to_dict()),
        provenance=CostProvenance.model_validate(provenance),
        samples=[CostSampleRecord.model_validate(s.to_dict()) for s in samples],
    )


def _write(state: RunState) -> None:
    atomic_write_text(state.run_dir / COST_MODEL_FILE, state.results.cost_model.model_dump_json(indent=1))


def _baseline_prediction_error(state: RunState) -> float | None:
    """Raw cost-model prediction (no fitted overheads) of the baseline pass over its measured time, minus 1."""
    assert state.cost is not None
    base = list(state.baseline_records().values())
    measured = sum(r.e2e_s for r in base)
    if not base or measured <= 0:
        return None
    target = state.cost.target
    predicted = sum(
        target.prefill(r.prompt_tokens)
        + sum(target.forward(1, r.prompt_tokens + i) for i in range(1, max(r.output_tokens, 1)))
        for r in base
    )
    return predicted / measured - 1.0


def check(state: RunState) -> None:
    assert state.predictor is not None  # the pipeline skips the phase without one
    state.predictor.check_costs(state)


def check_against_baseline(state: RunState) -> None:
    """The in-process predictor's check (`optimize.predictor.InProcess`); see the module's docstring."""
    from runinfra_opt.engine.protocol import drafters_of, searches_of
    from runinfra_opt.predict.costmodel import fit_cost_model

    results = state.results
    error = _baseline_prediction_error(state)
    recorded = results.cost_model.in_process
    if error is None or recorded is None:
        return
    recorded.baseline_prediction_error = error
    cached = bool(recorded.provenance.cached)
    # Only a cost model slower than reality is suspect: forwards cannot take longer than the measured steps
    # that contain them (a faster one is the generate loop's overhead, which the baseline calibrates).
    if error > COST_MISMATCH and cached:
        results.add_note(
            f"the cached cost model predicted the baseline pass {error:+.0%} off its measured time: measured it again"
        )
        with state.timed("cost"):
            samples, provenance = state.profiling_engine().measure_costs(
                drafters_of(state.space),
                remeasure=True,
                quick=state.config.quick_cost,
                searches=searches_of(state.space),
            )
            state.cost = fit_cost_model(samples)
        again = _measured(state.cost, samples, provenance)
        recorded.fitted, recorded.provenance, recorded.samples = again.fitted, again.provenance, again.samples
        error = _baseline_prediction_error(state)
        recorded.baseline_prediction_error = error
    if error is not None and error > COST_MISMATCH:
        results.add_note(
            f"the cost model's raw prediction of the baseline pass is {error:+.0%} off its measured time (the "
            "machine may have been busy while measuring); overheads fitted to the baseline absorb part of it"
        )
    recorded.checked = True
    _write(state)
