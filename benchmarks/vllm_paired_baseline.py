"""Does a baseline timed next to each candidate steady the serving engine's comparisons?

The serving engine times one server at a time, so two variants' figures are taken minutes apart, and on this
host the same launch measured up to 16% apart between two repeats a minute or two apart (summarize, 12-04e/f).
Here the baseline's server stays up while candidate servers come and go, and requests alternate between them
(baseline, candidate, per request and repeat: A B A B): each candidate's speedup is its tokens/s over the
baseline's timed in the same minutes. Compared, across launches of the same candidates: the spread of the raw
tokens/s and the spread of the paired speedup.

First it measures what the idle server costs the timed one (both servers share the machine's cores): the
baseline's batch-1 pass alone, with a candidate's server up and idle, and alone again (A B A).

    .venv/bin/python benchmarks/vllm_paired_baseline.py [--workload summarize] [--requests 8 | --ids ID ...]
        [--max-tokens 64] [--variants vllm_ngram-m1-n4-k4 vllm_ngram-m1-n3-k4] [--launches 2] [--repeats 2]
        [--out-dir DIR] [--keep]

Needs `runinfra-opt engine install vllm`. Writes every pass as it finishes to `--out-dir`/passes.json (JSON,
atomically), the servers' logs to `--out-dir`/logs, and the figures to `--out-dir`/summary.json (`--keep`:
benchmarks/results/vllm_paired_baseline.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402


def tokens_per_s(records: list[Any]) -> float:
    return sum(r.output_tokens for r in records) / sum(r.e2e_s for r in records)


def spread(values: list[float]) -> float:
    """(max - min) / median: how far apart the same figure came out."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="summarize")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--ids", nargs="*", default=[], help="these request ids (default: the first --requests)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--variants", nargs="+", default=["vllm_ngram-m1-n4-k4", "vllm_ngram-m1-n3-k4"])
    parser.add_argument("--launches", type=int, default=2, help="launches of each candidate, alternating")
    parser.add_argument("--repeats", type=int, default=2, help="paired passes per launch")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()
    passes = summary.out_dir(args) / "passes.json"

    from runinfra_opt.engine.vllm.engine import open_engine
    from runinfra_opt.fsutil import atomic_write_text
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.methods.variant import parse_variant_name
    from runinfra_opt.workload import load_workload

    requests = load_workload(args.workload, default_max_tokens=args.max_tokens).requests
    requests = [r for r in requests if r.id in args.ids] if args.ids else requests[: args.requests]
    variants = [parse_variant_name(name) for name in args.variants]
    logs = args.out_dir / "logs"
    base = open_engine("default", log_dir=logs / "baseline")  # keeps the baseline's server
    cand = open_engine("default", log_dir=logs / "candidates")  # one candidate server at a time
    out: dict[str, Any] = {"workload": args.workload, "requests": [r.id for r in requests],
                           "max_tokens": args.max_tokens, "load_average_start": os.getloadavg(), "passes": []}

    def save() -> None:
        atomic_write_text(passes, json.dumps(out, indent=1) + "\n")

    def one_pass(engine: Any, variant: Any, tag: str, repeat: int) -> list[Any]:
        return [engine.generate(r, variant, max_tokens=args.max_tokens, repeat=repeat) for r in requests]

    counter = iter(range(10_000))
    try:
        base.warmup(requests[0], BASELINE, max_tokens=16)
        # What an idle server costs the timed one: A (alone) B (a candidate's server up, idle) A (alone).
        for label in ("alone", "neighbour idle", "alone again"):
            if label == "neighbour idle":
                cand.warmup(requests[0], variants[0], max_tokens=16)
            if label == "alone again":
                cand.stop_server()
            records = one_pass(base, BASELINE, label, next(counter))
            out["passes"].append({"kind": "idle-draw", "label": label, "time": time.time(),
                                  "baseline_tokens_per_s": tokens_per_s(records)})
            print(f"idle draw: baseline {label}: {tokens_per_s(records):.2f} tokens/s", flush=True)
            save()
        # Paired: per request, the baseline then the candidate; the candidate's server relaunched each time.
        for launch in range(args.launches):
            for variant in variants:
                cand.stop_server()
                cand.warmup(requests[0], variant, max_tokens=16)
                for repeat in range(args.repeats):
                    b_records, c_records = [], []
                    rep = next(counter)
                    for r in requests:
                        b_records.append(base.generate(r, BASELINE, max_tokens=args.max_tokens, repeat=rep))
                        c_records.append(cand.generate(r, variant, max_tokens=args.max_tokens, repeat=rep))
                    same = all(b.output_ids == c.output_ids for b, c in zip(b_records, c_records, strict=True))
                    b, c = tokens_per_s(b_records), tokens_per_s(c_records)
                    out["passes"].append({"kind": "paired", "variant": variant.name, "launch": launch,
                                          "repeat": repeat, "time": time.time(), "baseline_tokens_per_s": b,
                                          "candidate_tokens_per_s": c, "speedup": c / b, "same_output": same})
                    print(f"{variant.name} launch {launch} repeat {repeat}: baseline {b:.2f}, candidate {c:.2f}, "
                          f"speedup {c / b:.3f}, same output {same}", flush=True)
                    save()
    finally:
        cand.close()
        base.close()
    by_variant = {}
    for variant in variants:
        rows = [p for p in out["passes"] if p.get("variant") == variant.name]
        per_launch_raw = [statistics.median(p["candidate_tokens_per_s"] for p in rows if p["launch"] == i)
                          for i in range(args.launches)]
        per_launch_speedup = [statistics.median(p["speedup"] for p in rows if p["launch"] == i)
                              for i in range(args.launches)]
        by_variant[variant.name] = {
            "raw_tokens_per_s_by_launch": per_launch_raw, "raw_spread": spread(per_launch_raw),
            "speedup_by_launch": per_launch_speedup, "speedup_spread": spread(per_launch_speedup),
            "raw_spread_all_passes": spread([p["candidate_tokens_per_s"] for p in rows]),
            "speedup_spread_all_passes": spread([p["speedup"] for p in rows]),
        }
        print(f"{variant.name}: raw by launch {per_launch_raw} (spread {spread(per_launch_raw):.1%}), speedup by "
              f"launch {per_launch_speedup} (spread {spread(per_launch_speedup):.1%})")
    out["summary"] = by_variant
    out["load_average_end"] = os.getloadavg()
    save()
    summary.write_summary(args, summary_figures(out))


def summary_figures(out: dict[str, Any]) -> dict[str, Any]:
    """The idle server's draw (the baseline's tokens/s alone, beside an idle server, alone again) and, per
    candidate, the raw tokens/s and the paired speed-up by launch with their spreads."""
    return {
        "workload": out["workload"],
        "requests": len(out["requests"]),
        "max_tokens": out["max_tokens"],
        "idle_draw_baseline_tokens_per_s": {
            p["label"]: round(p["baseline_tokens_per_s"], 2) for p in out["passes"] if p["kind"] == "idle-draw"
        },
        "by_variant": out["summary"],
    }


if __name__ == "__main__":
    main()
