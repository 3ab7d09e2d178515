"""Re-predict recorded runs with the predictor as it is now: nothing is timed again, no server is launched.

`optimize` records everything its predictions are made from (the baseline's greedy outputs, the step-cost
table and its trials, every measured request, each load level's records), and `--resume` reruns the phases that
recompute from recorded facts (`predict`, `repredict`, `decide`, `write`). This script copies each run
directory found under the given directories, resumes the copy, and reports |predicted/measured - 1| of every
measured variant at batch 1 and at every load level, next to the figures the run recorded. A change to the
predictor is then checked against real measurements in seconds, without measuring again; the measurements, and
so the confirmed candidates of a predictive run, stay what they were (a predictive run's candidates were picked
by the predictor of its day).

    .venv/bin/python benchmarks/repredict.py RAW_DIR [RAW_DIR ...] [--vllm-python PY] [--out-dir DIR] [--keep]

RAW_DIR: run directories, e.g. those of `predictor_accuracy.py` (its `--out-dir`); the recorded ones are in the
git history (docs/measurements.md names the commits). The report goes to `--out-dir`/report.json, the summary
(`summary_figures`) to `--out-dir`/summary.json (`--keep`: benchmarks/results/repredict.json).

A serving-engine run needs the vLLM environment's python only to be named (nothing is started); without
`--vllm-python`, the installed one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from runinfra_opt import measurements  # noqa: E402
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.pipeline import run_optimize
from runinfra_opt.report.accuracy import family_rankings, level_prediction_errors, prediction_errors
from runinfra_opt.results import RunResults, load_results

HEADLINE = [
    ("days", "*", "after", "*", "now", "batch1_within_10pct"),
    ("days", "*", "after", "*", "now", "levels_within_15pct"),
]
"""The figures docs/measurements.md shows (paths into the summary's figures; `*`: every key or item)."""


def _errors(results: RunResults) -> dict[str, Any]:
    batch1 = prediction_errors(results)
    levels = level_prediction_errors(results)
    speculative = [r["abs_error"] for r in batch1 if r["variant"] != "baseline"]
    loaded = [r["abs_error"] for r in levels if r["variant"] != "baseline"]
    return {
        "winner": results.decision.winner if results.decision else None,
        "batch1": batch1,
        "levels": levels,
        "batch1_within_10pct": f"{sum(e <= 0.10 for e in speculative)}/{len(speculative)}",
        "batch1_mean_error": round(sum(speculative) / len(speculative), 4) if speculative else None,
        "levels_within_15pct": f"{sum(e <= 0.15 for e in loaded)}/{len(loaded)}",
        "levels_mean_error": round(sum(loaded) / len(loaded), 4) if loaded else None,
        "kendall_tau": {f.method: f.to_dict()["kendall_tau"] for f in family_rankings(results)},
    }


def repredict(run_dir: Path, work: Path, vllm_python: str | None) -> dict[str, Any]:
    recorded = load_results(run_dir / "results.json")
    copy = work / run_dir.name
    shutil.copytree(run_dir, copy)
    config = json.loads((copy / "results.json").read_text(encoding="utf-8"))["config"]
    config.update(run_dir=str(copy), out=str(copy) + ".yaml", runs_root=str(work / "runs"))
    if config.get("engine") == "vllm":
        config["vllm_python"] = vllm_python
    servers = len(list((copy / "servers").glob("*.log")))
    start = time.perf_counter()
    results = run_optimize(OptimizeConfig.from_dict(config), resume=str(copy))
    launched = len(list((copy / "servers").glob("*.log"))) - servers
    if launched:
        raise SystemExit(f"{run_dir}: resuming launched {launched} server(s): the run was not complete")
    return {
        "run": str(run_dir),
        "seconds": round(time.perf_counter() - start, 1),
        "recorded": _errors(recorded),
        "now": _errors(results),
    }


SUMMARY_KEYS = ("winner", "batch1_within_10pct", "batch1_mean_error", "levels_within_15pct", "levels_mean_error",
                "kendall_tau")  # fmt: skip


def summary_figures(report: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run: the recorded figures and the re-predicted ones (errors within 10% at batch 1, 15% under load,
    their means, the winner, Kendall's tau)."""
    return {
        "runs": {
            entry["run"]: {when: {k: entry[when].get(k) for k in SUMMARY_KEYS} for when in ("recorded", "now")}
            for entry in report
        }
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="Run directories, or directories holding them.")
    parser.add_argument("--vllm-python", default=None, help="vllm runs: a vLLM environment's python.")
    parser.add_argument("--out", type=Path, default=None, help="The report (JSON; default: OUT_DIR/report.json).")
    measurements.add_output_options(parser, __file__)
    args = parser.parse_args()
    runs = []
    for d in args.dirs:
        runs += [d] if (d / "results.json").exists() else sorted(p.parent for p in d.glob("*/results.json"))
    if not runs:
        print("no run directory (with a results.json) found", file=sys.stderr)
        return 2
    report = []
    with tempfile.TemporaryDirectory(prefix="repredict-") as tmp:
        for run in runs:
            entry = repredict(run, Path(tmp), args.vllm_python)
            report.append(entry)
            was, now = entry["recorded"], entry["now"]
            print(
                f"{run.name}: batch 1 within 10% {was['batch1_within_10pct']} -> {now['batch1_within_10pct']} "
                f"(mean {was['batch1_mean_error']} -> {now['batch1_mean_error']}); load levels within 15% "
                f"{was['levels_within_15pct']} -> {now['levels_within_15pct']} (mean {was['levels_mean_error']} -> "
                f"{now['levels_mean_error']}); winner {was['winner']} -> {now['winner']}; Kendall tau "
                f"{was['kendall_tau']} -> {now['kendall_tau']}"
            )
            for row in now["batch1"]:
                level = [r for r in now["levels"] if r["variant"] == row["variant"]]
                tail = "".join(
                    f" | {r['level']} {r['predicted_tokens_per_s']} vs {r['measured_tokens_per_s']} "
                    f"({r['abs_error']:.3f})"
                    for r in level
                )
                print(
                    f"  {row['variant']:24s} batch 1 {row['predicted_tokens_per_s']} vs {row['measured_tokens_per_s']} "
                    f"({row['abs_error']:.3f}){tail}"
                )
    out = args.out or measurements.out_dir(args) / "report.json"
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"report: {out}")
    measurements.write_summary(args, summary_figures(report), headline=HEADLINE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
