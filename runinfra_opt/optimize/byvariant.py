"""Timing variant by variant, a server each (an engine that cannot interleave variants: `interleaves = False`),
for the confirmation and the k-schedule phases. With `--pair-baseline` on an engine that can keep the baseline's
server up beside another (`can_keep_baseline`), each candidate is timed beside the baseline: requests alternate
between the two servers and every record carries the candidate's name as its trial, so the candidate's ratio to
the baseline pairs requests timed in the same minutes (`_time_paired`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from runinfra_opt.errors import EngineError
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize import capacity, underload
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState
from runinfra_opt.records import compare_to_baseline, default_tie_tolerance
from runinfra_opt.results import VariantResult


def pairs_baseline(state: RunState) -> bool:
    """Whether each candidate is timed beside the baseline (`--pair-baseline` on an engine that can keep the
    baseline's server up next to a candidate's: `_time_paired`)."""
    return bool(state.config.pair_baseline and getattr(state.engine, "can_keep_baseline", False))


def time_by_variant(
    state: RunState, variants: list[Variant], repredict: Callable[[], None] | None = None
) -> None:
    """Variant by variant (an engine with a server per variant: a launch per switch would dominate), baseline
    first (its pass is its first repeat: `_adopt_baseline_pass`); within a variant, every request and repeat,
    each candidate's beside the baseline's when `pairs_baseline` (`_time_paired`). A variant whose server or a
    request fails is marked failed with the reason and the run goes on with the others; the baseline failing ends
    the run. `repredict`: handed to each capacity search (`capacity.search`)."""
    assert state.engine is not None
    engine, results = state.engine, state.results
    repeats = state.plan.repeats
    reference = state.baseline_records()
    levels = underload.levels_of(state)
    paired = pairs_baseline(state)
    if paired and any(v.is_speculative for v in variants):
        cast(Any, engine).keep_baseline = True  # `pairs_baseline`: the engine has it
        results.add_note(
            "each candidate was timed beside the baseline: both servers up, requests alternating between them, "
            "and its ratio to the baseline pairs requests timed in the same minutes (candidates are ranked by "
            "that ratio at the baseline's own speed; --no-pair-baseline: one server at a time)"
        )
    speculative = sum(1 for v in variants if v.is_speculative) if paired else 0
    total = (len(variants) + speculative) * len(state.requests) * repeats + len(variants) * len(levels)
    under = f", then {len(levels)} load level(s)" if levels else ""
    beside = ", each beside the baseline" if paired else ""
    state.reporter.phase(
        "confirm", total,
        f"timing {len(variants) - 1} candidate(s) x {repeats} repeat(s){under}, one server each{beside}",
    )  # fmt: skip
    for variant in variants:
        vr = state.variant_result(variant)
        if variant.name == BASELINE.name and not vr.measured_requests and repeats > 0:
            _adopt_baseline_pass(state, vr)
        # (a candidate timed alone before, in a run resumed with pairing on, stays unpaired: its rows pair with
        # the baseline's own repeats)
        pairing = paired and variant.is_speculative and not any(r.trial is None for r in vr.measured_requests)
        done = {(r.request_id, r.repeat) for r in vr.measured_requests}
        beside_done = _beside_done(state, variant) if pairing else set()
        todo = [
            (rep, req)
            for rep in range(repeats)
            for req in state.requests
            if (req.id, rep) not in done or (pairing and (req.id, rep) not in beside_done)
        ]
        levels_done = {lr.level for lr in vr.load}
        levels_todo = [level for level in levels if level.name not in levels_done]
        timed = len(state.requests) * repeats * (2 if pairing else 1)
        for _ in range(timed - _left(todo, done, beside_done, pairing) + len(levels) - len(levels_todo)):
            state.reporter.advance()
        if (not todo and not levels_todo and not capacity.pending(state, variant)) or vr.failed:
            for _ in range(_left(todo, done, beside_done, pairing) + len(levels_todo)):
                state.reporter.advance()
            continue
        baseline_error: EngineError | None = None
        try:
            if todo:
                engine.warmup(todo[0][1], variant, max_tokens=WARMUP_TOKENS)
            if pairing and todo:
                try:
                    _time_paired(state, variant, todo, done, beside_done)
                except _BaselineFailed as exc:
                    baseline_error = exc.error
                    raise exc.error from None
            for repeat, request in [] if pairing else todo:
                record = engine.generate(request, variant, max_tokens=state.max_tokens, repeat=repeat)
                if request.id in reference:
                    compare_to_baseline(record, reference[request.id], tie_tolerance=tie_tolerance(state))
                vr.measured_requests.append(record)
                state.save()
                state.reporter.advance(f"{variant.name} {request.id}")
            underload.measure(state, variant)  # on the same server, while it is up
            capacity.search(state, variant, repredict)
        except EngineError as exc:
            if not variant.is_speculative or exc is baseline_error:
                raise
            reason = str(exc).splitlines()[0]
            vr.failed = f"failed on the {engine.name} engine: {reason}"
            results.add_note(f"{variant.name} failed: {reason} (log: {_log_of(engine)})", kind="left_out")
            state.save()
    state.reporter.end_phase()
    record_launches(state)


class _BaselineFailed(Exception):
    """The baseline's server or request failed while a candidate was timed beside it: the run ends (it is the
    baseline's failure, not the candidate's)."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(str(error))
        self.error = error


def _beside_done(state: RunState, variant: Variant) -> set[tuple[str, int]]:
    """The baseline's (request, repeat) already timed beside `variant` (its records tagged with its trial)."""
    rows = state.variant_result(BASELINE).measured_requests
    return {(r.request_id, r.repeat) for r in rows if r.trial == variant.name}


def _left(todo: list[tuple[int, Any]], done: set[tuple[str, int]], beside: set[tuple[str, int]], pairing: bool) -> int:
    """How many timed requests `todo` still holds (the candidate's, and the baseline's beside it)."""
    if not pairing:
        return len(todo)
    return sum((r.id, k) not in done for k, r in todo) + sum((r.id, k) not in beside for k, r in todo)


def _time_paired(
    state: RunState,
    variant: Variant,
    todo: list[tuple[int, Any]],
    done: set[tuple[str, int]],
    beside: set[tuple[str, int]],
) -> None:
    """`variant` timed beside the baseline: both servers up, per request and repeat the baseline and the
    candidate, in turn A B, B A, ..., each request in both orders over two repeats (a request that follows the
    other server's may run slower, even after the engine's settling wait: the order alternates so that neither
    side always goes second). Every record carries the candidate's name as its trial, so its ratio to
    the baseline pairs only with the baseline's requests timed in the same minutes (`stats.paired`), as the Ray
    executor's trials pair on a node: a machine that changes speed between candidates timed minutes apart moves
    both sides of each pair alike."""
    assert state.engine is not None
    engine = state.engine
    reference = state.baseline_records()
    base_vr, vr = state.variant_result(BASELINE), state.variant_result(variant)
    try:
        engine.warmup(todo[0][1], BASELINE, max_tokens=WARMUP_TOKENS)  # idle while the candidate's server started
    except EngineError as exc:
        raise _BaselineFailed(exc) from None
    position = {r.id: j for j, r in enumerate(state.requests)}
    for repeat, request in todo:
        first = (position[request.id] + repeat) % 2 == 0
        order = (BASELINE, variant) if first else (variant, BASELINE)
        for which in order:
            if (request.id, repeat) in (beside if which is BASELINE else done):
                continue
            try:
                record = engine.generate(request, which, max_tokens=state.max_tokens, repeat=repeat)
            except EngineError as exc:
                if which is BASELINE:
                    raise _BaselineFailed(exc) from None
                raise
            record.trial = variant.name
            if request.id in reference:
                compare_to_baseline(record, reference[request.id], tie_tolerance=tie_tolerance(state))
            (base_vr if which is BASELINE else vr).measured_requests.append(record)
            state.save()
            state.reporter.advance(f"{which.name} {request.id} (beside {variant.name})")


def _adopt_baseline_pass(state: RunState, vr: VariantResult) -> None:
    """The baseline pass is the baseline's first timed repeat on an engine that times variant by variant: the same
    server, requests and `generate` (a fresh prefix-cache salt, the server warm), and nothing is interleaved with
    it there that a repeat would be. Saves one pass over the requests."""
    reference = state.baseline_records()
    if all(r.id in reference and reference[r.id].repeat == 0 for r in state.requests):
        vr.measured_requests.extend(reference[r.id] for r in state.requests)
        state.save()


def _log_of(engine: Any) -> str:
    launches = getattr(engine, "launches", None)
    return launches[-1].log if launches else "none"


def record_launches(state: RunState) -> None:
    """The engine's server launches (variant, start-up seconds, log, error) into the results."""
    launches = getattr(state.engine, "launches", None)
    if launches:
        state.results.launches.extend(launch.to_dict() for launch in launches)
        launches.clear()
        state.save()


def tie_tolerance(state: RunState) -> float:
    """`--tie-tolerance`, else the default for the engine's dtype."""
    if state.config.tie_tolerance is not None:
        return state.config.tie_tolerance
    return default_tie_tolerance(state.results.environment.get("dtype"))
