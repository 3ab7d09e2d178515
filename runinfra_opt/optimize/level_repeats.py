"""More passes for a load level whose decision is unclear (`optimize --engine vllm --load ...`), like
`--repeats auto` at batch 1.

A level's first pass gives a candidate's throughput ratio to the baseline with a 95% paired bootstrap interval.
Where that interval straddles the decision threshold (`Objective.threshold`: `--min-speedup`), one pass cannot
say whether the candidate pays there. Right after the level's first pass, while the candidate's server is up and
the baseline's beside it (`--pair-baseline`, on a CPU build), a pass of the baseline and one of the candidate are
added (the order alternating from pass to pass; each pass gets a fresh prefix-cache salt from the engine) until
the interval clears the threshold, `MAX_ADDED_PASSES` were added, or one more does not fit the time left of
`--budget-minutes` (then `LoadSummary.budget_ran_out` says so). The level's metrics pool every pass of the
candidate and its ratio pairs the i-th pass with the baseline's i-th (`load.level_metrics`, `load.throughput_ratio`:
a bootstrap over requests x passes). A candidate is not extended where another already pays clearly with a higher
ratio (more passes could not make it the level's winner), nor under `--priority ttft` (decided on the TTFT point,
ties within 1%), nor without the baseline's server beside it (its passes would pair with nothing timed then), nor
at an open-loop level (`replay`, `rate`: a server that keeps up streams the offered load under every variant, so
more passes would only confirm a ratio of 1; capacity decides there: `optimize.capacity`). Closed-loop
(`concurrency`) levels only."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from runinfra_opt.engine.protocol import LoadServer
from runinfra_opt.fsutil import safe_name
from runinfra_opt.load import Concurrency, LevelRun, LoadLevel, level_metrics, throughput_ratio
from runinfra_opt.load.store import RecordWriter, read_run
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import AddedPass, Interval, LevelResult

MAX_ADDED_PASSES = 3


def unclear(gain: Interval | None, threshold: float) -> bool:
    """Whether a ratio's interval straddles the threshold (one pass cannot say whether the candidate pays)."""
    return gain is not None and gain.low <= threshold <= gain.high


def _beaten(state: RunState, variant: Variant, level: str, gain: Interval) -> str | None:
    """Another candidate that already pays clearly at `level` with a higher ratio (None: none)."""
    objective = state.config.objective
    for vr in state.results.variants:
        if vr.name in (variant.name, BASELINE.name) or vr.failed or vr.disqualified:
            continue
        other = next((lr.vs_baseline for lr in vr.load if lr.level == level), None)
        if other is not None and objective.pays(other) and other.value > gain.value:
            return vr.name
    return None


def _span(run: LevelRun) -> float:
    """A pass's length on the clock: first send to last completion."""
    sent = [r.sent_s for r in run.records]
    return max(r.done_s for r in run.records) - min(sent) if sent else 0.0


def _path(variant: str, level: str, nth: int, beside: str | None = None) -> Path:
    name = f"{safe_name(level)}-pass{nth}" + (f"-beside-{safe_name(beside)}" if beside else "")
    return Path("load") / safe_name(variant) / f"{name}.jsonl"


def settle(state: RunState, variant: Variant, level: LoadLevel, lr: LevelResult) -> None:
    """Add passes of `variant` and the baseline at `level` while its decision is unclear (see the module)."""
    config, results = state.config, state.results
    objective = config.objective
    threshold = objective.threshold
    summary = results.load
    base_lr = next((b for b in state.variant_result(BASELINE).load if b.level == level.name), None)
    if summary is None or objective.on_ttft or base_lr is None or base_lr.records is None or lr.records is None:
        return
    if not isinstance(level, Concurrency):
        return  # open loop: a server that keeps up streams the offered load whatever the variant (capacity decides)
    if not unclear(lr.vs_baseline, threshold):
        return
    assert lr.vs_baseline is not None
    where = f"{variant.name} at {level.name}"
    if not getattr(state.engine, "keep_baseline", False):
        summary.passes.append(
            f"{where}: unclear after one pass; none added (the baseline's server is not up beside it: "
            "--no-pair-baseline, or a GPU)"
        )
        state.save()
        return
    engine = cast(LoadServer, state.engine)
    mine = [read_run(state.run_dir / lr.records, lazy=True)] + [
        read_run(state.run_dir / p.records, lazy=True) for p in lr.added
    ]
    base = [read_run(state.run_dir / base_lr.records, lazy=True)] + [
        read_run(state.run_dir / p.baseline_records, lazy=True) for p in lr.added
    ]
    first = lr.vs_baseline
    outcome, ran_out = "", False
    while (gain := lr.vs_baseline) is not None and unclear(gain, threshold):
        if (winner := _beaten(state, variant, level.name, gain)) is not None:
            outcome = f"stopped: {winner} already pays clearly there with a higher ratio"
            break
        if len(lr.added) >= MAX_ADDED_PASSES:
            outcome = f"still unclear after {MAX_ADDED_PASSES} added passes (the limit)"
            break
        cost_s = _span(mine[-1]) + _span(base[-1])
        left = max(state.budget_left(), 0.0)
        if cost_s > left:
            outcome = f"still unclear: one more pass (~{cost_s:.0f} s) does not fit the {left:.0f} s left"
            ran_out = True
            break
        nth = len(lr.added) + 1
        added = AddedPass(
            records=_path(variant.name, level.name, nth).as_posix(),
            baseline_records=_path(BASELINE.name, level.name, nth, beside=variant.name).as_posix(),
        )
        order = [(BASELINE, added.baseline_records), (variant, added.records)]
        for which, path in order if nth % 2 else order[::-1]:
            with RecordWriter(state.run_dir / path) as writer:
                measured = engine.run_load(which, level, state.requests, max_tokens=state.max_tokens, sink=writer)
            if which is variant:
                lr.drafted_tokens = (lr.drafted_tokens or 0) + (measured.drafted_tokens or 0)
                lr.accepted_tokens = (lr.accepted_tokens or 0) + (measured.accepted_tokens or 0)
        mine.append(read_run(state.run_dir / added.records, lazy=True))
        base.append(read_run(state.run_dir / added.baseline_records, lazy=True))
        lr.added.append(added)
        lr.metrics = level_metrics(
            mine, slo_ttft_ms=config.slo_ttft_ms, slo_tpot_ms=config.slo_tpot_ms, seed=config.seed
        )
        lr.vs_baseline = throughput_ratio(mine, base, seed=config.seed)
        state.save()
        state.reporter.note(f"{where}: pass {nth + 1}, {ratio_text(lr.vs_baseline)}")
    else:
        side = "pays" if lr.vs_baseline is not None and lr.vs_baseline.low > threshold else "does not pay"
        outcome = f"clear ({side}) after {len(lr.added)} added pass(es)"
    text = (
        f"{where}: {ratio_text(first)} after one pass straddled {threshold:.2f}; "
        f"now {ratio_text(lr.vs_baseline)}, {outcome}"
    )
    summary.passes.append(text)
    if ran_out:
        summary.budget_ran_out.append(text)
    state.reporter.note(text)
    state.save()


def ratio_text(gain: Interval | None) -> str:
    return "no paired figure" if gain is None else f"{gain.value:.2f}x [{gain.low:.2f}, {gain.high:.2f}]"
