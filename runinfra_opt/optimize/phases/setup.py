"""Phase `setup`: the workload (bundled name or path), the models and the engine, the search space.

Reads: `config` (and on resume the recorded workload fingerprint). Fills: `state.workload`, `state.requests`
(every measurable request), `state.engine` (from the engine registry), `state.max_tokens`, `state.space`
(the variants the engine can run); records the environment, the models and the space in the results. Runs
again on resume (it opens the engine).
"""

from __future__ import annotations

from runinfra_opt.errors import UserInputError
from runinfra_opt.optimize.space import build_space
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import ModelInfo


def run(state: RunState) -> None:
    from runinfra_opt.drafts import measurable_requests
    from runinfra_opt.engine.registry import open_engine
    from runinfra_opt.workload import DEFAULT_MAX_TOKENS, DEFAULT_WORKLOAD, load_workload

    config, results, reporter = state.config, state.results, state.reporter
    reporter.phase("setup", 2 + len(config.drafts), "loading")
    workload = load_workload(
        config.workload or DEFAULT_WORKLOAD,
        format=config.workload_format,
        default_max_tokens=config.max_tokens or DEFAULT_MAX_TOKENS,
    )
    if not workload.requests:
        raise UserInputError(f"{workload.path}: the workload has no requests")
    if state.resumed and results.workload is not None and results.workload.fingerprint != workload.fingerprint:
        raise UserInputError(
            f"--resume: the workload {workload.path} changed since the run started "
            f"(fingerprint {workload.fingerprint[:12]} vs {results.workload.fingerprint[:12]}); start a new run"
        )
    state.workload = workload
    reporter.advance(f"workload {workload.name}")
    engine = open_engine(config.engine_setup(), on_load=reporter.advance, log_dir=state.run_dir / "servers")
    state.engine = engine
    # Without --max-tokens every request keeps its own max_tokens (load_workload filled the missing ones).
    state.max_tokens = config.max_tokens or max(r.max_tokens or DEFAULT_MAX_TOKENS for r in workload.requests)
    measurable = measurable_requests(
        engine.prompts, workload.requests, max_tokens=state.max_tokens, source=workload.path, drafts=config.drafts
    )
    if not state.resumed:
        if measurable.too_long:
            results.add_note(f"skipped {len(measurable.too_long)} request(s) too long for the target's context")
        if (note := measurable.trained_on_note()) is not None:
            results.add_note(note, kind="left_out")
    state.requests = measurable.requests
    space = build_space(config.space_settings(), num_layers=engine.target_layers, engine=engine.name)
    state.space = []
    left_out: dict[str, list[str]] = {}
    for variant in space:
        reason = engine.supports(variant)
        if reason is None:
            state.space.append(variant)
        else:
            left_out.setdefault(reason, []).append(variant.name)
    if not state.resumed:
        for reason, names in left_out.items():
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            results.add_note(f"left out {shown}: the {engine.name} engine cannot run it ({reason})", kind="left_out")
        if not getattr(engine, "interleaves", True):
            if config.pair_baseline and getattr(engine, "can_keep_baseline", False):
                drift = (
                    "; each candidate is timed beside the baseline, so a change of the machine's speed between "
                    "variants timed minutes apart moves both sides of its ratio alike"
                )
            else:
                drift = (
                    ", nor a change of the machine's speed between variants timed minutes apart, which favours those "
                    "timed while it ran fast"
                )
            results.add_note(
                f"the {engine.name} engine starts one server per variant it times, each timed apart (start-up is not "
                "counted in any figure); variants are timed one after another, each on one launch: an interval covers "
                "the repeats on that launch, not the spread between launches of one server, which can be larger"
                f"{drift} (docs/how-it-works.md, 'Each candidate beside the baseline')"
            )
    results.environment = engine.environment()
    target_info, draft_infos = engine.model_infos()
    results.target = ModelInfo.model_validate(target_info)
    results.drafts = [ModelInfo.model_validate(d) for d in draft_infos]
    results.space = [v.name for v in state.space]
    for variant in state.space:
        state.variant_result(variant)
    reporter.end_phase()
