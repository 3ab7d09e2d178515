"""The run's `Decision`: one pure function of what each scope decided, built once at the end of a run.

The scopes: batch 1 (`decision.batch1`), each load level (`decision.levels`), capacity (`decision.capacity`); a k
schedule enters through the eligibility every scope reads (`decision.eligibility`). Which scope's answer is the
run's:

1. **Capacity**, when this run searched it and capacity tells the variants apart (`--priority capacity`, or
   throughput at a recorded load that does not saturate the server).
2. **A fallback**, when capacity was asked for but decides nothing (a lower bound stands between the baseline and a
   variant): throughput where the server was loaded, at the most loaded closed-loop level measured, else at batch
   1. The same for `--priority capacity` and for throughput at an unsaturated recorded load; never the recorded
   load's own decision, which ranks only the offered load.
3. **The recorded load** (`replay`), when it was measured: it is what the deployment serves.
4. **Batch 1**, with the per-level winners reported beside it.

The reason is assembled from the parts that decided; `--require-speedup`'s exit code follows the winner, here and
nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.methods import BASELINE
from runinfra_opt.objective import Objective
from runinfra_opt.optimize.decision import batch1 as batch1_scope
from runinfra_opt.optimize.decision import capacity as capacity_scope
from runinfra_opt.optimize.decision import levels as levels_scope
from runinfra_opt.optimize.decision.rule import UNITY
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import Decision, Interval, LevelDecision, QueueSimulation, RunResults
from runinfra_opt.results.capacity import UNSATURATED


@dataclass(frozen=True)
class _Part:
    """The winner one scope (or a fallback) gives the run, and the words for it."""

    winner: str
    gain: Interval | None
    ttft_change: float | None
    reason: str

    @property
    def speculation(self) -> bool:
        return self.winner != BASELINE.name


def decide(
    results: RunResults,
    objective: Objective | None = None,
    *,
    seed: int = 0,
    arrivals: Mapping[str, float | None] | None = None,
) -> Decision:
    """The run's decision from every scope it measured (see the module's docstring). Fills the scopes' own views
    (`results.load.decisions`, crossovers, `results.capacity`'s rows and reason, each variant's `ruled_out`).
    `arrivals` (request id -> recorded arrival): for the queueing simulation of a run without load levels. Raises
    `NoFeasibleVariantError` when nothing satisfies the constraints at batch 1."""
    objective = objective or Objective()
    batch1 = batch1_scope.decide(results, objective, seed=seed)
    deploy = levels_scope.decide_levels(results, objective)
    part = _at_the_recorded_load(results, batch1, deploy, objective.percentile)
    capacity = capacity_scope.decide(results, objective)
    if capacity is not None and capacity.decided:
        part = _by_capacity(results, capacity, part)
    elif capacity is not None and (objective.on_capacity or capacity.summary.why == UNSATURATED):
        part = fall_back(results, batch1, part, f"{capacity.summary.why}; {capacity.unknown}")
    speculation = part.speculation
    gate = objective.require_speedup and not speculation
    return Decision(
        winner=part.winner,
        speculation=speculation,
        priority=objective.priority,
        reason=part.reason,
        gain=part.gain if speculation else UNITY,
        ttft_change=part.ttft_change,
        per_category=batch1.per_category,
        queue=_queue(results, arrivals, part.winner) if results.load is None and arrivals is not None else [],
        exit_code=int(ExitCode.GATE_FAILED if gate else ExitCode.OK),
        disqualified=batch1.disqualified,
    )


def _at_the_recorded_load(
    results: RunResults, batch1: batch1_scope.Batch1, deploy: LevelDecision | None, percentile: str
) -> _Part:
    """Batch 1's decision, or the recorded load's where it was measured, with the per-level winners beside it."""
    own = _Part(batch1.winner, batch1.gain, batch1.ttft_change, batch1.reason)
    summary = results.load
    if summary is None:
        return own
    per_level = "; ".join(f"{d.level}: {d.winner}" for d in summary.decisions)
    if deploy is None:
        return _Part(
            own.winner, own.gain, own.ttft_change, f"{own.reason} Under load (per level, measured): {per_level}."
        )
    scale = f", time x{summary.time_scale:g}" if summary.time_scale != 1 else ""
    reason = (
        f"At the recorded load (replay{scale}): {deploy.reason} At batch 1 the choice was {batch1.winner}. "
        f"Per level: {per_level}."
    )
    if deploy.winner == batch1.winner:
        return _Part(own.winner, own.gain, own.ttft_change, reason)
    ttft_change = own.ttft_change
    base, winner = results.variant(BASELINE.name), results.variant(deploy.winner)
    base_lr = levels_scope.at(base, deploy.level) if base else None
    win_lr = levels_scope.at(winner, deploy.level) if winner else None
    if base_lr and win_lr:
        mine, theirs = win_lr.metrics.ttft_s.get(percentile), base_lr.metrics.ttft_s.get(percentile)
        ttft_change = (mine / theirs - 1) if mine is not None and theirs else None
    gain = deploy.gain if deploy.winner != BASELINE.name else UNITY
    return _Part(deploy.winner, gain, ttft_change, reason)


def _by_capacity(results: RunResults, capacity: capacity_scope.ByCapacity, previous: _Part) -> _Part:
    """Capacity's winner, with what throughput chose quoted beside it."""
    assert capacity.winner is not None
    summary = capacity.summary
    latency = capacity_scope.latency_at_replay(results, capacity.winner) if summary.why == UNSATURATED else ""
    verb = "chose" if capacity.winner != previous.winner else "also chose"
    reason = f"{summary.reason}{latency} (By throughput the run {verb} {previous.winner}: {previous.reason})"
    return _Part(capacity.winner, capacity.gain, previous.ttft_change, reason)


def fall_back(results: RunResults, batch1: batch1_scope.Batch1 | None, previous: _Part, why: str) -> _Part:
    """Capacity was asked for and decides nothing (`why`): throughput where the server was loaded, at the most loaded
    closed-loop level measured, else at batch 1. Never the recorded load's own decision: there every variant
    streams the offered load, so its ranking says nothing; and never "keep the baseline" merely because every
    variant kept up."""
    closed = [d for d in (results.load.decisions if results.load else []) if d.level.startswith("concurrency:")]
    level = max(closed, key=lambda d: int(d.level.split(":")[1]), default=None)
    if level is not None:
        winner, gain = level.winner, level.gain
        text = f"by throughput at {level.level}, the most loaded level measured: {level.reason}"
    elif batch1 is not None:
        winner, gain, text = batch1.winner, batch1.gain, f"by throughput at batch 1: {batch1.reason}"
    else:
        return previous
    gain = gain if winner != BASELINE.name else UNITY
    replay = results.load is not None and results.load.deploy_level is not None
    if why.startswith(UNSATURATED):
        beside = f" (At the recorded load every variant kept up: {previous.reason})"
    elif replay:
        beside = f" (The recorded load, which a fallback never decides by: {previous.reason})"
    else:
        beside = ""
    return _Part(winner, gain, previous.ttft_change, f"Capacity does not decide ({why}): {text}{beside}")


def _queue(results: RunResults, arrivals: Mapping[str, float | None], winner: str) -> list[QueueSimulation]:
    """TTFT including queueing under the recorded arrivals (simulated single-replica FIFO), for the baseline
    and the winner, from their measured service times. Empty when the workload records no arrivals."""
    from runinfra_opt.optimize.queueing import simulate_variants

    names = [BASELINE.name] + ([winner] if winner != BASELINE.name else [])
    records: dict[str, list[RequestRecord]] = {}
    for name in names:
        vr = results.variant(name)
        if vr is not None and vr.measured_requests:
            records[name] = vr.measured_requests
    return simulate_variants(dict(arrivals), records)
