"""Phase `plan`: subsample requests, stratified by category, so that the run fits `--budget-minutes`.

Reads `state.requests` (every measurable request), `state.engine`, `state.cost`, `state.space`. Fills
`results.plan` (the planned request ids, repeats, the estimate) and `results.workload`, and narrows
`state.requests` to the planned ones; `restore` narrows them again from `results.plan` on resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from runinfra_opt.errors import UserInputError
from runinfra_opt.optimize.plan import plan_requests
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import Plan, WorkloadInfo
from runinfra_opt.workload.model import Request
from runinfra_opt.workload.sessions import with_predecessors


def restore(state: RunState) -> None:
    wanted = set(state.plan.request_ids)
    state.requests = [r for r in state.requests if r.id in wanted]
    if len(state.requests) != len(wanted):
        raise UserInputError("--resume: planned requests are missing from the workload; start a new run")


def _capacity_need(state: RunState, estimate: Callable[[Request], float]) -> tuple[float, int]:
    """`--priority capacity` on a serving engine: the seconds its searches need to bracket each launched variant's
    capacity (`capacity.search_need_s`), and the servers it launches; (0, 0) elsewhere or without a cost model."""
    from runinfra_opt.engine.protocol import Capability
    from runinfra_opt.optimize.capacity import search_need_s

    config, engine = state.config, state.engine
    if not config.objective.on_capacity or engine is None or Capability.SERVE_LOAD not in engine.capabilities:
        return 0.0, 0
    lengths = sorted(estimate(r) for r in state.requests)
    e2e = lengths[len(lengths) // 2] if lengths else 0.0
    if e2e <= 0:
        return 0.0, 0  # nothing to estimate by: the searches take what the budget leaves
    servers = 1 + min(config.confirm, max(len(state.space) - 1, 0))
    return servers * search_need_s(state, e2e), servers


def _say_capacity_budget(state: RunState, need: float, servers: int, batch1_s: float) -> None:
    """Before anything is timed: when `--budget-minutes` cannot hold the batch-1 timings and a bracket of every
    launched variant's capacity, say so, with the budget that would."""
    from runinfra_opt.optimize.capacity import BRACKET_RUNS

    config = state.config
    left = state.budget_left()
    if need <= 0 or need + batch1_s <= left:
        return
    spent = config.budget_minutes * 60 - left
    text = (
        f"--priority capacity: bracketing the capacity of each of the {servers} server(s) it launches takes about "
        f"{need / 60:.1f} min (a warm-up and {BRACKET_RUNS} offered rates each) besides ~{batch1_s / 60:.1f} min of "
        f"batch-1 timings, and --budget-minutes {config.budget_minutes:g} leaves {max(left, 0.0) / 60:.1f} min: a "
        f"capacity may stay a lower bound and decide nothing; --budget-minutes "
        f"{math.ceil((spent + need + batch1_s) / 60):g} would bracket each"
    )
    state.results.add_note(text)
    state.reporter.note(text)


def run(state: RunState) -> None:
    config, results = state.config, state.results
    assert state.workload is not None
    assert state.engine is not None
    engine, cost, workload = state.engine, state.cost, state.workload

    def estimate(request: Request) -> float:
        if cost is None:
            return 0.0  # no cost table on this engine: nothing to plan by, every request is kept
        prompt = len(engine.prompts.prompt_ids(request))
        new = engine.prompts.max_new_tokens(request, state.max_tokens)
        return cost.target.prefill(prompt) + new * cost.target.forward(1, prompt + new // 2)

    timed_variants = len(state.space) - 1 if config.strategy == "exhaustive" else None
    need, servers = _capacity_need(state, estimate)
    budget_s = max(state.budget_left(), 1.0) - min(need, max(state.budget_left(), 0.0) / 2)  # capacity's first
    plan = plan_requests(
        state.requests,
        estimate,
        budget_s=max(budget_s, 1.0),
        confirm=min(config.confirm, max(len(state.space) - 1, 1)),
        repeats=config.repeats,
        seed=config.seed,
        max_requests=config.max_requests,
        timed_variants=timed_variants,
        budget_minutes=config.budget_minutes,
    )
    _say_capacity_budget(state, need, servers, plan.estimate_s)
    kept = with_predecessors(state.requests, plan.request_ids)  # a session's later turn needs its earlier ones
    state.requests = [r for r in state.requests if r.id in kept]
    results.plan = Plan(
        request_ids=[r.id for r in state.requests],
        repeats=plan.repeats,
        estimate_s=round(plan.estimate_s, 1),
        budget_s=config.budget_minutes * 60.0,
        max_tokens=state.max_tokens,
    )
    categories: dict[str, int] = {}
    for r in state.requests:
        categories[r.category] = categories.get(r.category, 0) + 1
    results.workload = WorkloadInfo(
        name=workload.name,
        path=workload.path,
        fingerprint=workload.fingerprint,
        requests=len(workload.requests),
        used_requests=len(state.requests),
        categories=categories,
        subsampled=plan.subsampled,
    )
    if plan.subsampled:
        results.add_note(plan.subsampled, kind="subsampled")
    if len(kept) > len(plan.request_ids):
        results.add_note(
            f"{len(kept) - len(plan.request_ids)} earlier turn(s) of the planned requests' sessions added: a "
            "session's turn is sent after its earlier ones, with their answers as its history"
        )
    if cost is None:
        results.add_note("no cost model on this engine: the budget does not limit the requests")
    if config.strategy == "exhaustive" and plan.estimate_s > config.budget_minutes * 60:
        results.add_note(
            f"exhaustive: timing all {len(state.space)} variants is estimated at {plan.estimate_s / 60:.1f} min, "
            f"over the {config.budget_minutes:g}-minute budget (the budget only limits the requests)"
        )
