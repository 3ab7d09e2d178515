"""Capacity in a run: how much traffic one server sustains with each variant, and how many servers the target
rate needs (`--priority capacity`; and `--priority throughput` where the recorded load does not saturate the
server, since throughput there is only the offered load). This module offers the rates and searches them on the
launched servers; the predictions it starts from are the serving predictor's (`optimize.serving.capacity`), the
decision on what it measures `optimize.decision.capacity`.

The search (`search`, right after a launched variant's batch-1 timing and load levels, on its server): first a
warm-up judged by nothing (`warm_up`: what a rate sends, at a rate rising to the highest measurable one, so the
first rate judged is not the server's first heavy load; its decoding steps price the predictions' steps by batch
size), then every capacity predicted again with what the warm-up showed (the `repredict` hook), then a
`load.capacity.RateSearch` from the variant's prediction, one run per offered rate of the planned requests (cycled
to `requests_per_rate`: `level_requests`), Poisson arrivals (seeded), or the recorded pattern scaled when every
request has an arrival time. A rate whose verdict is unclear (`load.capacity.unclear`) is run once more (fresh
cache salt), `REPEATS` at most per server, and judged on both runs pooled. The capacity found is run once more
when it rests on one run (`_unconfirmed`); missed on both runs pooled, the search goes on below it. The plan (rates
x window per server) is printed before the first search and cut to `--budget-minutes`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from runinfra_opt.engine.protocol import LoadServer
from runinfra_opt.fsutil import safe_name
from runinfra_opt.load import Rate, Replay
from runinfra_opt.load import capacity as search_rules
from runinfra_opt.load.cycle import cycle
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize.decision.eligibility import saved_nothing
from runinfra_opt.optimize.state import RunState
from runinfra_opt.records import disqualifying
from runinfra_opt.results import CapacityLevel, CapacitySummary, VariantCapacity
from runinfra_opt.results.capacity import UNSATURATED

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.load import LevelRun, LoadLevel
    from runinfra_opt.workload.model import Request

REPEATS = 2
"""Runs a search adds per server to rates whose verdict is unclear (`load.capacity.unclear`), one a rate."""
SETTLE_E2E = 3
"""A level's window is its sends' span plus this many batch-1 end-to-end times (warm-up requests and drain)."""


def _criterion(state: RunState) -> str:
    config = state.config
    return "slo" if config.slo_ttft_ms is not None or config.slo_tpot_ms is not None else "saturation"


def may_decide(state: RunState) -> bool:
    """Whether capacity may decide this run: `--priority capacity`, or throughput with the recorded arrivals
    among the load levels (decided once the baseline's replay shows whether it saturates)."""
    objective = state.config.objective
    if objective.on_capacity:
        return True
    if objective.on_ttft:
        return False
    load = state.results.load
    return load is not None and "replay" in load.levels


def _recorded_rate(state: RunState) -> float | None:
    arrivals = [r.arrival_s for r in state.requests]
    if not arrivals or any(a is None for a in arrivals):
        return None
    times = sorted(a for a in arrivals if a is not None)
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else None


DEFAULT_REQUESTS = 48
"""Requests an offered rate sends without `--capacity-requests` (the planned ones cycled to it, or all of them when
more). A rate measures at most a third of its requests in flight (`load.capacity.MIN_SPAN_E2E`), so a few
requests a rate cannot reach a knee; the figure is from the `--priority throughput` run in docs/measurements.md
(section capacity_search.py)."""


def requests_per_rate(state: RunState) -> int:
    """`--capacity-requests`, else the planned requests or `DEFAULT_REQUESTS`, whichever is more."""
    asked = state.config.capacity_requests
    return asked if asked is not None else max(len(state.requests), DEFAULT_REQUESTS)


BRACKET_RUNS = 3
"""Runs the least bracket of a capacity takes: a rate sustained, a rate missed, and the sustained one again."""


def search_need_s(state: RunState, e2e_s: float) -> float:
    """Before anything is timed: the seconds one server's search takes to bracket its capacity (a warm-up and
    `BRACKET_RUNS` runs of what a rate sends, at one request in flight, where a search with no prediction starts),
    for requests whose batch-1 length is `e2e_s` (the plan's estimate)."""
    requests = state.config.capacity_requests or DEFAULT_REQUESTS
    warmup = search_rules.ramp(requests, e2e_s)[-1] + SETTLE_E2E * e2e_s
    return warmup + BRACKET_RUNS * (requests * e2e_s + SETTLE_E2E * e2e_s)


def level_requests(state: RunState) -> list[Request]:
    """What each offered rate sends: the planned requests, cycled to `requests_per_rate` (`load.cycle`)."""
    return cycle(state.requests, requests_per_rate(state))


def offered(state: RunState, rate: float) -> LoadLevel:
    """The load level that offers `rate` requests/s: the recorded arrivals scaled to it when every request has
    one, else Poisson arrivals (`--burstiness`, `--seed`)."""
    recorded = _recorded_rate(state)
    if recorded is not None:
        return Replay(time_scale=recorded / rate)
    return Rate(rate, state.config.burstiness, state.config.seed)


def _summary(state: RunState, why: str) -> CapacitySummary:
    results, config = state.results, state.config
    if results.capacity is not None:
        return results.capacity
    target, source = config.target_rate, "--target-rate" if config.target_rate is not None else None
    if target is None and config.objective.on_capacity:
        arrivals = [r.arrival_s for r in state.requests if r.arrival_s is not None]
        if len(arrivals) == len(state.requests):
            target = search_rules.peak_rate(arrivals)
            if target is not None:
                source = (
                    f"the recorded peak rate: the most arrivals in any {search_rules.PEAK_WINDOW_S:g} s, or the mean "
                    "rate of a shorter recording"
                )
    results.capacity = CapacitySummary(
        criterion="slo" if _criterion(state) == "slo" else "saturation",
        why=why,
        slo_ttft_ms=config.slo_ttft_ms,
        slo_tpot_ms=config.slo_tpot_ms,
        attainment=config.slo_attainment,
        target_rate=target,
        target_source=source,
        arrivals="recorded pattern, scaled" if _recorded_rate(state) is not None else "poisson",
        tolerance=search_rules.TOLERANCE,
        max_levels=search_rules.MAX_LEVELS,
        requests_per_level=len(level_requests(state)),
        server_cost_per_hour=config.server_cost_per_hour,
    )
    return results.capacity


def judge(
    state: RunState, run: LevelRun, rate: float, preemptions: int | None = None, kv: float | None = None
) -> CapacityLevel:
    """The run's verdict at `rate` under this run's SLOs (`load.capacity.verdict`; no SLO: keeping up only)."""
    config = state.config
    slo = _criterion(state) == "slo"
    return search_rules.verdict(
        run,
        rate,
        slo_ttft_ms=config.slo_ttft_ms if slo else None,
        slo_tpot_ms=config.slo_tpot_ms if slo else None,
        attainment=config.slo_attainment,
        preemptions=preemptions,
        kv_cache_peak=kv,
        request_s=baseline_e2e(state),
    )


def baseline_e2e(state: RunState) -> float:
    import statistics

    records = state.baseline_records().values()
    return statistics.median([r.e2e_s for r in records]) if records else 1.0


def ceiling(state: RunState) -> float:
    """The highest rate one offered rate's requests can measure (`load.capacity.ceiling`)."""
    return search_rules.ceiling(len(level_requests(state)), baseline_e2e(state))


def _window_s(state: RunState, rate: float) -> float:
    return len(level_requests(state)) / rate + SETTLE_E2E * baseline_e2e(state)


def _servers_left(state: RunState) -> int:
    plan = state.plan
    slots = plan.confirm_slots if plan.confirm_slots is not None else max(len(plan.confirm or [BASELINE.name]) - 1, 0)
    searched = sum(1 for vr in state.results.variants if vr.capacity is not None and vr.capacity.levels)
    return max(1, 1 + slots - searched)


def _saturates(state: RunState) -> bool | None:
    """Whether the baseline's measured replay fell behind the recorded arrivals (None: not measured)."""
    from runinfra_opt.load.store import read_run

    baseline = state.results.variant(BASELINE.name)
    found = next((lr for lr in baseline.load if lr.level == "replay"), None) if baseline else None
    if found is None or found.records is None:
        return None
    records = list(read_run(state.run_dir / found.records).records)
    # the recorded requests once: one round, which the capacity levels' round-over-round queue rule cannot judge;
    # the thirds of sends err towards "saturated" where a recording ends in its bursts, which leaves the decision
    # to throughput, as without capacity
    grew, _ = search_rules.queue_grew(records, baseline_e2e(state))
    return grew or any(not r.success for r in records)


def _active(state: RunState, variant: Variant) -> CapacitySummary | None:
    """The run's capacity summary when this variant's capacity is to be searched (created the first time)."""
    if state.results.capacity is not None:
        return state.results.capacity
    if state.config.objective.on_capacity:
        return _summary(state, "--priority capacity")
    if variant.name == BASELINE.name and may_decide(state) and _saturates(state) is False:
        return _summary(state, UNSATURATED)
    return None


def pending(state: RunState, variant: Variant) -> bool:
    """Whether `search` has a rate left to offer this variant (a resumed or adopted run may have none)."""
    if state.results.capacity is None and not state.config.objective.on_capacity and variant.name != BASELINE.name:
        return False
    vc = state.variant_result(variant).capacity
    return vc is None or vc.status is None and vc.note is None


def run_level(state: RunState, variant: Variant, rate: float, path: Path) -> CapacityLevel:
    """One run of the offered `rate` on the variant's server, its records at `path` (under the run directory when
    relative), judged (`judge`); the level names its records relative to the run directory where it can."""
    from runinfra_opt.load.store import RecordWriter, read_run

    engine = cast(LoadServer, state.engine)
    where = state.run_dir / path
    started = time.perf_counter()
    with RecordWriter(where) as writer:
        measured = engine.run_load(
            variant, offered(state, rate), level_requests(state), max_tokens=state.max_tokens, sink=writer
        )
    level = judge(state, read_run(where), rate, measured.preemptions, measured.kv_cache_peak)
    level.records = path.as_posix() if not path.is_absolute() else str(path)
    level.wall_s = round(time.perf_counter() - started, 2)
    return level


def _warmup_requests(state: RunState) -> list[Request]:
    """What one offered rate sends (`level_requests`), sent at a rate rising from one request in flight to the
    highest measurable rate (`load.capacity.ramp`), as arrival times the recorded arrivals' replay follows."""
    requests = level_requests(state)
    times = search_rules.ramp(len(requests), baseline_e2e(state))
    return [dataclasses.replace(r, arrival_s=at) for r, at in zip(requests, times, strict=True)]


def _warmup_window_s(state: RunState) -> float:
    sends = [r.arrival_s or 0.0 for r in _warmup_requests(state)]
    return max(sends, default=0.0) + SETTLE_E2E * baseline_e2e(state)


def warm_up(state: RunState, variant: Variant) -> float:
    """What one offered rate sends, once, at a rate rising to the highest measurable one (`_warmup_requests`) and
    judged by nothing, so that the first rate judged is not the server's first heavy load; its records go to
    `capacity.warmup_records`, where the capacity predictions read the steps' cost at every batch size the searched
    rates reach (`optimize.serving.capacity`). Returns its seconds."""
    from runinfra_opt.load.store import RecordWriter

    engine = cast(LoadServer, state.engine)
    vc = state.variant_result(variant).capacity
    assert vc is not None
    path = Path("load") / safe_name(variant.name) / "capacity-warmup.jsonl"
    started = time.perf_counter()
    with RecordWriter(state.run_dir / path) as writer:
        engine.run_load(variant, Replay(), _warmup_requests(state), max_tokens=state.max_tokens, sink=writer)
    vc.warmup_records = path.as_posix()
    return round(time.perf_counter() - started, 2)


def _run_again(
    state: RunState, variant: Variant, rate: float, purpose: Literal["search", "unclear", "confirm"] = "search"
) -> CapacityLevel:
    """One more run of `rate` (`run_level`; the n-th run of a rate: `capacity-<rate>-<n>.jsonl`), kept in the
    variant's levels (saved) with why it was run."""
    vc = state.variant_result(variant).capacity
    assert vc is not None
    before = sum(1 for level in vc.levels if level.rate == rate)
    name = f"capacity-{rate:g}.jsonl" if not before else f"capacity-{rate:g}-{before + 1}.jsonl"
    level = run_level(state, variant, rate, Path("load") / safe_name(variant.name) / name)
    level.purpose = purpose
    vc.levels.append(level)
    state.save()
    return level


def _unconfirmed(estimate: search_rules.Estimate | None, levels: list[CapacityLevel]) -> float | None:
    """The capacity a search found when it rests on one run, else None. Near the knee one run's verdict does not
    repeat on one server with the same schedule, by far more than its requests' count explains (docs/measurements.md,
    capacity_search.py), so the rate a user provisions by is run once more and judged on both runs pooled; missed,
    the search goes on below it."""
    if estimate is None or estimate.status == "below":
        return None
    runs = [level for level in levels if level.rate == estimate.value]
    return estimate.value if len(runs) == 1 else None


def _verdict_text(runs: list[CapacityLevel], passed: bool, attainment: float) -> str:
    if len(runs) == 1:
        return "sustained" if passed else f"missed: {runs[0].reason}"
    shares = ", ".join(search_rules.share_text(run.attained, attainment) for run in runs if run.attained is not None)
    verdict = "sustained" if passed else "missed"
    if not shares:  # no SLO: keeping up is the verdict
        kept = ", ".join("kept up" if run.kept_up else "fell behind" for run in runs)
        return f"{len(runs)} runs ({kept}), pooled: {verdict}"
    return f"{len(runs)} runs ({shares} within the SLOs), pooled: {verdict}"


def search(state: RunState, variant: Variant, repredict: Callable[[], None] | None = None) -> None:
    """The variant's capacity, searched on its server (see the module's docstring); resumable per level.
    `repredict`: predicts every variant's capacity again (`optimize.serving.predict_capacity`), called once the
    server has warmed up, so the search starts from a prediction that has seen this server's steps under load."""
    summary = _active(state, variant)
    if summary is None:
        return
    vr = state.variant_result(variant)
    vc = vr.capacity or VariantCapacity()
    vr.capacity = vc
    if variant.is_speculative and any(disqualifying(r) for r in vr.measured_requests):
        vc.note = "not searched: its greedy output differs from the baseline's (it cannot win)"
        state.save()
        return
    if saved_nothing(vr):
        vc.note = "not searched: no target pass at batch 1 produced more than one token (it cannot win)"
        state.save()
        return
    e2e = baseline_e2e(state)
    share = max(state.budget_left(), 0.0) / _servers_left(state)
    warmup = _warmup_window_s(state) if vc.warmup_records is None else 0.0
    window = _window_s(state, vc.search_start or vc.predicted or 1.0 / max(e2e, 1e-3))
    runs_allowed = int(max(share - warmup, 0.0) // window)
    said = any(text.startswith(f"{variant.name}: --budget-minutes left") for text in summary.budget_ran_out)
    if runs_allowed < 1 and not vc.levels and not said:
        # the least a search measures (a warm-up and one rate), over the budget: said, so a run that takes longer
        # than --budget-minutes says where
        text = (
            f"{variant.name}: --budget-minutes left {share:.0f} s for its search; its warm-up and one offered rate, "
            f"the least a search measures, take about {warmup + window:.0f} s"
        )
        summary.budget_ran_out.append(text)
        state.reporter.note(f"capacity search over the budget: {text}")
    if not summary.plan:
        servers = _servers_left(state)
        most = search_rules.MAX_LEVELS + REPEATS + 1
        text = (
            f"capacity search: a warm-up, then up to {search_rules.MAX_LEVELS} offered rates (and {REPEATS} runs "
            f"more of a rate whose verdict is unclear, one more of the capacity found) x ~{window:.0f} s each "
            f"({summary.requests_per_level} requests, {summary.arrivals} arrivals) per server, for {servers} "
            f"server(s): about {most * window * servers / 60:.1f} min; --budget-minutes leaves room for "
            f"{max(1, min(search_rules.MAX_LEVELS, runs_allowed))} rate(s) per server"
        )
        summary.plan.append(text)
        state.reporter.note(text)
    warmed = False
    if vc.search_start is None:
        vc.before_warmup = vc.predicted
        vc.warmup_s = round((vc.warmup_s or 0.0) + warm_up(state, variant), 2)
        warmed = True
        if repredict is not None:
            repredict()  # `predict` updates this variant's `predicted` in place
        vc.search_start = vc.predicted if vc.predicted else 1.0 / max(e2e, 1e-3)
        runs_allowed = int(max(share - vc.warmup_s, 0.0) // _window_s(state, vc.search_start))
        state.save()
    start = vc.search_start
    allowed = max(1, min(search_rules.MAX_LEVELS, runs_allowed))
    rules = search_rules.RateSearch(
        start, max_levels=max(allowed, len(vc.levels)), ceiling=ceiling(state), floor=search_rules.floor(e2e)
    )
    attainment = state.config.slo_attainment
    tried = search_rules.pooled(vc.levels, attainment)
    left = rules.next_rate(tried) is not None or _unconfirmed(rules.estimate(tried), vc.levels) is not None
    if not warmed and left:  # a resumed search: its server is a fresh one
        vc.warmup_s = round((vc.warmup_s or 0.0) + warm_up(state, variant), 2)
    repeats = sum(1 for level in vc.levels if level.purpose == "unclear")  # a resumed search keeps count
    while True:
        while (rate := rules.next_rate(tried)) is not None:
            rate = float(f"{rate:.3g}")
            if any(rate == r for r, _ in tried):
                break  # rounding met a rate already offered: the bracket is as tight as the rates can show
            runs: list[CapacityLevel] = []
            while not runs or search_rules.unclear(runs, attainment) and len(runs) < 2:
                if runs and repeats >= REPEATS:
                    break
                if runs and len(vc.levels) >= runs_allowed:
                    summary.budget_ran_out.append(
                        f"{variant.name}: the verdict at {rate:g} requests/s is unclear and the budget left no time "
                        "to run it again"
                    )
                    break
                level = _run_again(state, variant, rate, "unclear" if runs else "search")
                repeats += 1 if runs else 0
                runs.append(level)
            tried = search_rules.pooled(vc.levels, attainment)
            passed = dict(tried)[rate]
            state.reporter.note(f"{variant.name} at {rate:g} requests/s: {_verdict_text(runs, passed, attainment)}")
        confirm = _unconfirmed(rules.estimate(tried), vc.levels)
        if confirm is None:
            break
        if len(vc.levels) >= runs_allowed:
            summary.budget_ran_out.append(
                f"{variant.name}: its capacity, {confirm:g} requests/s, was sustained on one run; the budget left no "
                "time to run it again"
            )
            break
        _run_again(state, variant, confirm, "confirm")
        tried = search_rules.pooled(vc.levels, attainment)
        runs = [level for level in vc.levels if level.rate == confirm]
        passed = dict(tried)[confirm]
        state.reporter.note(
            f"{variant.name} at {confirm:g} requests/s, run again to confirm it: "
            f"{_verdict_text(runs, passed, attainment)}"
        )
    estimate = rules.estimate(tried)
    if estimate is None:
        return
    if estimate.status == "below":
        vc.note = (
            f"missed every rate offered, down to {min(r for r, _ in tried):.3g}/s, where requests rarely overlap: the "
            "SLOs are not met even without contention"
        )
    if estimate.status == "at_least":
        vc.note = (
            f"sustained the highest rate {summary.requests_per_level} requests can measure ({estimate.value:.3g}/s, a "
            f"schedule of {search_rules.MIN_SPAN_E2E:g} batch-1 request lengths): more requests "
            "(--capacity-requests) would measure higher"
        )
    vc.measured = estimate.interval()
    unlimited = dataclasses.replace(rules, max_levels=len(tried) + 1)
    unfinished = unlimited.next_rate(tried) is not None  # more rates would have narrowed it: the levels ran out
    vc.status = "stopped" if unfinished else estimate.status  # type: ignore[assignment]
    if unfinished and allowed < search_rules.MAX_LEVELS:
        summary.budget_ran_out.append(
            f"{variant.name}: the budget allowed {allowed} rate(s); the answer is "
            f"[{estimate.low:g}, {estimate.high:g}] requests/s, not yet within {rules.tolerance:.0%}"
        )
    state.save()
