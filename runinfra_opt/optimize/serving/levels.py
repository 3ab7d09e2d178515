"""The serving predictor's predictions at batch 1 and at every `--load` level (`predict`, phases `predict` and
`repredict`): every predictable variant's passes simulated from the baseline's greedy output and served through the
scheduler model, calibrated on the baseline's measured runs, with the speculative step terms fitted on the timed
variants; and its capacity predictions (`predict_capacity`, `serving.capacity`) from the same inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize.serving.capacity import predict_capacities
from runinfra_opt.optimize.serving.costs import draft_cost, profiled, step_table
from runinfra_opt.optimize.simulate import simulate
from runinfra_opt.optimize.state import RunState
from runinfra_opt.predict.calibrate import as_served, calibration_runs
from runinfra_opt.predict.overhead import NONE as NO_OVERHEAD
from runinfra_opt.predict.serving import predictable
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import (
    Batch1Corrections,
    PredictedLevel,
    SpecOverheads,
    SpecTerms,
)
from runinfra_opt.stats import summarize_with_intervals

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.load import LevelRun
    from runinfra_opt.predict.calibrate import Calibration
    from runinfra_opt.predict.draftcost import DraftCost
    from runinfra_opt.predict.overhead import SpecOverhead
    from runinfra_opt.predict.serving import RequestPasses
    from runinfra_opt.predict.steptable import StepCostTable


def _passes(state: RunState, variant: Variant) -> list[RequestPasses]:
    from runinfra_opt.methods.simulation import SimResult
    from runinfra_opt.predict.serving import RequestPasses, passes_of

    assert state.engine is not None
    out = []
    for request in state.requests:
        sim = simulate(state, variant, request)
        if not isinstance(sim, SimResult) or not sim.output_tokens:
            continue  # no baseline output for it, or an expected (sampled) simulation: no passes to serve
        prompt_tokens = len(state.engine.prompts.prompt_ids(request))
        out.append(RequestPasses(request, prompt_tokens, passes_of(sim)))
    return out


def _batch1_calibration(
    state: RunState, table: StepCostTable, passes: list[RequestPasses], after_confirm: bool
) -> Calibration | None:
    from runinfra_opt.load import Concurrency
    from runinfra_opt.predict.calibrate import calibrate

    # the baseline's own repeats (those timed beside a candidate carry its trial, and repeat numbers of their own)
    measured = [r for r in state.variant_result(BASELINE).measured_requests if r.trial is None] if after_confirm else []
    if not measured:
        measured = list(state.baseline_records().values())
    if not measured:
        return None
    served, runs = calibration_runs(measured, passes, state.request_by_id())
    return calibrate(Concurrency(1), served, table, runs) if runs else None


def _predicted_records(state: RunState, variant: Variant, run: LevelRun) -> list[RequestRecord]:
    by_id = state.request_by_id()
    rows = []
    for record in sorted(run.records, key=lambda r: r.index):
        request = by_id[record.request_id]
        assert record.ttft_s is not None
        assert record.e2e_s is not None
        n = record.output_tokens
        rows.append(
            RequestRecord(
                request_id=record.request_id,
                category=request.category,
                greedy=request.greedy,
                prompt_tokens=record.prompt_tokens or 0,
                output_tokens=n,
                ttft_s=record.ttft_s,
                e2e_s=record.e2e_s,
                tpot_s=(record.e2e_s - record.ttft_s) / (n - 1) if n > 1 else None,
                target_passes=len(record.chunk_tokens),
                variant=variant.name,
            )
        )
    return rows


def _inputs(
    state: RunState,
) -> tuple[StepCostTable, list[Variant], dict[str, DraftCost], dict[str, list[RequestPasses]]] | None:
    """What both predictions start from: the step-cost table, the predictable variants, their draft models'
    proposers and their simulated passes; None before the table is measured or without the baseline's passes."""
    if state.results.cost_model.serving is None:
        return None
    table = step_table(state)
    ready = profiled(state)
    variants = [v for v in state.space if predictable(v, ready)]
    drafts = {v.name: draft for v in variants if (draft := draft_cost(state, v)) is not None}
    passes = {v.name: _passes(state, v) for v in variants}
    if not passes.get(BASELINE.name):
        return None
    return table, variants, drafts, passes


def predict_capacity(state: RunState) -> None:
    """Every predictable variant's capacity predicted again on what has been measured so far
    (`serving.capacity.predict_capacities`, with the terms `predict(after_confirm=True, interim=True)` fits), the
    batch-1 and load-level predictions left as they are: a capacity search calls it once its server has warmed up
    (`optimize.capacity.search`'s `repredict`)."""
    inputs = _inputs(state)
    if inputs is None:
        return
    table, variants, drafts, passes = inputs
    calibration = _batch1_calibration(state, table, passes[BASELINE.name], after_confirm=True)
    overheads = _spec_overheads(state, table, passes, calibration, variants, drafts, interim=True)
    corrections = calibration.corrections if calibration is not None else None
    predict_capacities(state, passes, table, corrections, overheads, drafts)


def predict(state: RunState, *, after_confirm: bool = False, interim: bool = False) -> None:
    """Every predictable variant at batch 1 (`predicted_requests`, `predicted`) and at every load level
    (`load_predicted`); see the module's docstring. `interim`: between two candidates of a one-at-a-time
    confirmation (re-fitted on what is timed so far; the note on a single timed variant is left to the last)."""
    from runinfra_opt.load import Concurrency, level_metrics
    from runinfra_opt.optimize import underload
    from runinfra_opt.predict.calibrate import predict_level

    results = state.results
    inputs = _inputs(state)
    if inputs is None:
        return
    table, variants, drafts, passes = inputs
    base_passes = passes[BASELINE.name]
    calibration = _batch1_calibration(state, table, base_passes, after_confirm)
    recorded = results.cost_model.serving
    assert recorded is not None  # `_inputs` found the table
    if calibration is not None:
        recorded.batch1_corrections = Batch1Corrections(
            step_s=calibration.corrections.step_s,
            request_s=calibration.corrections.request_s,
            fitted_to="confirmed baseline repeats" if after_confirm else "baseline pass",
        )
    if after_confirm:  # the figures the candidates were first ranked by (kept through interim re-fits and resumes)
        results.profile.setdefault(
            "ranking_predicted_tokens_per_s",
            {v.name: v.predicted.tokens_per_s for v in results.variants if v.predicted is not None},
        )
    level_runs = _level_runs(state, BASELINE) if after_confirm else {}
    levels = underload.levels_of(state)
    level_calibrations: dict[str, Calibration | None] = {}
    for level in levels:
        measured = level_runs.get(level.name)
        level_calibrations[level.name] = _calibrate_level(level, base_passes, table, measured)
    overheads = _spec_overheads(state, table, passes, calibration, variants, drafts, interim) if after_confirm else {}
    level_overheads = _level_spec_overheads(state, table, passes, level_calibrations, variants, overheads, drafts)
    predicted_rows: dict[str, list[RequestRecord]] = {}
    level_tps: dict[str, dict[str, float | None]] = {}
    for variant in variants:
        overhead, draft = overheads.get(variant.name, NO_OVERHEAD), drafts.get(variant.name)
        batch1 = predict_level(
            Concurrency(1), passes[variant.name], table, calibration=calibration, overhead=overhead, draft=draft
        )
        predicted_rows[variant.name] = _predicted_records(state, variant, batch1.calibrated or batch1.raw)
        out = []
        for level in levels:
            cal = level_calibrations[level.name]
            at_level = level_overheads.get(level.name, {}).get(variant.name, overhead)
            prediction = predict_level(
                level, passes[variant.name], table, calibration=cal, overhead=at_level, draft=draft
            )
            run = prediction.calibrated or prediction.raw
            metrics = level_metrics([run])
            out.append(PredictedLevel(level=level.name, metrics=metrics, calibrated=prediction.calibrated is not None))
            tps = metrics.output_tokens_per_s
            level_tps.setdefault(level.name, {})[variant.name] = tps.value if tps else None
        state.variant_result(variant).load_predicted = out
    for variant in variants:
        vr = state.variant_result(variant)
        vr.predicted_requests = predicted_rows[variant.name]
        others = predicted_rows[BASELINE.name] if variant.is_speculative else None
        vr.predicted = summarize_with_intervals(vr.predicted_requests, others) if vr.predicted_requests else None
        for predicted in vr.load_predicted:
            mine, theirs = level_tps[predicted.level].get(variant.name), level_tps[predicted.level].get(BASELINE.name)
            predicted.vs_baseline = mine / theirs if mine and theirs else None
    corrections = calibration.corrections if calibration is not None else None
    predict_capacities(state, passes, table, corrections, overheads, drafts)
    left = [v.name for v in state.space if v not in variants]
    if left:
        results.add_note(
            f"the serving predictor cannot simulate {', '.join(left)} without a drafter profile and step costs "
            "(made for draft models only): timed instead"
        )


def _spec_overheads(
    state: RunState,
    table: StepCostTable,
    passes: dict[str, list[RequestPasses]],
    calibration: Calibration | None,
    variants: list[Variant],
    drafts: dict[str, DraftCost],
    interim: bool = False,
) -> dict[str, SpecOverhead]:
    """The speculative step terms per variant (`runinfra_opt.predict.overhead`): for a timed variant, fitted on the
    other timed variants' batch-1 requests (held out); for an untimed one, on all of them; either way on those of
    the variant's own method alone when any was timed. A variant's measured seconds are taken at the calibration's
    pace first (`pace`). Recorded in `results.cost_model.serving.spec_overhead`."""
    from runinfra_opt.load import Concurrency
    from runinfra_opt.predict.calibrate import predict_level
    from runinfra_opt.predict.overhead import Sample, by_family, fit, leave_one_out, median_by_request

    samples: list[Sample] = []
    timed: list[str] = []
    base_run = predict_level(Concurrency(1), passes.get(BASELINE.name, []), table, calibration=calibration)
    base_predicted = {r.request_id: r.e2e_s for r in (base_run.calibrated or base_run.raw).records if r.e2e_s}
    base_records = state.variant_result(BASELINE).measured_requests
    for variant in variants:
        measured = state.variant_result(variant).measured_requests if variant.is_speculative else []
        if not measured:
            continue
        e2e: dict[str, list[float]] = {}
        for record in measured:
            e2e.setdefault(record.request_id, []).append(record.e2e_s)
        prediction = predict_level(
            Concurrency(1), passes[variant.name], table, calibration=calibration, draft=drafts.get(variant.name)
        )
        predicted = {r.request_id: r.e2e_s for r in (prediction.calibrated or prediction.raw).records}
        items = {item.request.id: item for item in passes[variant.name]}
        slower = pace(measured, base_records, base_predicted)
        for request_id, seconds in median_by_request(e2e).items():
            item, before = items.get(request_id), predicted.get(request_id)
            if item is None or before is None:
                continue
            drafted = sum(carried - 1 for carried, _ in item.passes)
            samples.append(Sample(variant.name, seconds / slower - before, 1 + len(item.passes), drafted))
        timed.append(variant.name)
    if not timed:
        return {}
    family = {v.name: v.method for v in variants if v.is_speculative}
    pooled = fit(samples)
    held_out = leave_one_out(samples, timed, family)
    out = {v.name: held_out.get(v.name) or by_family(samples, v.name, family) for v in variants if v.is_speculative}
    recorded = state.results.cost_model.serving
    assert recorded is not None
    recorded.spec_overhead = SpecOverheads(
        all=_terms(pooled),
        by_method={method: _terms(by_family(samples, name, family)) for name, method in family.items()},
        held_out={name: _terms(terms) for name, terms in held_out.items()},
        method="least squares over timed speculative variants' batch-1 requests, those of the variant's own "
        "method when any was timed; a timed variant's own prediction uses the terms fitted on the others",
    )
    if len(timed) == 1 and not interim:
        note = (
            f"only one speculative variant was timed ({timed[0]}): its prediction has no speculative step terms "
            "(they are fitted on the other timed variants); the untimed variants use the terms fitted on it"
        )
        state.results.add_note(note)
    return out


def _terms(terms: SpecOverhead) -> SpecTerms:
    return SpecTerms.model_validate(terms.to_dict())


def pace(
    measured: list[RequestRecord], baseline: list[RequestRecord], predicted: dict[str, float]
) -> float:
    """How much slower than the batch-1 calibration the machine ran while `measured` was timed: the end-to-end
    seconds of the baseline's requests timed beside it (same trial: `--pair-baseline`, or a Ray node) over their
    predictions at the calibration; 1 when none was timed beside it. Two servers up at once on a small machine
    run at another pace than the baseline's own pass the calibration is fitted to, and the machine drifts between
    minutes: unscaled, a variant's residual would carry both into its speculative terms."""
    trials = {r.trial for r in measured if r.trial is not None}
    beside = [b for b in baseline if b.trial in trials and b.request_id in predicted]
    expected = sum(predicted[b.request_id] for b in beside)
    return sum(b.e2e_s for b in beside) / expected if beside and expected > 0 else 1.0


def _level_spec_overheads(
    state: RunState,
    table: StepCostTable,
    passes: dict[str, list[RequestPasses]],
    calibrations: dict[str, Calibration | None],
    variants: list[Variant],
    batch1: dict[str, SpecOverhead],
    drafts: dict[str, DraftCost],
) -> dict[str, dict[str, SpecOverhead]]:
    """The speculative step terms per load level and variant: the per-sequence term stays the batch-1 one, the
    per-drafted-token term is fitted again on the timed variants' measured decoding steps at that level
    (`predict.overhead.level_samples`, `fit_drafted`), held out and by method as at batch 1 (a timed variant's from
    the others' steps; alone, it keeps its batch-1 terms; checked by re-predicting recorded runs:
    `benchmarks/repredict.py`).
    Recorded in `results.cost_model.serving.spec_overhead.levels`."""
    from runinfra_opt.predict.overhead import Sample, fit_drafted, kin, level_samples

    family = {v.name: v.method for v in variants if v.is_speculative}
    timed = {v.name: _level_runs(state, v) for v in variants if v.name in batch1}
    timed = {name: runs for name, runs in timed.items() if runs}
    out: dict[str, dict[str, SpecOverhead]] = {}
    recorded: dict[str, dict[str, SpecTerms]] = {}
    for level, calibration in calibrations.items():
        if calibration is None:
            continue
        samples: list[Sample] = []
        for name, runs in timed.items():
            if level in runs:
                by_id = {item.request.id: item.passes for item in passes[name]}
                step_s = calibration.corrections.step_s
                samples += level_samples(name, runs[level], by_id, table, step_s, drafts.get(name))
        fitted = {name: fit_drafted(kin(samples, name, family), t.step_s) for name, t in batch1.items()}
        out[level] = {name: t for name, t in fitted.items() if t.fitted_on}
        if out[level]:
            recorded[level] = {name: _terms(t) for name, t in out[level].items()}
    serving = state.results.cost_model.serving
    if recorded and serving is not None:
        serving.spec_overhead = serving.spec_overhead or SpecOverheads()
        serving.spec_overhead.levels = recorded
    return out


def _calibrate_level(level: Any, base_passes: list[RequestPasses], table: StepCostTable, measured: Any) -> Any:
    from runinfra_opt.predict.calibrate import calibrate

    if measured is None:
        return None
    try:
        return calibrate(level, as_served(base_passes, [measured]), table, measured, from_steps=True)
    except ValueError:
        return None  # a measured run with no TTFT or throughput to fit to: the raw prediction stands


def _level_runs(state: RunState, variant: Variant) -> dict[str, LevelRun]:
    """The variant's measured run at each load level, read from its records (none: not measured there)."""
    from runinfra_opt.load.store import read_run

    out = {}
    for lr in state.variant_result(variant).load:
        if lr.records:
            path = state.run_dir / lr.records
            if path.exists():
                out[lr.level] = read_run(path)
    return out
