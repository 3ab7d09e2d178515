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
- **Deciding**: `optimize.decision.levels`, by the rule every scope decides by.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

from runinfra_opt.engine.protocol import Capability, LoadServer
from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import safe_name
from runinfra_opt.load import Concurrency, LevelRun, LoadLevel, Replay, level_metrics, parse_load, throughput_ratio
from runinfra_opt.load.store import RecordWriter, read_run
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import (
    LevelResult,
    LoadSummary,
)
from runinfra_opt.workload.model import Request

AUTO_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_ROUNDS = 3
"""A closed loop of N in flight needs at least N x this many requests: the first 10% of sends are warm-up and
the last N drain, so a shorter run has no steady window to measure."""
MAX_SWEEP = 4


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
