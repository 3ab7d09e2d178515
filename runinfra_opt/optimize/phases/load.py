"""Phase `load`: the workload (bundled name or path), the models and the engine, the search space.

Reads: `config` (and on resume the recorded workload fingerprint). Fills: `state.workload`, `state.requests`
(every measurable request), `state.target`, `state.drafts`, `state.engine`, `state.max_tokens`,
`state.space`; records the environment, the models and the space in the results. Runs again on resume (it
opens the engine).
"""

from __future__ import annotations

from runinfra_opt.errors import UserInputError
from runinfra_opt.optimize.space import build_space, default_exit_layers
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import ModelInfo


def run(state: RunState) -> None:
    from runinfra_opt.drafts import measurable_requests
    from runinfra_opt.engine.hf import open_engine
    from runinfra_opt.workload import DEFAULT_MAX_TOKENS, DEFAULT_WORKLOAD, load_workload

    config, results, reporter = state.config, state.results, state.reporter
    reporter.phase("load", 2 + len(config.drafts), "loading")
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
    engine = open_engine(
        config.target,
        config.drafts,
        device=config.device,
        dtype=config.dtype,
        threads=config.threads,
        allow_tokenizer_mismatch=config.allow_tokenizer_mismatch,
        skip_too_long=config.skip_too_long,
        on_load=reporter.advance,
    )
    target, drafts = engine.target, engine.drafts
    state.target, state.drafts, state.engine = target, drafts, engine
    # Without --max-tokens every request keeps its own max_tokens (load_workload filled the missing ones).
    state.max_tokens = config.max_tokens or max(r.max_tokens or DEFAULT_MAX_TOKENS for r in workload.requests)
    measurable = measurable_requests(
        engine, workload.requests, max_tokens=state.max_tokens, source=workload.path, drafts=config.drafts
    )
    if not state.resumed:
        if measurable.too_long:
            results.notes.append(f"skipped {len(measurable.too_long)} request(s) too long for the target's context")
        if (note := measurable.trained_on_note()) is not None:
            results.notes.append(note)
    state.requests = measurable.requests
    exit_layers = config.exit_layers or default_exit_layers(target.num_layers)
    state.space = build_space(
        num_layers=target.num_layers,
        drafts=config.drafts,
        methods=config.methods,
        lookaheads=config.lookaheads,
        ngram_max=config.ngram_max,
        exit_layers=exit_layers if (config.methods is None or "early_exit" in config.methods) else None,
    )
    results.environment = engine.environment()
    results.target = ModelInfo.model_validate(target.info())
    results.drafts = [ModelInfo.model_validate(d.info()) for d in drafts.values()]
    results.space = [v.name for v in state.space]
    for variant in state.space:
        state.variant_result(variant)
    reporter.end_phase()
