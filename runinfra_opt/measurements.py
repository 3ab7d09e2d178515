"""What the benchmarks measured: the summary each writes, and docs/measurements.md generated from the kept ones.

Every script in benchmarks/ takes `--out-dir` (default `.runinfra/benchmarks/<script>/`, git-ignored, outside the
source tree) for its raw outputs and writes there `summary.json`: the figures it reports, with the command line,
the commit and the machine that produced them, and the paths of its headline figures. `--keep` also writes the
summary to `benchmarks/results/<script>.json`, the one the repository keeps and that the constants derived from a
measurement cite. Run the scripts from the repository root.

    python -m runinfra_opt.measurements [--check]   # write docs/measurements.md (--check: exit 1 if stale)
"""

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
    args: argparse.Namespace,
    figures: dict[str, Any],
    argv: Sequence[str] | None = None,
    kept: str | None = None,
    headline: Sequence[Sequence[str]] = (),
) -> Path:
    """Write `summary.json` into the run's output directory, and with `--keep` the kept one,
    `benchmarks/results/<kept>.json` (default: the script's name; a script whose modes report different figures
    keeps one per mode); its path. `headline`: the figures docs/measurements.md shows, as paths of keys into
    `figures` (`*` for every key or item)."""
    name = args.benchmark
    kept = kept or name
    record = {
        "benchmark": f"benchmarks/{name}.py",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join([f"benchmarks/{name}.py", *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(),
        "machine": machine(),
        "raw": str(args.out_dir),
        "headline": [list(path) for path in headline],
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


# ---- docs/measurements.md, generated from the kept summaries -------------------------------------------------

PAGE = REPO / "docs" / "measurements.md"
MAX_DEPTH = 3
"""Figures nested deeper than this are counted on the page, not listed: the summary holds them."""
MAX_ROWS = 16
"""At most this many figures a summary on the page; the rest are counted and stay in the summary."""


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        if all(not isinstance(item, dict | list) for item in value):
            return ", ".join(_value(item) for item in value) or "none"
        if all(isinstance(item, list) and len(item) <= 4 for item in value):
            return "; ".join(_value(item) for item in value)
        return f"{len(value)} entries"
    if isinstance(value, dict):
        return f"{len(value)} figures"
    return "none" if value is None else str(value).replace("|", "/").replace("\n", " ")


def _rows(figures: dict[str, Any], prefix: str = "", depth: int = 1) -> list[tuple[str, str]]:
    """Every figure to `MAX_DEPTH`, by its path of keys."""
    rows: list[tuple[str, str]] = []
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and depth < MAX_DEPTH:
            rows.extend(_rows(value, f"{name}.", depth + 1))
        else:
            rows.append((name, _value(value)))
    return rows


def _short(key: str) -> str:
    """A key on the page: a file path's last part (the summaries key some figures by run directory)."""
    return Path(key).name if key.startswith(("/", ".", "benchmarks/")) else key


def _item(item: Any, index: int) -> str:
    """A list item's name on the page: its own name, run or variant (and mode), else its index."""
    if isinstance(item, dict):
        named = next((str(item[key]) for key in ("name", "run", "variant") if key in item), str(index))
        return _short(named) + (f"/{item['mode']}" if "mode" in item else "")
    return str(index)


def _matches(node: Any, path: Sequence[str], label: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The figures under `node` at `path` (`*`: every key or item), each with its label."""
    if not path:
        return [(".".join(label), _value(node))]
    head, rest = path[0], path[1:]
    if head == "*" and isinstance(node, dict):
        return [row for key, value in node.items() for row in _matches(value, rest, (*label, _short(key)))]
    if head == "*" and isinstance(node, list):
        return [row for i, value in enumerate(node) for row in _matches(value, rest, (*label, _item(value, i)))]
    if isinstance(node, dict) and head in node:
        return _matches(node[head], rest, (*label, head))
    return []


def _listed(value: Any, empty: str) -> str:
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or empty
    return str(value or empty)


def _machine(record: dict[str, Any]) -> str:
    """CPU, cores, the CPU's vector extensions and the GPUs, as the summary recorded them."""
    machine = record.get("machine")
    if not isinstance(machine, dict):
        return f"machine {machine or NOT_RECORDED}"
    return "; ".join([
        str(machine.get("cpu", NOT_RECORDED)),
        f"{machine.get('cores', NOT_RECORDED)} cores",
        _listed(machine.get("cpu_extensions"), "no avx512"),
        _listed(machine.get("gpus"), "no GPU"),
    ])  # fmt: skip


def _commit(commit: str) -> str:
    """A full hash shortened to 12 characters; a note kept whole."""
    head, _, dirty = commit.partition("+")
    full = len(head) == 40 and all(c in "0123456789abcdef" for c in head)
    return f"{head[:12]}{'+' + dirty if dirty else ''}" if full else commit


def section(path: Path) -> str:
    """One kept summary as the page shows it: its command, commit, machine and a table of its figures."""
    record = json.loads(path.read_text(encoding="utf-8"))
    headline = record.get("headline") or []
    rows = [row for pattern in headline for row in _matches(record["figures"], pattern)]
    rows = rows or _rows(record["figures"])
    shown, rest = rows[:MAX_ROWS], len(rows) - MAX_ROWS
    lines = [
        f"## {path.stem}",
        "",
        f"`{record['command']}`; commit {_commit(str(record['commit']))}, {record['date'][:10]}; {_machine(record)}.",
        "",
        "| figure | value |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in shown),
    ]
    if rest > 0:
        lines += ["", f"{rest} more in `benchmarks/results/{path.name}`."]
    return "\n".join(lines) + "\n"


def render(results: Path | None = None) -> str:
    """docs/measurements.md: a header, then one section per kept summary, by name."""
    results = results or RESULTS
    head = (
        "# Measurements\n\n"
        "Generated from `benchmarks/results/*.json` (each benchmark's `--keep`) by\n"
        "`python -m runinfra_opt.measurements`; do not edit. Superseded figures live in git.\n"
    )
    return "\n".join([head, *(section(path) for path in sorted(results.glob("*.json")))])


def main(argv: Sequence[str] | None = None) -> int:
    """Write docs/measurements.md, or with `--check` exit 1 when it differs from what the summaries give."""
    parser = argparse.ArgumentParser(prog="python -m runinfra_opt.measurements", description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/measurements.md is stale")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE} is stale: run python -m runinfra_opt.measurements", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
