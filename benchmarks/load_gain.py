"""How the gain of each variant changes with load, re-derived from a run's raw per-request records with the
current metrics code (`runinfra_opt.load.level_metrics`, `throughput_ratio`): per variant and load level, output
tokens/s with its 95% interval, the paired ratio to the baseline at the same level with its interval, TTFT and
e2e p50/p95 and the server's acceptance over the level. A run made before a change to the metrics (e.g. how a
request's share of the window is counted) is thereby shown as the current code measures it; nothing is timed.

    .venv/bin/python benchmarks/load_gain.py RUN_DIR [RUN_DIR ...] [--out-dir DIR] [--keep]

RUN_DIR is an `optimize --engine vllm --load ...` run directory (its `load/<variant>/<level>.jsonl` files). The
rows go to `--out-dir`/report.json and summary.json (`--keep`: benchmarks/results/load_gain.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402
from runinfra_opt.load import level_metrics, throughput_ratio
from runinfra_opt.load.store import read_run
from runinfra_opt.results import RunResults


def gains(run_dir: Path) -> dict[str, Any]:
    results = RunResults.model_validate_json((run_dir / "results.json").read_text(encoding="utf-8"))
    base = results.variant("baseline")
    if base is None:
        raise SystemExit(f"{run_dir}: no baseline in results.json")
    base_files = {lr.level: run_dir / lr.records for lr in base.load if lr.records}
    out: dict[str, Any] = {"run": str(run_dir), "workload": results.workload.name if results.workload else None}
    rows = []
    for vr in results.variants:
        for lr in vr.load:
            if not lr.records:
                continue
            run = read_run(run_dir / lr.records)
            metrics = level_metrics([run])
            ratio = None
            if vr.name != "baseline" and lr.level in base_files:
                ratio = throughput_ratio([run], [read_run(base_files[lr.level])])
            tps = metrics.output_tokens_per_s
            rows.append(
                {
                    "variant": vr.name,
                    "level": lr.level,
                    "tokens_per_s": None if tps is None else [round(x, 1) for x in (tps.value, tps.low, tps.high)],
                    "vs_baseline": None if ratio is None else [round(x, 3) for x in (ratio.value, ratio.low, ratio.high)],  # noqa: E501
                    "ttft_ms_p50_p95": [round(metrics.ttft_s.get(p, float("nan")) * 1000) for p in ("p50", "p95")],
                    "e2e_ms_p50_p95": [round(metrics.e2e_s.get(p, float("nan")) * 1000) for p in ("p50", "p95")],
                    "acceptance": round(lr.accepted_tokens / lr.drafted_tokens, 3) if lr.drafted_tokens else None,
                    "peak_in_flight": metrics.peak_in_flight,
                    "send_lag_ms_p99": round(metrics.send_lag_s.get("p99", 0.0) * 1000, 1),
                }
            )
    out["rows"] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="the report (default: OUT_DIR/report.json)")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()
    report = [gains(run) for run in args.runs]
    for run in report:
        print(f"## {run['workload']} ({run['run']})")
        header = f"{'variant':46} {'level':14} {'tokens/s [95% CI]':22} {'vs baseline [95% CI]':24}"
        print(f"{header} TTFT p50/p95  e2e p50/p95")
        for r in run["rows"]:
            tps = "-" if r["tokens_per_s"] is None else "{} [{}, {}]".format(*r["tokens_per_s"])
            ratio = "-" if r["vs_baseline"] is None else "{:.2f}x [{:.2f}, {:.2f}]".format(*r["vs_baseline"])
            print(
                f"{r['variant']:46} {r['level']:14} {tps:22} {ratio:24} "
                f"{r['ttft_ms_p50_p95'][0]}/{r['ttft_ms_p50_p95'][1]} ms  {r['e2e_ms_p50_p95'][0]}/"
                f"{r['e2e_ms_p50_p95'][1]} ms"
            )
    out = args.out or summary.out_dir(args) / "report.json"
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    summary.write_summary(args, {"runs": report})


if __name__ == "__main__":
    main()
