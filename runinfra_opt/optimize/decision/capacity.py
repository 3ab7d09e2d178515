"""The capacity scope (`decide`), on what `optimize.capacity` measured: servers = ceil(target / capacity); by
`decision.rule` with the ranking fewest servers, then the most capacity, then (within `TIE`) the simpler variant;
a speculative winner must be eligible (`decision.eligibility`) and pay: sustain a rate the baseline missed (its
capacity's bracket above the baseline's). Measured capacities only; predicted ones are shown. Where a capacity is
only a lower bound between the baseline and a variant, capacity decides nothing (`ByCapacity.unknown`), and the
run's decision falls back as `decision.run` says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from runinfra_opt.load import capacity as search_rules
from runinfra_opt.load.capacity import rate_text
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.objective import Objective, rank
from runinfra_opt.optimize.decision import eligibility
from runinfra_opt.optimize.decision.rule import UNITY, Scope, by_throughput, pays, simplicity_key
from runinfra_opt.results import CapacityRow, CapacitySummary, Interval, RunResults, VariantResult


def _mean_output_tokens(vr: VariantResult) -> float | None:
    rows = vr.measured_requests or vr.predicted_requests
    return sum(r.output_tokens for r in rows) / len(rows) if rows else None


def _rows(results: RunResults, summary: CapacitySummary) -> list[CapacityRow]:
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
        why_not = eligibility.why_not(results, vr)
        if source == "predicted" and not (vr.disqualified or vr.failed):
            why_not = "predicted only"
        elif why_not is None and vc.status == "below":
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


@dataclass(frozen=True)
class ByCapacity:
    """What capacity said in this run (`decide`): a winner (`decided`), or why it cannot tell the variants apart
    (`unknown`). `reason` is `summary.reason`."""

    summary: CapacitySummary
    winner: str | None = None
    gain: Interval | None = None
    """The winner's capacity over the baseline's (low: its sustained rate over the baseline's missed one); `UNITY`
    for the baseline; None where the baseline sustained no rate offered."""
    unknown: str | None = None

    @property
    def decided(self) -> bool:
        return self.winner is not None


def decide(results: RunResults, objective: Objective) -> ByCapacity | None:
    """The decision by capacity (see the module's docstring) into `results.capacity`; None when this run has no
    capacity to decide on (nothing searched, or the baseline's capacity not measured: it says so in the notes)."""
    summary = results.capacity
    if summary is None:
        if objective.on_capacity:
            results.add_note("no capacity was searched (no launched variant): the decision stands on throughput")
        return None
    summary.rows = _rows(results, summary)
    summary.winner, summary.reason = None, None
    by_name = {row.variant: row for row in summary.rows}
    base = by_name.get(BASELINE.name)
    if base is None or base.source != "measured":
        results.add_note("the baseline's capacity was not measured: capacity decides nothing in this run")
        return None

    def simplicity(row: CapacityRow) -> tuple[int, int, int, str]:
        return simplicity_key(results, Variant.from_dict(results.variant(row.variant).variant))  # type: ignore[union-attr]

    def ranked(rows: Sequence[CapacityRow]) -> list[CapacityRow]:
        """Fewest servers first; among equal counts the most capacity, within `TIE` the simpler variant."""

        def count(row: CapacityRow) -> float:  # no server count: no target (all alike), or no rate sustained (last)
            return row.servers if row.servers is not None else (math.inf if summary.target_rate else 0)

        out: list[CapacityRow] = []
        for servers in sorted({count(row) for row in rows}):
            out += rank([row for row in rows if count(row) == servers], lambda row: row.capacity, simplicity)
        return out

    base_high = base.high if base.high is not None else base.capacity

    def gain(row: CapacityRow) -> Interval | None:
        """The capacity ratio to the baseline, its interval from the brackets: pays when the rate it sustained
        (`low`) is above the lowest the baseline missed (`base_high`)."""
        if row.low is None:
            return None
        low = row.low / base_high if base_high > 0 else (math.inf if row.low > 0 else 0.0)
        if base.capacity <= 0 or base_high <= 0:
            return Interval(value=math.inf, low=low, high=math.inf)
        high = (row.high or row.capacity) / max(base.low or base.capacity, 1e-9)
        return Interval(value=row.capacity / base.capacity, low=low, high=high)

    speculative = [row for row in ranked([r for r in summary.rows if r.eligible]) if row.variant != BASELINE.name]
    outcome = by_throughput(
        Scope(base=base, baseline_ok=True, speculative=speculative, order=ranked, gain=gain, threshold=1.0)
    )
    winner = outcome.winner
    unknown = _unresolved(results, base, speculative)
    if unknown and (winner is base or _open_ended(results, base.variant)):
        results.add_note(
            f"capacity decides nothing in this run: {'; '.join(unknown)}; more requests per rate "
            "(--capacity-requests) or a larger --budget-minutes would bracket it. The decision stands on throughput."
        )
        summary.reason = f"undecided by capacity: {'; '.join(unknown)}"
        return ByCapacity(summary, unknown="; ".join(unknown))
    target = summary.target_rate
    servers = ""
    if target is not None and winner.servers:
        servers = f"; {rate_text(target)} requests/s need {winner.servers} server(s)"
    if winner is base:
        if outcome.best is not None:
            best = speculative[0]
            why = (
                "it needs more servers"
                if pays(gain(best), 1.0)
                else f"its capacity does not exceed the baseline's interval (up to {rate_text(base_high)})"
            )
            text = (
                f"baseline {_rate_text(base)}: the best speculative variant, {best.variant} ({_rate_text(best)}), "
                f"does not pay: {why}"
            )
        else:
            text = f"baseline {_rate_text(base)}: no lossless speculative variant's capacity was measured"
    else:
        text = f"{winner.variant}: {_rate_text(winner)} vs the baseline's {_rate_text(base)}"
    summary.winner = winner.variant
    summary.reason = f"By capacity ({summary.why}; {_slo_text(summary)}): {text}{servers}."
    ratio = gain(winner) if winner is not base else UNITY
    if ratio is not None and math.isinf(ratio.value):
        ratio = None  # the baseline sustained none of the rates offered: no ratio
    return ByCapacity(summary, winner=winner.variant, gain=ratio)


def _slo_text(summary: CapacitySummary) -> str:
    if summary.criterion == "saturation":
        return "no SLO given: the highest rate the server keeps up with"
    parts = []
    if summary.slo_ttft_ms is not None:
        parts.append(f"TTFT <= {summary.slo_ttft_ms:g} ms")
    if summary.slo_tpot_ms is not None:
        parts.append(f"TPOT <= {summary.slo_tpot_ms:g} ms")
    return f"{summary.attainment:.0%} of requests within {' and '.join(parts)}"


def latency_at_replay(results: RunResults, winner: str) -> str:
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
