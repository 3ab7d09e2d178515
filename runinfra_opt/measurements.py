"""Where a benchmark writes what it measured, and the small summary the repository keeps of it.

Every script in benchmarks/ takes `--out-dir` (default `.runinfra/benchmarks/<script>/`, git-ignored, outside the
source tree) for its raw outputs and writes there `summary.json`: the figures it reports, with the command line,
the commit and the machine that produced them. `--keep` also writes the summary to
`benchmarks/results/<script>.json`, the one the repository keeps and that docs/measurements.md and the constants
derived from a measurement cite. Run the scripts from the repository root."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
"""The kept summaries, one per script: `benchmarks/results/<script>.json`."""
OUT_ROOT = Path(".runinfra") / "benchmarks"
NOT_RECORDED = "not recorded"


def add_output_options(parser: argparse.ArgumentParser, script: str) -> None:
    """`--out-dir` and `--keep` for the script at `script` (its `__file__`)."""
    name = Path(script).stem
    parser.add_argument(
        "--out-dir", type=Path, default=OUT_ROOT / name,
        help=f"raw outputs and summary.json go here (default: {OUT_ROOT / name}, git-ignored)",
    )  # fmt: skip
    parser.add_argument(
        "--keep", action="store_true",
        help=f"also write the summary to benchmarks/results/{name}.json, the one the repository keeps",
    )  # fmt: skip
    parser.set_defaults(benchmark=name)


def out_dir(args: argparse.Namespace) -> Path:
    """The run's output directory, created."""
    path: Path = args.out_dir
    path.mkdir(parents=True, exist_ok=True)
    return path


def git_commit() -> str:
    """The repository's commit, `+dirty` when the work tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=REPO, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return NOT_RECORDED
    return head + ("+dirty" if dirty.returncode != 0 else "")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu() -> tuple[str, list[str]]:
    """The CPU's model name and the vector extensions that decide bfloat16's speed here."""
    model, flags = platform.processor() or NOT_RECORDED, set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return model, [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    """What ran the benchmark: CPU model and extensions, cores, GPUs, OS, python and torch versions."""
    model, extensions = _cpu()
    return {
        "cpu": model,
        "cpu_extensions": extensions,
        "cores": os.cpu_count(),
        "gpus": _gpus(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def write_summary(
    args: argparse.Namespace, figures: dict[str, Any], argv: Sequence[str] | None = None, kept: str | None = None
) -> Path:
    """Write `summary.json` into the run's output directory, and with `--keep` the kept one,
    `benchmarks/results/<kept>.json` (default: the script's name; a script whose modes report different figures
    keeps one per mode); its path."""
    name = args.benchmark
    kept = kept or name
    record = {
        "benchmark": f"benchmarks/{name}.py",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join([f"benchmarks/{name}.py", *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(),
        "machine": machine(),
        "raw": str(args.out_dir),
        "figures": figures,
    }
    text = json.dumps(record, indent=1) + "\n"
    path = out_dir(args) / "summary.json"
    path.write_text(text, encoding="utf-8")
    if args.keep:
        (RESULTS / f"{kept}.json").write_text(text, encoding="utf-8")
        print(f"summary: {path}, kept as {RESULTS / f'{kept}.json'}")
    else:
        print(f"summary: {path}")
    return path
