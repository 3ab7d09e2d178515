"""Large workloads stream: a 200,000-line file validates with peak memory under 300 MB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LINES = 200_000
PEAK_LIMIT_MB = 300


def test_200k_line_workload_validates_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i in range(LINES):
            record = {
                "id": f"r{i}",
                "arrival_s": i * 0.01,
                "category": ("chat", "code", "json")[i % 3],
                "messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}? Explain briefly."}],
                "max_tokens": 64,
                "response": f"{i} plus {i} is {2 * i}.",
            }
            fh.write(json.dumps(record) + "\n")
    assert path.stat().st_size > 40_000_000  # the file itself is far larger than what may stay in memory
    # Linux keeps a process's peak RSS across fork/vfork + exec, so a child of pytest (hundreds of MB) would
    # report pytest's peak. A small driver process runs the CLI and reads its child's peak (RUSAGE_CHILDREN).
    driver = (
        "import resource, subprocess, sys\n"
        "run = subprocess.run([sys.executable, '-m', 'runinfra_opt', 'workload', 'validate', sys.argv[1]],\n"
        "                     capture_output=True, text=True)\n"
        "print(run.returncode)\n"
        "print(run.stdout.strip() or run.stderr.strip())\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"  # KiB on Linux
    )
    out = subprocess.run([sys.executable, "-c", driver, str(path)], capture_output=True, text=True, check=True)
    exit_code, summary, peak_kib = out.stdout.strip().splitlines()
    assert exit_code == "0", out.stdout + out.stderr
    assert summary.startswith(f"ok: {LINES} requests, fingerprint sha256:")
    assert int(peak_kib) / 1024 < PEAK_LIMIT_MB, f"peak RSS {int(peak_kib) / 1024:.0f} MB"
