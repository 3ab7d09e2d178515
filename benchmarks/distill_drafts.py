"""Distil drafts for the default target and measure them on their held-out requests (issue 6's done-when).

For each workload: `runinfra_opt.distill.pipeline.distill` (skipped when the output directory already holds
a draft of the same settings), then `runinfra_opt.bench.run_bench` of `--method draft --lookahead K
--vs-baseline` over the draft's held-out requests only (requests it never trained on). Prints, per workload,
the simulated held-out acceptance before/after training, the cost ratio c, the measured acceptance and the
measured speedup with its 95% interval; writes the drafts and every row to `--out-dir` (results.json), the
summary to `--out-dir`/summary.json (`--keep`: benchmarks/results/distill_drafts.json).

Run it under the CPU lock, e.g.:
  RUNINFRA_OPT_CACHE=/tmp/rcache flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/distill_drafts.py \
      --workloads json,summarize --minutes 5 --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402


def _heldout_workload(workload: Any, ids: list[str]) -> Any:
    keep = set(ids)
    requests = tuple(r for r in workload.requests if r.id in keep)
    return dataclasses.replace(workload, name=f"{workload.name}-heldout", requests=requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="json,summarize,code,chat", help="comma-separated workloads")
    parser.add_argument("--target", default="default")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=288)
    parser.add_argument("--init", default="layers", choices=["layers", "embedding"])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--lookahead", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-bench", action="store_true", help="distil and report simulated acceptance only")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()

    from runinfra_opt.bench import BenchConfig, run_bench
    from runinfra_opt.distill.config import DistillConfig
    from runinfra_opt.distill.pipeline import distill
    from runinfra_opt.fsutil import atomic_write_text
    from runinfra_opt.methods import Variant
    from runinfra_opt.workload import load_workload

    rows: list[dict[str, Any]] = []
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        out = args.out_dir / f"{name}-l{args.layers}-h{args.hidden}"
        config = DistillConfig(
            target=args.target,
            workload=name,
            out=out,
            layers=args.layers,
            hidden=args.hidden,
            init=args.init,
            minutes=args.minutes,
            seed=args.seed,
            max_tokens=args.max_tokens,
            lookahead=args.lookahead,
            threads=args.threads,
        )
        report = distill(config)
        distilled = report.summary
        row: dict[str, Any] = {
            "workload": name,
            "draft": str(out),
            "train_s": distilled["training"]["seconds"],
            "c": distilled["cost"]["c"],
            "sim_before": distilled["heldout_before"].get("accepted_per_pass"),
            "sim_after": distilled["heldout_after"].get("accepted_per_pass"),
            "sim_tokens_per_pass_after": distilled["heldout_after"].get("tokens_per_pass"),
            "agreement": distilled["heldout_after"].get("agreement"),
            "heldout_requests": len(distilled["workload"]["heldout_requests"]),
        }
        print(f"{name}: distilled -> {out} {json.dumps(row)}", file=sys.stderr, flush=True)
        if not args.no_bench:
            workload = _heldout_workload(
                load_workload(name, default_max_tokens=args.max_tokens), distilled["workload"]["heldout_requests"]
            )
            variant = Variant("draft", lookahead=args.lookahead, draft=str(out))
            bench = run_bench(
                BenchConfig(
                    variant=variant,
                    workload=name,
                    target=args.target,
                    draft=str(out),
                    repeat=args.repeat,
                    vs_baseline=True,
                    threads=args.threads,
                    max_tokens=args.max_tokens,
                ),
                workload=workload,
            )
            measured = bench.summaries[variant.name]
            row.update(
                {
                    "measured_accepted_per_pass": measured.mean_accepted_per_pass,
                    "draft_tokens_per_s": measured.tokens_per_s,
                    "baseline_tokens_per_s": bench.summaries["baseline"].tokens_per_s,
                    "speedup": bench.speedup.model_dump() if bench.speedup else None,
                    "lossless": bench.lossless,
                }
            )
        rows.append(row)
        atomic_write_text(summary.out_dir(args) / "results.json", json.dumps(rows, indent=2) + "\n")

    header = f"{'workload':<10} {'c':>6} {'acc/pass before':>16} {'after':>6} {'measured':>9} {'speedup [95% CI]':>24}"
    print(header)
    for row in rows:
        sp = row.get("speedup")
        speed = f"{sp['value']:.2f} [{sp['low']:.2f}, {sp['high']:.2f}]" if sp else "-"
        measured = row.get("measured_accepted_per_pass")
        print(
            f"{row['workload']:<10} {row['c']:>6.3f} {row['sim_before'] or 0:>16.2f} {row['sim_after'] or 0:>6.2f} "
            f"{measured if measured is None else round(measured, 2)!s:>9} {speed:>24}"
        )
    summary.write_summary(args, {"drafts": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
