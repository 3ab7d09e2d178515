"""Predictor accuracy and predictive-vs-exhaustive search, on the bundled SmolLM2 and bundled workloads.

For each workload, two `optimize` runs over the same requests and the same search space:
1. `--strategy predictive`: profile once, predict every variant, time the top 3 + baseline;
2. `--strategy exhaustive`: time every variant end to end.
Reports |predicted / measured - 1| of tokens/s for every confirmed variant (issue 4's target: <= 10%), the
same for every variant of the exhaustive run (every variant there is both predicted and measured), whether
both strategies pick the same winner (or one within 3% of the exhaustive winner's measured throughput), and
predictive's wall time as a fraction of exhaustive's (target: <= 35%).

The space is reduced from the default (see SPACE) and the requests are capped so both runs fit in minutes on a
2-core CPU; the output says so. Run it alone on the machine:

    flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/predictor_accuracy.py \
        --out benchmarks/results/predictor_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.pipeline import run_optimize
from runinfra_opt.results import RunResults

SPACE: dict[str, Any] = {
    "methods": ("ngram", "early_exit"),
    "ngram_max": (1, 2, 3),
    "lookaheads": (1, 2, 4, 8),
    "exit_layers": (15,),
}
"""Reduced from the default space (27 n-gram, 15 early-exit variants): 12 n-gram variants and the middle
exit layer at the same lookaheads, 17 variants with the baseline."""


def _tokens_per_s(results: RunResults, name: str, kind: str) -> float | None:
    vr = results.variant(name)
    summary = getattr(vr, kind) if vr is not None else None
    return summary.tokens_per_s if summary is not None else None


def _errors(results: RunResults) -> list[dict[str, Any]]:
    rows = []
    for vr in results.variants:
        if vr.measured is None or vr.predicted is None or vr.measured.tokens_per_s <= 0:
            continue
        ratio = vr.predicted.tokens_per_s / vr.measured.tokens_per_s
        rows.append(
            {
                "variant": vr.name,
                "predicted_tokens_per_s": round(vr.predicted.tokens_per_s, 2),
                "measured_tokens_per_s": round(vr.measured.tokens_per_s, 2),
                "abs_error": round(abs(ratio - 1.0), 4),
            }
        )
    return rows


def run_one(workload: str, strategy: str, args: argparse.Namespace, root: Path) -> tuple[RunResults, float]:
    config = OptimizeConfig(
        priority="throughput",
        workload=workload,
        target=args.target,
        strategy=strategy,  # type: ignore[arg-type]
        confirm=3,
        repeats=args.repeats,
        budget_minutes=10_000.0,  # the request cap below decides; both strategies then use the same requests
        max_requests=args.requests,
        max_tokens=args.max_tokens,
        threads=args.threads,
        seed=0,
        run_dir=str(root / f"{Path(workload).stem}-{strategy}"),
        out=str(root / f"{Path(workload).stem}-{strategy}.yaml"),
        runs_root=str(root / "runs"),
        **(SPACE | {"exit_layers": tuple(args.exit_layers)}),
    )
    start = time.perf_counter()
    results = run_optimize(config)
    return results, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["summarize", "json"])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", default="default")
    parser.add_argument("--exit-layers", type=int, nargs="+", default=list(SPACE["exit_layers"]))
    parser.add_argument("--out", type=Path, default=None, help="Write the report as JSON here.")
    args = parser.parse_args()
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()

    root = Path(tempfile.mkdtemp(prefix="predictor-accuracy-"))
    report: dict[str, Any] = {
        "space": {k: list(v) for k, v in SPACE.items()},
        "requests_per_workload": args.requests,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "note": (
            "reduced search space and capped requests so both strategies fit on a 2-core CPU; "
            "both strategies use the same requests and space"
        ),
        "workloads": {},
        "run_root": str(root),
        "cache": os.environ.get("RUNINFRA_OPT_CACHE"),
    }
    # Measure the cost model once, outside both timings, so neither strategy pays for it (it is cached).
    import torch

    from runinfra_opt.engine.hf_cost import measure_costs
    from runinfra_opt.models import load_model

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    measure_costs(load_model(args.target), exit_layers=args.exit_layers, threads=args.threads)
    report["cost_model_s"] = round(time.perf_counter() - start, 1)
    for workload in args.workloads:
        predictive, predictive_s = run_one(workload, "predictive", args, root)
        exhaustive, exhaustive_s = run_one(workload, "exhaustive", args, root)
        assert predictive.decision is not None
        assert exhaustive.decision is not None
        p_win, e_win = predictive.decision.winner, exhaustive.decision.winner
        e_win_tps = _tokens_per_s(exhaustive, e_win, "measured") or 0.0
        # The predictive winner's throughput as measured in the exhaustive run (same requests, every variant timed).
        p_win_tps_in_exhaustive = _tokens_per_s(exhaustive, p_win, "measured") or 0.0
        within = e_win_tps > 0 and p_win_tps_in_exhaustive >= 0.97 * e_win_tps
        confirmed_errors = _errors(predictive)
        entry = {
            "requests": predictive.workload.used_requests if predictive.workload else None,
            "predictive": {
                "winner": p_win,
                "reason": predictive.decision.reason,
                "wall_s": round(predictive_s, 1),
                "confirmed_errors": confirmed_errors,
                "max_abs_error": max((r["abs_error"] for r in confirmed_errors), default=None),
                "timings_s": {k: round(v, 1) for k, v in predictive.timings_s.items()},
            },
            "exhaustive": {
                "winner": e_win,
                "reason": exhaustive.decision.reason,
                "wall_s": round(exhaustive_s, 1),
                "variants_timed": sum(1 for v in exhaustive.variants if v.confirmed),
                "all_errors": _errors(exhaustive),
                "timings_s": {k: round(v, 1) for k, v in exhaustive.timings_s.items()},
            },
            "same_winner": p_win == e_win,
            "predictive_winner_within_3pct": within,
            "wall_time_ratio": round(predictive_s / exhaustive_s, 3) if exhaustive_s else None,
        }
        errs = [r["abs_error"] for r in entry["exhaustive"]["all_errors"]]
        entry["exhaustive"]["within_10pct"] = f"{sum(e <= 0.10 for e in errs)}/{len(errs)}"
        entry["exhaustive"]["mean_abs_error"] = round(sum(errs) / len(errs), 4) if errs else None
        report["workloads"][workload] = entry
        print(json.dumps({workload: entry}, indent=1), flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print("\nsummary:")
    for workload, entry in report["workloads"].items():
        print(
            f"  {workload}: predictive {entry['predictive']['winner']} in {entry['predictive']['wall_s']} s, "
            f"exhaustive {entry['exhaustive']['winner']} in {entry['exhaustive']['wall_s']} s "
            f"(ratio {entry['wall_time_ratio']}); same winner {entry['same_winner']}, within 3% "
            f"{entry['predictive_winner_within_3pct']}; confirmed |pred/meas-1| max "
            f"{entry['predictive']['max_abs_error']}; exhaustive all-variant errors <= 10%: "
            f"{entry['exhaustive']['within_10pct']} (mean {entry['exhaustive']['mean_abs_error']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
