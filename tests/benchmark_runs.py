"""Run a benchmark script as a user runs it (`python benchmarks/NAME.py ...`), in the test's own working directory:
the tests of the benchmarks go through their command lines, never their modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str) -> str:
    """Run `benchmarks/<script>` with `args`; its stdout. Fails the test with the script's output when it fails."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    return done.stdout
