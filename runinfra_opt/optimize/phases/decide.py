"""Phase `decide`: the run's decision, on measured figures only (`optimize.decision.decide`).

Reads the confirmed variants' measured records, the load levels and capacity measured, and `config.objective`
(priority and constraints). Fills `results.decision` once, with the queueing simulation of the baseline and the
winner under the recorded arrivals. Raises `NoFeasibleVariantError` (status `no_feasible`) when no variant
satisfies the constraints.
"""

from __future__ import annotations

from runinfra_opt.optimize.state import RunState


def run(state: RunState) -> None:
    from runinfra_opt.errors import NoFeasibleVariantError
    from runinfra_opt.optimize.decision import decide

    config, results = state.config, state.results
    try:
        results.decision = decide(
            results, config.objective, seed=config.seed, arrivals={r.id: r.arrival_s for r in state.requests}
        )
    except NoFeasibleVariantError:
        results.status = "no_feasible"
        results.phase = "decide"
        state.save()
        raise
