"""Replay the serving engine's candidate choice on recorded exhaustive runs: which servers a predictive run would
have launched, and what it would have decided, without launching any.

An exhaustive `optimize --engine vllm` run has timed every variant on its own server (batch 1 and every load
level) and recorded it. This script copies such a run, turns the copy into a predictive run standing just before
its confirmation (every speculative variant's measurements hidden), and resumes it with the timing replaced by
a replay: a variant "timed" gets back the measurements the exhaustive run recorded for it. The confirmation's
choice then runs exactly as in a real predictive run, on real figures:

- `sequential` (what `optimize` does now): candidates chosen one at a time, the predictor re-fitted after each
  (`optimize/phases/confirm.py`, `_confirm_sequentially`), no more when none is in reach;
- `at-once` (what it did before): the `--confirm` best of the first ranking, chosen before anything speculative
  was timed.

Reported per run and mode: the candidates chosen in order, why the choice stopped, the decision on the revealed
figures, and the chosen winner's measured tokens/s over the exhaustive winner's (both measured in the same
exhaustive run, each on its own launch). What it cannot show: the launches' own speed differences are those of
the recorded run (a real predictive run gets launches of its own), and the step costs, the baseline pass and the
baseline's measurements are the exhaustive run's. The k schedule phase is not replayed.

    .venv/bin/python benchmarks/confirm_replay.py RAW_DIR [--confirm 3] [--vllm-python PY] [--out-dir DIR]

RAW_DIR: the run directories of `predictor_accuracy.py --engine vllm` (its `--out-dir`/raw); the recorded ones
are in the git history (docs/measurements.md names the commits). The report goes to `--out-dir`/report.json, the
summary to `--out-dir`/summary.json (`--keep`: benchmarks/results/confirm_replay.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from runinfra_opt import measurements  # noqa: E402
from runinfra_opt.methods import Variant
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.phases import confirm
from runinfra_opt.optimize.pipeline import run_optimize
from runinfra_opt.optimize.state import RunState
from runinfra_opt.results import VariantResult, load_results

HEADLINE = [
    ("replays", "*", "servers"),
    ("replays", "*", "winner"),
    ("replays", "*", "exhaustive_winner"),
    ("replays", "*", "winner_over_exhaustive_winner_batch1"),
]
"""The figures docs/measurements.md shows (paths into the summary's figures; `*`: every key or item)."""

HIDDEN = ("measured_requests", "load")
"""What a variant's timing produces (`confirm.time_by_variant`): hidden until the replay "times" it."""
DONE_BEFORE_CONFIRM = ("load", "cost", "plan", "baseline", "check_cost", "profile", "predict", "schedule")
"""Phases left marked done in the copy (`schedule`: not replayed, it would build and launch a new variant)."""


def _prepare(
    run_dir: Path, work: Path, mode: str, confirm_count: int, vllm_python: str | None
) -> tuple[Path, dict[str, Any], dict[str, dict[str, Any]]]:
    """A copy of the run standing before its confirmation: its config, and each speculative variant's hidden
    measurements (raw JSON)."""
    copy = work / f"{run_dir.name}-{mode}"
    shutil.copytree(run_dir, copy)
    raw = json.loads((copy / "results.json").read_text(encoding="utf-8"))
    hidden: dict[str, dict[str, Any]] = {}
    for vr in raw["variants"]:
        if vr["name"] == "baseline":
            continue
        hidden[vr["name"]] = {key: vr.get(key) for key in HIDDEN}
        for key in HIDDEN:
            vr[key] = []
        vr.update(measured=None, per_category={}, confirmed=False, disqualified=None, failed=None)
    raw["phases_done"] = [p for p in DONE_BEFORE_CONFIRM if p in raw["phases_done"] or p == "schedule"]
    raw["plan"].update(confirm=None, confirm_slots=None, confirm_stopped=None, added=[], remeasured=[])
    raw["decision"] = None
    raw["status"] = "running"
    config = raw["config"]
    config.update(strategy="predictive", confirm=confirm_count, run_dir=str(copy), out=str(copy) + ".yaml",
                  runs_root=str(work / "runs"), vllm_python=vllm_python)  # fmt: skip
    (copy / "results.json").write_text(json.dumps(raw), encoding="utf-8")
    return copy, config, hidden


def replay(run_dir: Path, work: Path, mode: str, confirm_count: int, vllm_python: str | None) -> dict[str, Any]:
    recorded = load_results(run_dir / "results.json")
    copy, config, hidden = _prepare(run_dir, work, mode, confirm_count, vllm_python)
    order: list[str] = []

    def reveal(state: RunState, variants: list[Variant], repredict: Callable[[], None] | None = None) -> None:
        # `repredict` re-predicts capacity after a search's warm-up; a replay searches nothing: the hook is unused
        for variant in variants:
            found = hidden.pop(variant.name, None)
            if found is None:
                continue  # the baseline (never hidden), or already revealed
            timed = VariantResult.model_validate({"name": variant.name, "variant": variant.to_dict(), **found})
            vr = state.variant_result(variant)
            vr.measured_requests, vr.load = timed.measured_requests, timed.load
            order.append(variant.name)

    def at_once(state: RunState, variants: list[Variant]) -> list[Variant]:
        slots = state.plan.confirm_slots or 0
        names = {v.name for v in variants}
        more = [v for v in confirm._ranked(state)[:slots] if v.name not in names]  # the first ranking's best
        variants = variants + more
        assert state.plan.confirm is not None
        state.plan.confirm += [v.name for v in more]
        reveal(state, variants)
        confirm.summarize_measured(state, variants)
        return variants

    saved = (confirm.time_by_variant, confirm._confirm_sequentially)
    confirm.time_by_variant = reveal  # type: ignore[assignment]
    if mode == "at-once":
        confirm._confirm_sequentially = at_once
    try:
        results = run_optimize(OptimizeConfig.from_dict(config), resume=str(copy))
    finally:
        confirm.time_by_variant, confirm._confirm_sequentially = saved
    assert results.decision is not None
    assert recorded.decision is not None
    winner, best = results.decision.winner, recorded.decision.winner

    def tps(name: str) -> float | None:
        vr = recorded.variant(name)
        return vr.measured.tokens_per_s if vr is not None and vr.measured is not None else None

    mine, theirs = tps(winner), tps(best)
    return {
        "run": str(run_dir),
        "mode": mode,
        "candidates": order,
        "stopped": results.plan.confirm_stopped if results.plan else None,
        "servers": 1 + len(order),
        "winner": winner,
        "exhaustive_winner": best,
        "exhaustive_winner_among_candidates": best in order or best == "baseline",
        "winner_over_exhaustive_winner_batch1": round(mine / theirs, 4) if mine and theirs else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="Exhaustive run directories, or directories holding them.")
    parser.add_argument("--confirm", type=int, default=3)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--out", type=Path, default=None, help="the report (default: OUT_DIR/report.json)")
    parser.add_argument("--work", type=Path, default=None, help="keep the replayed copies here (default: deleted)")
    measurements.add_output_options(parser, __file__)
    args = parser.parse_args()
    runs = []
    for d in args.dirs:
        found = [d] if (d / "results.json").exists() else sorted(p.parent for p in d.glob("*/results.json"))
        runs += [r for r in found if load_results(r / "results.json").config.get("strategy") == "exhaustive"]
    if not runs:
        print("no exhaustive run directory found", file=sys.stderr)
        return 2
    report = []
    with tempfile.TemporaryDirectory(prefix="confirm-replay-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for run in runs:
            for mode in ("at-once", "sequential"):
                entry = replay(run, work, mode, args.confirm, args.vllm_python)
                report.append(entry)
                print(
                    f"{run.name} {mode}: {entry['servers']} servers, candidates {', '.join(entry['candidates'])}; "
                    f"winner {entry['winner']} ({entry['winner_over_exhaustive_winner_batch1']}x the exhaustive "
                    f"winner {entry['exhaustive_winner']}){'; ' + entry['stopped'] if entry['stopped'] else ''}"
                )
    out = args.out or measurements.out_dir(args) / "report.json"
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"report: {out}")
    measurements.write_summary(args, {"replays": report}, headline=HEADLINE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
