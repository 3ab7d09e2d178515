"""The load-level scope: the winner at each load level, on that level's measured figures, and the crossovers.

Per level, among the variants `decision.eligibility` lets win beyond batch 1 and within the TTFT constraints at the
level (`--max-ttft-ms`, `--max-ttft-regression`; with an SLO, `--slo-ttft-ms` / `--slo-tpot-ms`, not more than
`GOODPUT_SLACK` of goodput below the baseline's), `decision.rule` decides on the level's figure: output tokens/s
with the level's paired ratio to the baseline as its interval (`--priority throughput` and `capacity`), or TTFT at
`--percentile` with a flat `TIE` as its noise (`--priority ttft`: a speculative variant must be more than 1% faster
to the first token, or tied there and pay on throughput).

The crossover per method: the concurrency at which the ratio of the method's best variant (best at the lowest
level) to the baseline falls to 1, log-linear between the measured levels, with the interval from where the ratio's
95% bounds cross 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.objective import TIE, Objective
from runinfra_opt.optimize.decision.eligibility import eligible
from runinfra_opt.optimize.decision.rule import UNITY, Scope, by_throughput, by_ttft, simplicity_key
from runinfra_opt.optimize.level_repeats import ratio_text
from runinfra_opt.results import Crossover, Interval, LevelDecision, LevelResult, RunResults, VariantResult

GOODPUT_SLACK = 0.01
"""A variant's goodput share may fall this far below the baseline's (one request in a hundred) and still win."""


def at(vr: VariantResult, level: str) -> LevelResult | None:
    """The variant's result at `level`."""
    return next((lr for lr in vr.load if lr.level == level), None)


def _tokens(lr: LevelResult) -> float:
    interval = lr.metrics.output_tokens_per_s
    return interval.value if interval is not None else 0.0


def _ttft(lr: LevelResult, percentile: str) -> float | None:
    return lr.metrics.ttft_s.get(percentile)


@dataclass(frozen=True)
class _Row:
    """A variant's figures at one level, as `Objective.rank` reads them."""

    result: VariantResult
    level: LevelResult
    percentile: str

    @property
    def tokens_per_s(self) -> float:
        return _tokens(self.level)

    @property
    def ttft_s(self) -> float | None:
        return _ttft(self.level, self.percentile)


_BROKEN = {"--max-ttft-ms": "over --max-ttft-ms", "--max-ttft-regression": "regression over --max-ttft-regression"}


def level_decision(results: RunResults, level: str, objective: Objective) -> LevelDecision | None:
    """The winner at one level (None when the baseline was not measured there)."""
    baseline = results.variant(BASELINE.name)
    base = at(baseline, level) if baseline else None
    if baseline is None or base is None:
        return None
    percentile = objective.percentile
    base_ttft = _ttft(base, percentile)
    rows: list[_Row] = []
    excluded: list[str] = []
    for vr in results.variants:
        lr = at(vr, level)
        if lr is None or vr.name == BASELINE.name or not eligible(results, vr):
            continue
        ttft = _ttft(lr, percentile)
        unmeasured = ttft is None and objective.max_ttft_ms is not None  # no figure to hold to the cap
        broken = "--max-ttft-ms" if unmeasured else objective.broken_ttft_limit(ttft, base_ttft)
        if broken is not None:
            excluded.append(f"{vr.name} (TTFT {percentile} {_BROKEN[broken]})")
            continue
        if results.load and (results.load.slo_ttft_ms or results.load.slo_tpot_ms):
            mine, theirs = lr.metrics.goodput, base.metrics.goodput
            if mine is not None and theirs is not None and mine.value < theirs.value - GOODPUT_SLACK:
                excluded.append(f"{vr.name} (goodput {mine.value:.0%} below the baseline's {theirs.value:.0%})")
                continue
        rows.append(_Row(vr, lr, percentile))

    def simplicity(row: _Row) -> tuple[int, int, int, str]:
        return simplicity_key(results, Variant.from_dict(row.result.variant))

    scope = Scope(
        base=_Row(baseline, base, percentile),
        baseline_ok=True,
        speculative=rows,
        order=lambda pool: objective.rank(pool, simplicity),
        gain=lambda row: row.level.vs_baseline,
        threshold=objective.min_speedup,
    )
    tail = f" Left out: {', '.join(excluded)}." if excluded else ""
    if objective.on_ttft:
        return _on_ttft(level, scope, simplicity, percentile, tail)
    return _on_throughput(level, scope, objective, tail)


LATENCY_GAIN = 0.10
"""An e2e p50 this much below the baseline's is worth saying where throughput cannot tell the variants apart."""


def _latency_instead(level: str, base: LevelResult, rows: Sequence[_Row]) -> str:
    """At an open-loop level (replay, rate) where every variant served the offered load (no throughput ratio's
    interval excludes 1), throughput follows the arrivals and cannot rank them; say so, with the variant that
    shortens requests the most, when it does by more than `LATENCY_GAIN` (the rule itself stays on throughput)."""
    if level.startswith("concurrency:"):
        return ""
    if any(r.level.vs_baseline is None or not r.level.vs_baseline.low <= 1.0 <= r.level.vs_baseline.high for r in rows):
        return ""
    base_e2e = base.metrics.e2e_s.get("p50")
    timed = [(r.level.metrics.e2e_s["p50"], r.result.name) for r in rows if "p50" in r.level.metrics.e2e_s]
    if base_e2e is None or not timed:
        return ""
    e2e, name = min(timed)
    if e2e > base_e2e * (1 - LATENCY_GAIN):
        return ""
    return (
        f" At this load the server keeps up under every variant (throughput follows the arrivals), and speculation "
        f"shortens requests instead: {name} e2e p50 {e2e * 1000:.0f} vs {base_e2e * 1000:.0f} ms (a latency gain "
        "the throughput priority does not rank; --priority ttft and the concurrency levels show the rest)."
    )


def _on_throughput(level: str, scope: Scope[_Row], objective: Objective, tail: str) -> LevelDecision:
    """`rule.by_throughput` on the level's output tokens/s and its paired ratio, in words."""
    figure = objective.figure
    outcome = by_throughput(scope)
    best = outcome.best
    if best is None:
        return LevelDecision(
            level=level, winner=BASELINE.name, figure=figure, reason=f"no speculative variant measured here.{tail}"
        )
    gain = best.level.vs_baseline
    name = best.result.name
    figures = f"{best.tokens_per_s:.1f} vs {scope.base.tokens_per_s:.1f} tokens/s, {ratio_text(gain)}"
    if outcome.why == "pays":
        return LevelDecision(level=level, winner=name, figure=figure, gain=gain, reason=f"{name}: {figures}.{tail}")
    if outcome.why == "tied with the baseline":
        why = f"within {TIE:.0%} of the baseline"
    elif gain is not None and gain.value < 1:
        why = "slower than the baseline"
    elif gain is not None and gain.low <= 1.0:
        why = "its interval reaches 1"
    else:
        why = f"below --min-speedup {objective.min_speedup:g}"
    return LevelDecision(
        level=level,
        winner=BASELINE.name,
        figure=figure,
        gain=UNITY,
        reason=(
            f"baseline: the best speculative variant, {name} ({figures}), does not pay: {why}."
            f"{_latency_instead(level, scope.base.level, scope.speculative)}{tail}"
        ),
    )


def _on_ttft(level: str, scope: Scope[_Row], simplicity: object, percentile: str, tail: str) -> LevelDecision:
    """`rule.by_ttft` on the level's TTFT at the percentile, with a flat `TIE` for its tie and its noise."""
    figure = f"TTFT {percentile}"
    base_ttft = scope.base.ttft_s
    timed = [row for row in scope.speculative if row.ttft_s is not None]
    if base_ttft is None or not timed:
        return LevelDecision(level=level, winner=BASELINE.name, figure=figure, reason=f"nothing to compare.{tail}")
    outcome = by_ttft(
        scope,
        lambda row: row.ttft_s,
        lambda row, best: (row.ttft_s or 0.0) <= (best.ttft_s or 0.0) * (1 + TIE),
        lambda row: (row.ttft_s or 0.0) < base_ttft * (1 - TIE),
        lambda row: row.tokens_per_s,
        simplicity,  # type: ignore[arg-type]
    )
    assert outcome is not None  # the baseline has a TTFT
    if outcome.winner is not scope.base:
        row = outcome.winner
        text = f"{(row.ttft_s or 0.0) * 1000:.0f} vs {base_ttft * 1000:.0f} ms"
        if outcome.why == "tied, pays on throughput":
            text += f", tied on TTFT and {ratio_text(row.level.vs_baseline)} in throughput"
        return LevelDecision(
            level=level, winner=row.result.name, figure=figure, gain=row.level.vs_baseline,
            reason=f"{row.result.name}: {text}.{tail}",
        )  # fmt: skip
    fastest = min(timed, key=lambda row: row.ttft_s or 0.0)
    text = f"{(fastest.ttft_s or 0.0) * 1000:.0f} vs {base_ttft * 1000:.0f} ms"
    return LevelDecision(
        level=level,
        winner=BASELINE.name,
        figure=figure,
        reason=(
            f"baseline: the fastest speculative variant, {fastest.result.name}, is not faster to the first token "
            f"({text}).{tail}"
        ),
    )


def crossovers(results: RunResults) -> list[Crossover]:
    """Per speculative method: where its best variant (at the lowest concurrency) stops paying."""
    if results.load is None:
        return []
    levels = [(int(name.split(":")[1]), name) for name in results.load.levels if name.startswith("concurrency:")]
    levels.sort()
    if len(levels) < 2:
        return []
    first = levels[0][1]
    best_of: dict[str, tuple[float, VariantResult]] = {}
    for vr in results.variants:
        if vr.name == BASELINE.name or not eligible(results, vr):
            continue
        lr = at(vr, first)
        if lr is None or lr.vs_baseline is None:
            continue
        method = str(vr.variant.get("method"))
        if method not in best_of or lr.vs_baseline.value > best_of[method][0]:
            best_of[method] = (lr.vs_baseline.value, vr)
    out = []
    for method, (_, vr) in sorted(best_of.items()):
        points = [(c, lr.vs_baseline) for c, name in levels if (lr := at(vr, name)) and lr.vs_baseline]
        out.append(crossover_of(vr.name, method, points))
    return out


def _crossing(points: Sequence[tuple[int, float]]) -> float | None:
    """The concurrency where a series falling through 1 crosses it (log-linear), None when it never does."""
    for (c0, r0), (c1, r1) in zip(points, points[1:], strict=False):
        if r0 >= 1.0 > r1:
            x0, x1 = math.log(c0), math.log(c1)
            return math.exp(x0 + (r0 - 1.0) / (r0 - r1) * (x1 - x0))
    return None


def crossover_of(variant: str, method: str, points: Sequence[tuple[int, Interval]]) -> Crossover:
    ratios = {f"concurrency:{c}": gain for c, gain in points}
    made = partial(Crossover, variant=variant, method=method, ratios=ratios)
    shown = ", ".join(f"{g.value:.2f}x at {c}" for c, g in points)
    values = [g.value for _, g in points]
    if not points:
        return made(status="unclear", text=f"{variant}: no paired figures")
    if all(g.low > 1.0 for _, g in points):
        return made(status="pays_everywhere", text=f"{variant} ({method}) pays at every concurrency measured ({shown})")
    if all(v >= 1.0 for v in values):
        # Every point above 1, but from some level on the interval reaches 1: it may already have stopped paying
        # there. The crossover is not inside the measured range by the points; it may be from where the lower
        # bound falls through 1 (or is at any level whose interval reaches 1).
        reach = next(c for c, g in points if g.low <= 1.0)
        low = _crossing([(c, g.low) for c, g in points])
        shown_intervals = ", ".join(f"{g.value:.2f}x [{g.low:.2f}, {g.high:.2f}] at {c}" for c, g in points)
        return made(
            status="unclear",
            low=round(low, 2) if low is not None else None,
            text=(
                f"{variant} ({method}) is above the baseline at every concurrency measured, but from {reach} on its "
                f"95% interval reaches 1 (no gain beyond noise): it stops paying at or above "
                f"{f'~{low:.1f}' if low is not None else str(reach)}, not measured further ({shown_intervals})"
            ),
        )
    if all(v < 1.0 for v in values):
        return made(status="never_pays", text=f"{variant} ({method}) pays at no concurrency measured ({shown})")
    point = _crossing([(c, g.value) for c, g in points])
    falls = all(a >= b for a, b in zip(values, values[1:], strict=False))
    if point is None or not falls:
        return made(status="unclear", text=f"{variant} ({method}) does not fall steadily with concurrency ({shown})")
    low = _crossing([(c, g.low) for c, g in points])
    high = _crossing([(c, g.high) for c, g in points])
    first, last = points[0][0], points[-1][0]
    low_text = f"{low:.1f}" if low is not None else f"below {first}"
    high_text = f"{high:.1f}" if high is not None else f"above {last}"
    return made(
        status="crosses",
        concurrency=round(point, 2),
        low=round(low, 2) if low is not None else None,
        high=round(high, 2) if high is not None else None,
        text=(
            f"{variant} ({method}) stops paying at concurrency ~{point:.1f} (95% interval {low_text} to "
            f"{high_text}): {shown}"
        ),
    )


def decide_levels(results: RunResults, objective: Objective) -> LevelDecision | None:
    """Every level's decision and the crossovers into `results.load`; returns the decision at the recorded load
    (`replay`, the level the deployment serves), None when it was not measured."""
    summary = results.load
    if summary is None:
        return None
    summary.decisions = [
        found for level in summary.levels if (found := level_decision(results, level, objective)) is not None
    ]
    summary.crossovers = crossovers(results)
    deploy = next((d for d in summary.decisions if d.level == "replay"), None)
    summary.deploy_level = deploy.level if deploy is not None else None
    return deploy
