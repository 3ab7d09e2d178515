"""A 100,000-request recording plans in bounded memory: `load plan` streams the workload (validated in one pass,
planned in one pass per level), so its peak RSS on 100,000 requests stays within a few MB of its peak on 1,000
(only the ids seen, kept to reject duplicates, grow with the file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BIG = 100_000
SMALL = 1_000
GROWTH_LIMIT_MB = 25
"""Measured here: 58 MB at 1,000 requests, 74 MB at 100,000 (+16 MB, the ids). Loading the same 100,000 requests
into memory (`load_workload`) and planning them peaks at 114 MB (+56 MB), which this limit rejects."""
PEAK_LIMIT_MB = 300


def _write(path: Path, lines: int) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(lines):
            record = {
                "id": f"r{i}",
                "arrival_s": round(i * 0.05, 3),
                "category": ("chat", "code", "json")[i % 3],
                "messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}? Explain briefly."}],
                "max_tokens": 64,
            }
            fh.write(json.dumps(record) + "\n")
    return path


def plan_peak_mb(path: Path, load: str) -> tuple[dict[str, object], float]:
    """`runinfra-opt load plan --json` on the file in a child process: its JSON output and its peak RSS (MB)."""
    # Linux keeps a process's peak RSS across fork + exec, so a child of pytest would report pytest's peak: a small
    # driver process runs the CLI and reads its child's peak (RUSAGE_CHILDREN), as tests/test_workload_memory.py.
    driver = (
        "import resource, subprocess, sys\n"
        "run = subprocess.run([sys.executable, '-m', 'runinfra_opt', 'load', 'plan', '--workload', sys.argv[1],\n"
        "                      '--load', sys.argv[2], '--json'], capture_output=True, text=True)\n"
        "print(run.returncode)\n"
        "print(run.stdout.replace('\\n', ' ') or run.stderr.replace('\\n', ' '))\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"  # KiB on Linux
    )
    out = subprocess.run([sys.executable, "-c", driver, str(path), load], capture_output=True, text=True, check=True)
    exit_code, payload, peak_kib = out.stdout.strip().splitlines()
    assert exit_code == "0", out.stdout + out.stderr
    return json.loads(payload), int(peak_kib) / 1024


def test_100k_request_workload_plans_in_bounded_memory(tmp_path: Path) -> None:
    load = "replay+rate:20"
    small, small_peak = plan_peak_mb(_write(tmp_path / "small.jsonl", SMALL), load)
    big, big_peak = plan_peak_mb(_write(tmp_path / "big.jsonl", BIG), load)
    replay, rate = big["levels"]  # type: ignore[misc]
    assert big["requests"] == BIG
    assert replay["requests"] == BIG
    assert replay["span_s"] == round((BIG - 1) * 0.05, 3)
    assert rate["requests"] == BIG
    assert abs(rate["mean_rate_per_s"] - 20) < 0.5
    assert small["requests"] == SMALL
    print(f"peak RSS: {SMALL:,} requests {small_peak:.0f} MB, {BIG:,} requests {big_peak:.0f} MB")
    assert big_peak < PEAK_LIMIT_MB, f"peak RSS {big_peak:.0f} MB"
    assert big_peak - small_peak < GROWTH_LIMIT_MB, f"peak RSS {small_peak:.0f} MB -> {big_peak:.0f} MB"
