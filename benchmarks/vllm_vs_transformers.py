"""The same requests decided on both engines: vLLM (a server per variant, every variant timed) and the
in-process transformers engine (its default predictive run). Per bundled workload: each engine's baseline
tokens/s, its best speculative variant on that workload's requests with the measured speedup and its 95%
interval, and whether the two engines pick the same kind of winner.

One combined workload is built from the first `--per-workload` requests of each bundled workload (chat, code,
json, summarize), its category set to the workload's name, so that one `optimize` run per engine measures
every workload on the same servers (a vLLM launch takes ~2 minutes on 2 CPU cores; one launch per variant,
not per variant and workload). Per-workload figures are the runs' per-category results.

    .venv/bin/python benchmarks/vllm_vs_transformers.py [--out-dir DIR] [--keep]

Needs `runinfra-opt engine install vllm`. Run it alone on the machine: both runs are timing runs. The runs go
to `--out-dir` (one run directory per engine, report.json), the figures (`summary_figures`) to
`--out-dir`/summary.json (`--keep`: benchmarks/results/vllm_vs_transformers.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.pipeline import run_optimize
from runinfra_opt.results import RunResults

WORKLOADS = ("chat", "code", "json", "summarize")


def combined_workload(path: Path, per_workload: int) -> None:
    root = Path(__file__).resolve().parent.parent / "workloads"
    rows = []
    for name in WORKLOADS:
        lines = [line for line in (root / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        for line in lines[:per_workload]:
            row = json.loads(line)
            row["category"] = name
            row.pop("arrival_s", None)
            rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def per_category(results: RunResults) -> dict[str, dict[str, Any]]:
    """category -> baseline tokens/s and the best measured speculative variant there (by speedup)."""
    out: dict[str, dict[str, Any]] = {}
    baseline = results.variant("baseline")
    assert baseline is not None
    for category, base in baseline.per_category.items():
        best: dict[str, Any] | None = None
        for vr in results.variants:
            if vr.name == "baseline" or vr.disqualified or vr.failed or category not in vr.per_category:
                continue
            speedup = vr.per_category[category].speedup
            if speedup is None:
                continue
            if best is None or speedup.value > best["speedup"]:
                best = {"variant": vr.name, "speedup": speedup.value, "low": speedup.low, "high": speedup.high,
                        "acceptance": vr.per_category[category].acceptance_rate}  # fmt: skip
        out[category] = {"baseline_tokens_per_s": base.tokens_per_s, "best": best}
    return out


def run(engine: str, workload: Path, root: Path, args: argparse.Namespace) -> tuple[RunResults, float]:
    extra: dict[str, Any] = {}
    if engine == "vllm":
        extra = {"strategy": "exhaustive", "methods": ("vllm_ngram",), "lookaheads": tuple(args.lookahead),
                 "dtype": args.vllm_dtype}  # fmt: skip
    config = OptimizeConfig(
        workload=str(workload),
        engine=engine,
        repeats=args.repeats,
        max_tokens=args.max_tokens,
        budget_minutes=10_000.0,
        seed=0,
        run_dir=str(root / engine),
        out=str(root / f"{engine}.yaml"),
        **extra,
    )
    start = time.perf_counter()
    results = run_optimize(config)
    return results, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-workload", type=int, default=3, help="requests from each bundled workload")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--lookahead", type=int, nargs="+", default=[4], help="vLLM n-gram k values")
    parser.add_argument("--vllm-dtype", default="auto", help="vLLM engine dtype (auto = bfloat16)")
    parser.add_argument("--engines", nargs="+", default=["vllm", "transformers"])
    summary.add_output_options(parser, __file__)
    args = parser.parse_args(argv)

    root = summary.out_dir(args)
    workload = root / "combined.jsonl"
    combined_workload(workload, args.per_workload)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "engines": {}}
    for engine in args.engines:
        load_before = os.getloadavg()
        results, wall = run(engine, workload, root, args)
        decision = results.decision
        assert decision is not None
        report["engines"][engine] = {
            "wall_s": round(wall, 1),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "winner": decision.winner,
            "gain": decision.gain.model_dump() if decision.gain else None,
            "reason": decision.reason,
            "per_workload": per_category(results),
            "launches": results.launches,
            "notes": [n.text for n in results.notes],
            "run_dir": str(root / engine),
        }
        print(f"{engine}: winner {decision.winner} ({decision.reason}) in {wall:.0f} s", flush=True)
    print(
        f"\n{'workload':<10} " + "  ".join(f"{e + ' base tok/s':>18} {e + ' best [95% CI]':>44}" for e in args.engines)
    )
    for category in WORKLOADS:
        cells = []
        for engine in args.engines:
            row = report["engines"][engine]["per_workload"].get(category, {})
            best = row.get("best")
            shown = (f"{best['variant']} {best['speedup']:.2f}x [{best['low']:.2f},{best['high']:.2f}]"
                     if best else "-")  # fmt: skip
            cells.append(f"{row.get('baseline_tokens_per_s', 0):>18.1f} {shown:>44}")
        print(f"{category:<10} " + "  ".join(cells))
    (root / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"written {root / 'report.json'}")
    summary.write_summary(args, summary_figures(report), argv)
    return 0


def summary_figures(report: dict[str, Any]) -> dict[str, Any]:
    """Per engine: its wall time, its winner and gain, and per workload its baseline tokens/s and best variant."""
    return {
        engine: {
            "wall_s": entry.get("wall_s"),
            "winner": entry.get("winner"),
            "gain": entry.get("gain"),
            "per_workload": entry.get("per_workload"),
        }
        for engine, entry in report["engines"].items()
    }


if __name__ == "__main__":
    sys.exit(main())
