"""Phase `decide`: pick the winner on measured figures only (`optimize.select.decide`).

Reads the confirmed variants' measured records and `config.objective` (priority and constraints). Fills
`results.decision`, with the queueing simulation of the baseline and the winner under the recorded arrivals.
Raises `NoFeasibleVariantError` (status `no_feasible`) when no variant satisfies the constraints.
"""

from __future__ import annotations

from runinfra_opt.methods import BASELINE
from runinfra_opt.optimize import capacity_decision, underload
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import QueueSimulation


def run(state: RunState) -> None:
    from runinfra_opt.errors import NoFeasibleVariantError
    from runinfra_opt.optimize.select import decide

    config, results = state.config, state.results
    try:
        decision = decide(results, config.objective, seed=config.seed)
    except NoFeasibleVariantError:
        results.status = "no_feasible"
        results.phase = "decide"
        state.save()
        raise
    batch1 = decision.model_copy(deep=True)
    underload.decide_levels(state, decision)  # per load level; at the recorded load, its winner is the decision
    capacity_decision.decide(state, decision, batch1)  # by capacity at the SLOs, when this run searched it
    decision.queue = _queue(state, decision.winner) if results.load is None else []
    results.decision = decision


def _queue(state: RunState, winner: str) -> list[QueueSimulation]:
    """TTFT including queueing under the recorded arrivals (simulated single-replica FIFO), for the baseline
    and the winner, from their measured service times. Empty when the workload records no arrivals."""
    from runinfra_opt.optimize.queueing import simulate_variants

    arrivals = {r.id: r.arrival_s for r in state.requests}
    names = [BASELINE.name] + ([winner] if winner != BASELINE.name else [])
    records = {}
    for name in names:
        vr = state.results.variant(name)
        if vr is not None and vr.measured_requests:
            records[name] = vr.measured_requests
    return simulate_variants(arrivals, records)
