"""The fault matrix: every way an `optimize` run can die or be disturbed, and what it leaves.

Each cell runs the real CLI (`python -m runinfra_opt optimize`, in a process of its own) on a small run and
injects one fault at one point: a signal to the tool (SIGTERM, SIGINT, SIGKILL) after a phase or in the middle of
the confirmation or of a load level; a vLLM server that dies, hangs (SIGSTOP), answers 500s or drops connections
mid-stream, or never becomes healthy; the disk filling up (a small tmpfs, mounted when this runs as root; else
the file-size limit, RLIMIT_FSIZE, which fails writes the same way); a corrupt results file, cost cache or model on
the next start; two `--resume`s of one run at once. For each cell it records the exit code, the seconds from the
fault to the exit, the status `report` reads, the processes left behind (every process the cell started carries a
marker in its environment; counted once none is left, or 5 s after the exit), the finished records lost (those on
disk when the fault struck that are missing after), and whether `optimize --resume` then reaches the decision of an
undisturbed run on the same inputs.

The in-process engine runs the tiny models of tests/tiny_models.py (the target and its draft, a variant clearly
slower than the baseline, so that every complete run reaches the same decision); the vLLM engine runs the stand-in
server of tests/fake_vllm (its fault modes), since a real server cannot be made to answer 500s or drop a stream, and
a real launch takes two minutes (the real server's start-up cancellation: tests/test_vllm_e2e.py).

    python benchmarks/faults.py [--only NAME,...] [--keep]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages

from runinfra_opt import measurements  # noqa: E402
from tests.fault_matrix import Bench, can_mount_tmpfs, cells, table  # noqa: E402

HEADLINE = [
    ("cells",),
    ("left_behind_total",),
    ("lost_total",),
    ("slowest_signal_exit_s",),
    ("reference_decisions", "*"),
]
"""The figures docs/measurements.md shows (paths into the summary's figures; `*`: every key or item)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated cell names (default: every cell)")
    measurements.add_output_options(parser, __file__)
    args = parser.parse_args(argv)
    out = measurements.out_dir(args).resolve()
    bench = Bench(out)
    tmpfs = can_mount_tmpfs(out)
    chosen = cells(bench, tmpfs)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    rows = []
    for name, run in chosen.items():
        started = time.monotonic()
        cell = run()
        rows.append(cell)
        print(f"{name}: exit {cell.exit_code} in {cell.exit_s} s, status {cell.status}, left {cell.left_behind}, "
              f"lost {cell.lost}, resume {cell.resume_exit} -> {cell.decision} ({time.monotonic() - started:.0f} s)",
              flush=True)  # fmt: skip
    (out / "cells.json").write_text(json.dumps([asdict(c) for c in rows], indent=2))
    print(table(rows))
    figures: dict[str, Any] = {
        "disk_full_by": "tmpfs" if tmpfs else "RLIMIT_FSIZE",
        "reference_decisions": bench.reference,
        "cells": [{k: v for k, v in asdict(c).items() if k != "stderr_tail"} for c in rows],
        "left_behind_total": sum(c.left_behind for c in rows),
        "lost_total": sum(c.lost or 0 for c in rows),
        "slowest_signal_exit_s": max((c.exit_s or 0.0 for c in rows if "SIG" in c.fault), default=None),
    }
    # a rerun of chosen cells (after a fix) is kept apart from the whole matrix
    measurements.write_summary(
        args,
        figures,
        sys.argv[1:] if argv is None else argv,
        kept="faults-rerun" if args.only else None,
        headline=HEADLINE,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
