"""The `optimize` pipeline: predict every variant from one profiling pass, confirm the best by timing, decide.

The phases, in order (one module each under `optimize/phases/`):
1. `setup`: the workload (bundled name or path), the models, the engine and the search space;
2. `cost`: measure (or read from the cache) forward/prefill times of the target, each draft and each
   early-exit sub-model, and fit the cost model (on a serving engine: the step-cost table, measured on the
   baseline's own server, `optimize/serving/`);
3. `plan`: subsample requests, stratified by category, so the run fits `--budget-minutes`;
4. `baseline`: one timed greedy pass over the planned requests (outputs and timings kept);
5. `check_cost`: the raw cost model against the baseline pass (measured again once if a cached one is off);
6. `profile`: one teacher-forced pass of each draft, and one target pass for every early-exit layer, over
   prompt + baseline output; then a short calibration run per speculative method;
7. `predict`: simulate every variant's passes per request and predict TTFT and end-to-end time (on a serving
   engine also every load level, with a model of its continuous batching);
8. `confirm`: time the top `--confirm` predicted candidates and the baseline end to end, repeated and
   interleaved, checking every output against the baseline's (`--strategy exhaustive` times every variant);
9. `extend` (`--repeats auto`, the default): re-measure once a repeat in which the baseline drifted, then add
   repeats of the leading candidates while the winner's interval against the runner-up or the baseline straddles
   the decision threshold and budget remains; record how sure the decision is;
10. `schedule` (under `--load` on a serving engine): when the best lookahead differs across concurrency levels,
    the batch-size -> k schedule built from the choices, measured as one more variant at batch 1 and at every
    level, and written only if it beats every fixed k of its family there;
11. `repredict`: the predictions again, with overheads fitted to the confirmation's baseline;
12. `decide` on measured figures only (and per load level), and 13. `write` the manifest.

`cost`, `check_cost`, `profile`, `predict` and `repredict` ask the run's predictor (`optimize.predictor`), chosen
once from the engine at the end of `setup`: the in-process one, the serving engine's, or none (those phases are then
skipped, each with why in `results.phases_skipped`).

Every finished phase is recorded in `results.phases_done` on disk; `--resume` skips those (restoring what
later phases need from the results) and, inside an unfinished phase, the trials already recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.optimize import predictor
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.phases import (
    baseline,
    confirm,
    cost,
    decide,
    extend,
    plan,
    predict,
    profile,
    schedule,
    setup,
    write,
)
from runinfra_opt.optimize.rundir import open_run
from runinfra_opt.optimize.state import Reporter, RunState, Silent
from runinfra_opt.results import RunResults, RunStop, resume_command
from runinfra_opt.signals import Terminated


@dataclass(frozen=True)
class Phase:
    name: str
    run: Callable[[RunState], None]
    restore: Callable[[RunState], None] | None = None
    """Rebuilds, on resume, what later phases need from the results of the finished phase."""
    rerun: bool = False
    """Runs again on resume even when finished (it opens the engine, or recomputes cheaply from recorded facts)."""
    timing: str | None = None
    """The `results.timings_s` key its wall time adds to (None: the phase times what it measures itself)."""
    asks_predictor: bool = False
    """The phase is a step of the run's predictor (`optimize.predictor`); skipped, with why, when the run's
    predictor has no such step or the run has none."""


def _setup(state: RunState) -> None:
    setup.run(state)
    predictor.choose(state)


PHASES: tuple[Phase, ...] = (
    Phase("setup", _setup, rerun=True, timing="setup"),
    Phase("cost", cost.run, restore=cost.restore, timing="cost", asks_predictor=True),
    Phase("plan", plan.run, restore=plan.restore),
    Phase("baseline", baseline.run, restore=baseline.restore, timing="baseline"),
    Phase("check_cost", cost.check, asks_predictor=True),
    Phase("profile", profile.run, timing="profile", asks_predictor=True),
    Phase("predict", predict.run, rerun=True, timing="predict", asks_predictor=True),
    Phase("confirm", confirm.run, timing="confirm"),
    Phase("extend", extend.run, timing="confirm"),
    Phase("schedule", schedule.run, timing="confirm"),
    Phase("repredict", predict.run_after_confirm, rerun=True, timing="predict", asks_predictor=True),
    Phase("decide", decide.run, rerun=True, timing="decide"),
    Phase("write", write.run, rerun=True, timing="decide"),
)


SETTINGS_FILE = "config.yaml"
"""The run's settings as `optimize --config` reads them, beside results.json (written when the run starts)."""


def run_optimize(
    config: OptimizeConfig,
    *,
    resume: str | None = None,
    reporter: Reporter | None = None,
    settings: str | None = None,
) -> RunResults:
    """Run (or, with `resume` naming a run, resume) the whole pipeline and return the final results (also in
    `<run dir>/results.json`). `settings`, the command's effective options as `--config` YAML, is recorded in
    `<run dir>/config.yaml` when the run starts (a resumed run keeps the file it started with).

    Raises `NoFeasibleVariantError` (exit 3, no manifest) when no variant satisfies the constraints. With
    `require_speedup`, a baseline win sets `decision.exit_code` to 4 (the caller exits with it); the results
    file and the manifest are complete either way."""
    opened = open_run(config, resume=resume)
    state = RunState(
        config=opened.config,
        run_dir=opened.run_dir,
        results=opened.results,
        reporter=reporter or Silent(),
        resumed=opened.resumed,
    )
    try:
        if settings is not None and not opened.resumed:
            atomic_write_text(opened.run_dir / SETTINGS_FILE, settings)
        run_phases(state)
    except BaseException as exc:
        if state.results.status == "running":
            if isinstance(exc, KeyboardInterrupt):
                _mark_interrupted(state, "SIGTERM" if isinstance(exc, Terminated) else "SIGINT")
            else:
                state.results.status = "failed"
                state.results.add_note(f"failed after phase {state.results.phase}: {exc}", kind="failed")
            with contextlib.suppress(Exception):
                state.save()
        raise
    finally:
        try:
            if state.engine is not None:
                state.engine.close()
        finally:
            opened.lock.release()
    return state.results


def _mark_interrupted(state: RunState, signal: str) -> None:
    """`status: interrupted`, with the signal, the time, what finished and the command that continues."""
    results = state.results
    owner = results.owner or {}
    results.status = "interrupted"
    results.stopped = RunStop(
        how="signal",
        signal=signal,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        phase=results.phase,
        host=str(owner.get("host", "")),
        pid=int(owner.get("pid", 0)),
        resume=resume_command(state.run_dir, results),
    )
    results.add_note(f"interrupted by {signal} after phase {results.phase}", kind="interrupted")


def run_phases(state: RunState, phases: tuple[Phase, ...] = PHASES) -> None:
    """Run each phase not finished yet (and those that always run); restore the finished ones' outputs."""
    for phase in phases:
        if state.done(phase.name) and not phase.rerun:
            if phase.restore is not None and phase.name not in state.results.phases_skipped:
                phase.restore(state)
            continue
        why = predictor.skipped(state, phase.name) if phase.asks_predictor else None
        if why is not None:
            state.results.phases_skipped.setdefault(phase.name, why)
            state.finish_phase(phase.name)
            continue
        with state.timed(phase.timing) if phase.timing else contextlib.nullcontext():
            phase.run(state)
        state.finish_phase(phase.name)
    timings = state.results.timings_s
    timings["total"] = sum(v for k, v in timings.items() if k != "total")
    state.save()
