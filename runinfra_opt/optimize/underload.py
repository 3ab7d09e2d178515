"""Serving under load (`--load`, engines with `Capability.SERVE_LOAD`: vllm): which levels, each variant measured
at each level on its own server, and what the levels decide.

- **Levels** (`levels_of`): `--load SPEC` as given; `auto` (the default) is, on a serving engine, `replay` of the
  recorded arrivals when every planned request has one, plus a closed-loop sweep over concurrency 1, 2, 4, 8,
  ... kept to levels with at least `MIN_ROUNDS` requests per slot (a shorter loop has no steady window), at
  most `MAX_SWEEP` of them spread geometrically; `none`: batch 1 only. The in-process engine has no load levels.
- **Measuring** (`measure`): right after a variant's batch-1 timing, while its server is still up, every level
  is run once on the planned requests (`Engine.run_load`); the raw records stream to `<run dir>/load/<variant>/`
  as they complete (nothing of the level is held in memory: `runinfra_opt.load.store.RecordWriter`),
  the level's metrics (`runinfra_opt.load.level_metrics`) and its paired throughput ratio to the baseline at
  the same level into `VariantResult.load`, saved after each level (a resume runs only the missing levels).
- **More passes** (`optimize.level_repeats`): a level where a candidate's ratio interval straddles the threshold gets
  more passes of it and the baseline, within `--budget-minutes`.
- **Deciding** (`decide_levels`): per level, on measured figures only, among variants lossless at batch 1 and
  within the TTFT constraints at that level, the speculative variants are ranked by the run's `Objective` with
  the batch-1 decision's ranking (`objective.rank`, ties within 1% to the simpler variant,
  `select.simplicity_key`), and the best must beat the baseline:
  - `--priority throughput`: on output tokens/s; with an SLO (`--slo-ttft-ms`, `--slo-tpot-ms`) only
    variants whose goodput (the share of requests within the SLO) is at least the baseline's minus
    `GOODPUT_SLACK` may win. A speculative winner must beat the baseline by the same rule as at batch 1 (its
    ratio's 95% interval above 1 and the point at least `--min-speedup`), else the baseline is kept.
  - `--priority ttft`: on TTFT at `--percentile`; a speculative variant must be more than 1% faster.
  The crossover per method: the concurrency at which the ratio of the method's best variant (best at the lowest
  level) to the baseline falls to 1, log-linear between the measured levels, with the interval from where
  the ratio's 95% bounds cross 1. When `replay` was measured, its winner is what the manifest carries (the
  recorded load is the load the deployment serves); otherwise the batch-1 decision stands and the per-level
  winners are reported beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

from runinfra_opt.engine.protocol import Capability, LoadServer
from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import safe_name
from runinfra_opt.load import Concurrency, LevelRun, LoadLevel, Replay, level_metrics, parse_load, throughput_ratio
from runinfra_opt.load.store import RecordWriter, read_run
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.objective import TIE, Objective
from runinfra_opt.optimize import level_repeats
from runinfra_opt.optimize.select import saved_nothing, simplicity_key
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import (
    Crossover,
    Decision,
    Interval,
    LevelDecision,
    LevelResult,
    LoadSummary,
    RunResults,
    VariantResult,
)
from runinfra_opt.workload.model import Request

AUTO_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_ROUNDS = 3
"""A closed loop of N in flight needs at least N x this many requests: the first 10% of sends are warm-up and
the last N drain, so a shorter run has no steady window to measure."""
MAX_SWEEP = 4
GOODPUT_SLACK = 0.01
"""A variant's goodput share may fall this far below the baseline's (one request in a hundred) and still win."""


def auto_levels(requests: Sequence[Request], time_scale: float = 1.0) -> list[LoadLevel]:
    """`--load auto` on a serving engine: replay (when every request records its arrival) + a concurrency sweep."""
    levels: list[LoadLevel] = []
    if requests and all(r.arrival_s is not None for r in requests):
        levels.append(Replay(time_scale))
    sweep = [c for c in AUTO_CONCURRENCY if c * MIN_ROUNDS <= len(requests)] or [1]
    if len(sweep) > MAX_SWEEP:
        last = len(sweep) - 1
        sweep = [sweep[round(i * last / (MAX_SWEEP - 1))] for i in range(MAX_SWEEP)]
    levels.extend(Concurrency(c) for c in sweep)
    return levels


def levels_of(state: RunState) -> list[LoadLevel]:
    """The run's load levels (empty: batch 1 only); records them in `results.load` the first time."""
    config = state.config
    engine = state.engine
    spec = config.load.strip().lower()
    if spec == "none" or engine is None or Capability.SERVE_LOAD not in engine.capabilities:
        return []
    if spec == "auto":
        levels = auto_levels(state.requests, config.time_scale)
    else:
        levels = parse_load(config.load, time_scale=config.time_scale, burstiness=config.burstiness, seed=config.seed)
    if any(isinstance(level, Replay) for level in levels):
        missing = [r for r in state.requests if r.arrival_s is None]
        if missing:
            raise UserInputError(
                f"--load {config.load}: replay needs every request's arrival time, and line {missing[0].line} "
                f"({missing[0].id}) has no arrival_s (or timestamp)"
            )
    results = state.results
    if results.load is None:
        results.load = LoadSummary(
            spec="+".join(level.name for level in levels),
            levels=[level.name for level in levels],
            time_scale=config.time_scale,
            burstiness=config.burstiness,
            slo_ttft_ms=config.slo_ttft_ms,
            slo_tpot_ms=config.slo_tpot_ms,
            requests_per_level=len(state.requests),
        )
    return levels


def records_path(variant: str, level: str) -> Path:
    """Where a variant's raw records at a level go, relative to the run directory."""
    return Path("load") / safe_name(variant) / f"{safe_name(level)}.jsonl"


def _baseline_run(state: RunState, level: str) -> LevelRun | None:
    baseline = state.results.variant(BASELINE.name)
    found = next((lr for lr in baseline.load if lr.level == level), None) if baseline else None
    if found is None or found.records is None:
        return None
    return read_run(state.run_dir / found.records, lazy=True)


def measure(state: RunState, variant: Variant) -> None:
    """Every load level not yet measured for `variant`, on its server (the engine keeps it up between calls)."""
    levels = levels_of(state)
    if not levels:
        return
    assert state.engine is not None
    engine = cast(LoadServer, state.engine)  # `levels_of` is empty unless the engine has SERVE_LOAD
    config = state.config
    vr = state.variant_result(variant)
    done = {lr.level for lr in vr.load}
    for level in levels:
        if level.name in done:
            continue
        path = records_path(variant.name, level.name)
        with RecordWriter(state.run_dir / path) as writer:  # each record on disk as it completes
            measured = engine.run_load(variant, level, state.requests, max_tokens=state.max_tokens, sink=writer)
        run = read_run(state.run_dir / path, lazy=True)
        metrics = level_metrics([run], slo_ttft_ms=config.slo_ttft_ms, slo_tpot_ms=config.slo_tpot_ms, seed=config.seed)
        ratio = None
        if variant.is_speculative:
            base = _baseline_run(state, level.name)
            if base is not None:
                ratio = throughput_ratio([run], [base], seed=config.seed)
        vr.load.append(
            LevelResult(
                level=level.name,
                metrics=metrics,
                records=path.as_posix(),
                vs_baseline=ratio,
                drafted_tokens=measured.drafted_tokens if variant.is_speculative else None,
                accepted_tokens=measured.accepted_tokens if variant.is_speculative else None,
            )
        )
        for note in metrics.notes:
            state.results.add_note(f"{variant.name} under load: {note}")
        state.save()
        if ratio is not None:
            from runinfra_opt.optimize.level_repeats import settle

            settle(state, variant, level, vr.load[-1])  # more passes while its decision is unclear
        state.reporter.advance(f"{variant.name} {level.name}")


# ---- deciding ----------------------------------------------------------------------------------------------


def _at(vr: VariantResult, level: str) -> LevelResult | None:
    return next((lr for lr in vr.load if lr.level == level), None)


def _tokens(lr: LevelResult) -> float:
    interval = lr.metrics.output_tokens_per_s
    return interval.value if interval is not None else 0.0


def _ttft(lr: LevelResult, percentile: str) -> float | None:
    return lr.metrics.ttft_s.get(percentile)


def eligible(results: RunResults, vr: VariantResult) -> bool:
    """Lossless at batch 1 and measured there (not failed); speculative, only if a target pass there produced
    more than one token (`saved_nothing`); a k schedule only once verified and written."""
    if vr.failed or vr.disqualified or not vr.confirmed:
        return False
    if saved_nothing(vr):
        return False
    schedule = results.load.schedule if results.load else None
    return not (schedule is not None and vr.name == schedule.variant and not schedule.written)


@dataclass(frozen=True)
class _Row:
    """A speculative variant's figures at one level, as `Objective.rank` reads them."""

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
    base = _at(baseline, level) if baseline else None
    if base is None:
        return None
    percentile = objective.percentile
    base_ttft = _ttft(base, percentile)
    rows: list[_Row] = []
    excluded: list[str] = []
    for vr in results.variants:
        lr = _at(vr, level)
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
    ranked = objective.rank(rows, lambda row: simplicity_key(results, Variant.from_dict(row.result.variant)))
    if objective.on_ttft:
        return _by_ttft(level, base, ranked, percentile, excluded)
    return _by_throughput(level, base, ranked, objective, excluded)


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


def _by_throughput(
    level: str,
    base: LevelResult,
    ranked: Sequence[_Row],
    objective: Objective,
    excluded: list[str],
) -> LevelDecision:
    """`ranked` best first on throughput: the best wins when it pays (`Objective.pays`)."""
    figure = objective.figure
    min_speedup = objective.min_speedup
    tail = f" Left out: {', '.join(excluded)}." if excluded else ""
    if not ranked:
        return LevelDecision(
            level=level, winner=BASELINE.name, figure=figure, reason=f"no speculative variant measured here.{tail}"
        )
    best_vr, best = ranked[0].result, ranked[0].level
    gain = best.vs_baseline
    figures = f"{_tokens(best):.1f} vs {_tokens(base):.1f} tokens/s, {level_repeats.ratio_text(gain)}"
    if objective.pays(gain):
        return LevelDecision(
            level=level, winner=best_vr.name, figure=figure, gain=gain, reason=f"{best_vr.name}: {figures}.{tail}"
        )
    why = "its interval reaches 1" if gain is not None and gain.low <= 1.0 else f"below --min-speedup {min_speedup:g}"
    if gain is not None and gain.value < 1:
        why = "slower than the baseline"
    return LevelDecision(
        level=level,
        winner=BASELINE.name,
        figure=figure,
        gain=Interval(value=1.0, low=1.0, high=1.0),
        reason=(
            f"baseline: the best speculative variant, {best_vr.name} ({figures}), does not pay: {why}."
            f"{_latency_instead(level, base, ranked)}{tail}"
        ),
    )


def _by_ttft(
    level: str,
    base: LevelResult,
    ranked: Sequence[_Row],
    percentile: str,
    excluded: list[str],
) -> LevelDecision:
    """`ranked` best first on TTFT (those without a figure last): the best wins when more than `TIE` faster."""
    figure = f"TTFT {percentile}"
    tail = f" Left out: {', '.join(excluded)}." if excluded else ""
    base_ttft = _ttft(base, percentile)
    ttft = ranked[0].ttft_s if ranked else None
    if ttft is None or base_ttft is None:
        return LevelDecision(level=level, winner=BASELINE.name, figure=figure, reason=f"nothing to compare.{tail}")
    vr, lr = ranked[0].result, ranked[0].level
    text = f"{ttft * 1000:.0f} vs {base_ttft * 1000:.0f} ms"
    if ttft < base_ttft * (1 - TIE):
        return LevelDecision(
            level=level, winner=vr.name, figure=figure, gain=lr.vs_baseline, reason=f"{vr.name}: {text}.{tail}"
        )
    return LevelDecision(
        level=level,
        winner=BASELINE.name,
        figure=figure,
        reason=(
            f"baseline: the fastest speculative variant, {vr.name}, is not faster to the first token ({text}).{tail}"
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
        lr = _at(vr, first)
        if lr is None or lr.vs_baseline is None:
            continue
        method = str(vr.variant.get("method"))
        if method not in best_of or lr.vs_baseline.value > best_of[method][0]:
            best_of[method] = (lr.vs_baseline.value, vr)
    out = []
    for method, (_, vr) in sorted(best_of.items()):
        points = [(c, lr.vs_baseline) for c, name in levels if (lr := _at(vr, name)) and lr.vs_baseline]
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


def decide_levels(state: RunState, decision: Decision) -> None:
    """Per-level decisions and crossovers into `results.load`; at the recorded load (replay), the level's winner
    becomes the run's decision."""
    results, config = state.results, state.config
    summary = results.load
    if summary is None:
        return
    summary.decisions = [
        found for level in summary.levels if (found := level_decision(results, level, config.objective)) is not None
    ]
    summary.crossovers = crossovers(results)
    deploy = next((d for d in summary.decisions if d.level == "replay"), None)
    summary.deploy_level = deploy.level if deploy is not None else None
    per_level = "; ".join(f"{d.level}: {d.winner}" for d in summary.decisions)
    if deploy is None:
        if per_level:
            decision.reason += f" Under load (per level, measured): {per_level}."
        return
    scale = f", time x{config.time_scale:g}" if config.time_scale != 1 else ""
    batch1 = decision.winner
    if deploy.winner != batch1:
        winner = results.variant(deploy.winner)
        assert winner is not None
        decision.winner = deploy.winner
        decision.speculation = deploy.winner != BASELINE.name
        decision.gain = deploy.gain if decision.speculation else Interval(value=1.0, low=1.0, high=1.0)
        base_lr = _at(results.variant(BASELINE.name), "replay")  # type: ignore[arg-type]
        win_lr = _at(winner, "replay")
        if base_lr and win_lr:
            mine, theirs = _ttft(win_lr, config.objective.percentile), _ttft(base_lr, config.objective.percentile)
            decision.ttft_change = (mine / theirs - 1) if mine is not None and theirs else None
    if config.objective.require_speedup:
        from runinfra_opt.exitcodes import ExitCode

        decision.exit_code = int(ExitCode.OK if decision.speculation else ExitCode.GATE_FAILED)
    decision.reason = (
        f"At the recorded load (replay{scale}): {deploy.reason} At batch 1 the choice was {batch1}. "
        f"Per level: {per_level}."
    )
