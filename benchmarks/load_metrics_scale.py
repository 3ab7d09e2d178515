"""How long do per-level metrics take, and how much memory, on a long run? Builds a synthetic run of `--requests`
records (sent 50 ms apart at `rate:20`, `--chunks` one-token chunks each, as the runner keeps them: arrays of
chunk times) and computes `level_metrics` with a TTFT SLO (windowed tokens/s and goodput, each with its
bootstrap interval, and the percentiles). Prints the time and the process's peak RSS before and after.

    .venv/bin/python benchmarks/load_metrics_scale.py [--requests 100000] [--chunks 64] [--out-dir DIR] [--keep]

The figures go to `--out-dir`/summary.json (`--keep`: benchmarks/results/load_metrics_scale.json).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from array import array
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402
from runinfra_opt.load import LevelRun, LoadRecord, Rate, level_metrics


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--chunks", type=int, default=64)
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()
    records = []
    for i in range(args.requests):
        sent = i * 0.05
        times = np.linspace(sent + 0.1, sent + 1.0, args.chunks).tolist()
        records.append(
            LoadRecord(
                index=i,
                request_id=f"r{i}",
                category="c",
                planned_s=sent,
                sent_s=sent,
                done_s=sent + 1.0,
                success=True,
                ttft_s=0.1,
                e2e_s=1.0,
                output_tokens=args.chunks,
                chunk_s=array("d", times),
                chunk_tokens=array("q", [1] * args.chunks),
            )  # fmt: skip
        )
    run = LevelRun(Rate(20.0), records, started_at=0.0, duration_s=args.requests * 0.05 + 1.0, peak_in_flight=21)
    before = peak_mb()
    start = time.perf_counter()
    metrics = level_metrics([run], slo_ttft_ms=200)
    seconds = time.perf_counter() - start
    print(
        f"{args.requests:,} requests x {args.chunks} chunks: level_metrics {seconds:.1f} s; peak RSS {before:.0f} MB "
        f"(the records) -> {peak_mb():.0f} MB; tokens/s {metrics.output_tokens_per_s}; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    tps = metrics.output_tokens_per_s
    figures = {
        "requests": args.requests,
        "chunks": args.chunks,
        "level_metrics_s": round(seconds, 2),
        "peak_rss_mb_records": round(before),
        "peak_rss_mb_after": round(peak_mb()),
        "tokens_per_s": None if tps is None else round(tps.value, 2),
    }
    summary.write_summary(args, figures)


if __name__ == "__main__":
    main()
