"""The capacity decision (`decide`, from the decide phase), on what `optimize.capacity` measured: servers =
ceil(target / capacity); fewest servers, then the most headroom, then the simpler variant; a speculative winner
must be lossless and sustain a rate the baseline missed (its capacity above the baseline's interval). Measured
capacities only; predicted ones are shown. Where a capacity is only a lower bound between the baseline and a
variant, capacity decides nothing and the throughput decision stands (`_fall_back` at a recorded load that does
not saturate the server).
"""

from __future__ import annotations

import math

from runinfra_opt.load import capacity as search_rules
from runinfra_opt.load.capacity import rate_text
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.objective import rank
from runinfra_opt.optimize.capacity import UNSATURATED
from runinfra_opt.optimize.select import saved_nothing, simplicity_key
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import CapacityRow, CapacitySummary, Decision, Interval, RunResults, VariantResult


def _mean_output_tokens(vr: VariantResult) -> float | None:
    rows = vr.measured_requests or vr.predicted_requests
    return sum(r.output_tokens for r in rows) / len(rows) if rows else None


def _rows(results: RunResults, summary: CapacitySummary) -> list[CapacityRow]:
    from runinfra_opt.optimize.underload import eligible

    rows = []
    target, price = summary.target_rate, summary.server_cost_per_hour
    for vr in results.variants:
        vc = vr.capacity
        if vc is None:
            continue
        if vc.measured is not None:
            value, low, high, source = vc.measured.value, vc.measured.low, vc.measured.high, "measured"
        elif vc.predicted is not None:
            value, low, high, source = vc.predicted, None, None, "predicted"
        else:
            continue
        servers = search_rules.servers_needed(target, value) if target is not None else None
        headroom = servers * value / target - 1 if servers is not None and target else None
        cost = servers * price if servers is not None and price is not None else None
        tokens = _mean_output_tokens(vr)
        per_million = None
        if price is not None and tokens and value > 0:
            per_hour, rate = (cost, target) if cost is not None and target else (price, value)
            per_million = per_hour / (rate * tokens * 3600) * 1e6 if per_hour is not None else None
        why_not = None
        if vr.disqualified or vr.failed:
            why_not = vr.disqualified or vr.failed
        elif source == "predicted":
            why_not = "predicted only"
        elif saved_nothing(vr):
            why_not = "saved no target pass at batch 1"
        elif not eligible(results, vr):
            why_not = "not measured at batch 1"
        elif vc.status == "below":
            why_not = "sustained none of the rates offered"
        rows.append(
            CapacityRow(
                variant=vr.name, capacity=round(value, 4), low=low, high=high, source=source,  # type: ignore[arg-type]
                servers=servers, headroom=headroom, cost_per_hour=cost, cost_per_million_tokens=per_million,
                eligible=why_not is None, why_not=why_not,
            )
        )  # fmt: skip
    return rows


def _open_ended(results: RunResults, name: str) -> bool:
    """The variant's server kept up at every rate tried: its capacity is only a lower bound (the search stopped at
    the highest rate its requests can measure, or at the budget, before any rate was missed)."""
    vr = results.variant(name)
    vc = vr.capacity if vr is not None else None
    if vc is None or vc.measured is None or not vc.levels:
        return False
    attainment = results.capacity.attainment if results.capacity is not None else 1.0
    return all(sustained for _, sustained in search_rules.pooled(vc.levels, attainment))


def _unresolved(results: RunResults, base: CapacityRow, speculative: list[CapacityRow]) -> list[str]:
    """Why the baseline cannot be said to carry the most traffic: a lower bound on one side that no bracket on the
    other side separates (a variant kept up at every rate tried below the baseline's bound, or the baseline kept up
    at every rate tried above a variant's sustained rates)."""
    why = []
    base_open = _open_ended(results, base.variant)
    for row in speculative:
        if not row.eligible or row.source != "measured":
            continue
        if _open_ended(results, row.variant):
            why.append(f"{row.variant} kept up at every rate tried (at least {rate_text(row.capacity)} requests/s)")
        elif base_open and (row.high is None or row.high >= base.capacity):
            why.append(
                f"the baseline kept up at every rate tried (at least {rate_text(base.capacity)} requests/s), and "
                f"{row.variant}'s capacity ({_rate_text(row)}) is not below that"
            )
    return why


def _rate_text(row: CapacityRow) -> str:
    if row.low is not None and row.high is not None and row.high > row.low:
        return f"{rate_text(row.capacity)} requests/s [{rate_text(row.low)}, {rate_text(row.high)}]"
    return f"{rate_text(row.capacity)} requests/s"


def decide(state: RunState, decision: Decision, batch1: Decision | None = None) -> None:
    """The decision by capacity (see the module's docstring) into `results.capacity` and `decision`. `batch1`: the
    decision at batch 1, before the load levels had their say (the fallback of `_fall_back`)."""
    results, config = state.results, state.config
    summary = results.capacity
    if summary is None:
        if config.objective.on_capacity:
            results.add_note("no capacity was searched (no launched variant): the decision stands on throughput")
        return
    summary.rows = _rows(results, summary)
    by_name = {row.variant: row for row in summary.rows}
    base = by_name.get(BASELINE.name)
    if base is None or base.source != "measured":
        results.add_note("the baseline's capacity was not measured: capacity decides nothing in this run")
        return

    def ranked(rows: list[CapacityRow]) -> list[CapacityRow]:
        """Fewest servers first; among equal counts the most capacity, within `TIE` the simpler variant."""

        def simplicity(row: CapacityRow) -> tuple[int, int, int, str]:
            return simplicity_key(results, Variant.from_dict(results.variant(row.variant).variant))  # type: ignore[union-attr]

        def count(row: CapacityRow) -> float:  # no server count: no target (all alike), or no rate sustained (last)
            return row.servers if row.servers is not None else (math.inf if summary.target_rate else 0)

        out: list[CapacityRow] = []
        for servers in sorted({count(row) for row in rows}):
            out += rank([row for row in rows if count(row) == servers], lambda row: row.capacity, simplicity)
        return out

    eligible_rows = [row for row in summary.rows if row.eligible]
    speculative = [row for row in ranked(eligible_rows) if row.variant != BASELINE.name]
    base_high = base.high if base.high is not None else base.capacity
    paying = [row for row in speculative if row.low is not None and row.low > base_high]
    candidates = ranked([base, *paying])
    winner = candidates[0]
    unknown = _unresolved(results, base, speculative)
    if unknown and (winner.variant == BASELINE.name or _open_ended(results, base.variant)):
        results.add_note(
            f"capacity decides nothing in this run: {'; '.join(unknown)}; more requests per rate "
            "(--capacity-requests) or a larger --budget-minutes would bracket it. The decision stands on throughput."
        )
        summary.reason = f"undecided by capacity: {'; '.join(unknown)}"
        if summary.why == UNSATURATED:
            _fall_back(results, decision, batch1, "; ".join(unknown))
            _gate(state, decision)
        return
    target = summary.target_rate
    servers = ""
    if target is not None and winner.servers:
        servers = f"; {rate_text(target)} requests/s need {winner.servers} server(s)"
    if winner.variant == BASELINE.name:
        if speculative:
            best = speculative[0]
            why = (
                f"its capacity does not exceed the baseline's interval (up to {rate_text(base_high)})"
                if best not in paying
                else "it needs more servers"
            )
            text = (
                f"baseline {_rate_text(base)}: the best speculative variant, {best.variant} ({_rate_text(best)}), "
                f"does not pay: {why}"
            )
        else:
            text = f"baseline {_rate_text(base)}: no lossless speculative variant's capacity was measured"
    else:
        text = f"{winner.variant}: {_rate_text(winner)} vs the baseline's {_rate_text(base)}"
    slo = _slo_text(summary)
    reason = f"By capacity ({summary.why}; {slo}): {text}{servers}."
    summary.winner, summary.reason = winner.variant, reason
    changed, previous = winner.variant != decision.winner, decision.winner
    decision.winner = winner.variant
    decision.speculation = winner.variant != BASELINE.name
    if decision.speculation:
        decision.gain = (
            Interval(
                value=winner.capacity / base.capacity,
                low=(winner.low or winner.capacity) / base_high,
                high=(winner.high or winner.capacity) / max(base.low or base.capacity, 1e-9),
            )
            if base.capacity > 0 and base_high > 0
            else None  # the baseline sustained none of the rates offered: no ratio
        )
    else:
        decision.gain = Interval(value=1.0, low=1.0, high=1.0)
    latency = _latency_at_replay(results, winner.variant) if summary.why == UNSATURATED else ""
    verb = "chose" if changed else "also chose"
    decision.reason = f"{reason}{latency} (By throughput the run {verb} {previous}: {decision.reason})"
    _gate(state, decision)


def _gate(state: RunState, decision: Decision) -> None:
    """`--require-speedup`: the exit code follows the decision."""
    if state.config.objective.require_speedup:
        from runinfra_opt.exitcodes import ExitCode

        decision.exit_code = int(ExitCode.OK if decision.speculation else ExitCode.GATE_FAILED)


def _fall_back(results: RunResults, decision: Decision, batch1: Decision | None, unknown: str) -> None:
    """Throughput at a recorded load that does not saturate the server, where capacity decides nothing either: the
    recorded load's own decision ranks only the offered load, so the decision is throughput where the server was
    loaded, at the most loaded closed-loop level measured, else at batch 1. Never "keep the baseline" merely because
    every variant kept up."""
    closed = [d for d in (results.load.decisions if results.load else []) if d.level.startswith("concurrency:")]
    level = max(closed, key=lambda d: int(d.level.split(":")[1]), default=None)
    if level is not None:
        winner, gain, text = (
            level.winner,
            level.gain,
            f"by throughput at {level.level}, the most loaded level measured: {level.reason}",
        )
    elif batch1 is not None:
        winner, gain, text = batch1.winner, batch1.gain, f"by throughput at batch 1: {batch1.reason}"
    else:
        return
    speculation = winner != BASELINE.name
    previous = decision.reason
    decision.winner, decision.speculation = winner, speculation
    decision.gain = gain if speculation else Interval(value=1.0, low=1.0, high=1.0)
    decision.reason = (
        f"Capacity does not decide ({UNSATURATED}; {unknown}): {text} (At the recorded load every variant kept up: "
        f"{previous})"
    )


def _slo_text(summary: CapacitySummary) -> str:
    if summary.criterion == "saturation":
        return "no SLO given: the highest rate the server keeps up with"
    parts = []
    if summary.slo_ttft_ms is not None:
        parts.append(f"TTFT <= {summary.slo_ttft_ms:g} ms")
    if summary.slo_tpot_ms is not None:
        parts.append(f"TPOT <= {summary.slo_tpot_ms:g} ms")
    return f"{summary.attainment:.0%} of requests within {' and '.join(parts)}"


def _latency_at_replay(results: RunResults, winner: str) -> str:
    """The winner's latency change against the baseline at the recorded load (e2e p50, TTFT p95)."""

    def at(name: str) -> tuple[float | None, float | None]:
        vr = results.variant(name)
        lr = next((x for x in vr.load if x.level == "replay"), None) if vr else None
        return (lr.metrics.e2e_s.get("p50"), lr.metrics.ttft_s.get("p95")) if lr else (None, None)

    if winner == BASELINE.name:
        return ""
    (e2e, ttft), (base_e2e, base_ttft) = at(winner), at(BASELINE.name)
    parts = []
    if e2e and base_e2e:
        parts.append(f"e2e p50 {e2e / base_e2e - 1:+.0%} ({e2e * 1000:.0f} vs {base_e2e * 1000:.0f} ms)")
    if ttft and base_ttft:
        parts.append(f"TTFT p95 {ttft / base_ttft - 1:+.0%}")
    return f" At the recorded load: {', '.join(parts)}." if parts else ""
