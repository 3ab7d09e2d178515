"""The benchmarks keep their raw outputs out of the tree and one small summary each in it: every script writes under
`--out-dir` (git-ignored by default), and `benchmarks/results/NAME.json` carries the figures with the command,
commit and machine that produced them (docs/measurements.md lists them)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest

from runinfra_opt import measurements

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"


def test_every_kept_summary_names_its_script_and_where_it_comes_from() -> None:
    kept = sorted((BENCHMARKS / "results").glob("*.json"))
    assert kept
    for path in kept:
        record = json.loads(path.read_text(encoding="utf-8"))
        assert {"benchmark", "date", "command", "commit", "machine", "raw", "figures"} <= set(record), path.name
        script = REPO / record["benchmark"]
        assert script.is_file(), path.name
        assert path.stem.partition("-")[0] == script.stem, path.name  # NAME.json, or NAME-MODE.json
        assert record["figures"], path.name
    assert sum(p.stat().st_size for p in (BENCHMARKS / "results").iterdir()) < 2_000_000


def test_every_script_writes_under_out_dir_and_has_a_kept_summary() -> None:
    scripts = sorted(BENCHMARKS.glob("*.py"))
    assert 0 < len(scripts) <= 8  # what the docs cite and what a user runs on their own hardware; git keeps the rest
    for script in scripts:
        assert "measurements.add_output_options(parser, __file__)" in script.read_text(encoding="utf-8"), script.name
        assert (BENCHMARKS / "results" / f"{script.stem}.json").is_file(), script.name


def test_the_default_out_dir_is_git_ignored() -> None:
    parser = argparse.ArgumentParser()
    measurements.add_output_options(parser, "benchmarks/some_bench.py")
    args = parser.parse_args([])
    assert args.out_dir == Path(".runinfra/benchmarks/some_bench")
    assert not args.keep
    ignored = subprocess.run(["git", "check-ignore", "-q", str(args.out_dir / "summary.json")], cwd=REPO, check=False)
    assert ignored.returncode == 0


def test_the_summary_records_the_command_commit_and_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    monkeypatch.setattr(measurements, "RESULTS", kept)
    parser = argparse.ArgumentParser()
    measurements.add_output_options(parser, "benchmarks/some_bench.py")
    args = parser.parse_args(["--out-dir", str(tmp_path / "out"), "--keep"])
    path = measurements.write_summary(args, {"tokens_per_s": 1.5}, ["--requests", "8"])
    assert path == tmp_path / "out" / "summary.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["benchmark"] == "benchmarks/some_bench.py"
    assert record["command"] == "benchmarks/some_bench.py --requests 8"
    assert record["commit"] != measurements.NOT_RECORDED
    assert record["machine"]["cores"] == os.cpu_count()
    assert record["figures"] == {"tokens_per_s": 1.5}
    assert json.loads((kept / "some_bench.json").read_text(encoding="utf-8")) == record
    measurements.write_summary(args, {}, [], kept="some_bench-mode")  # a mode's own kept summary
    assert (kept / "some_bench-mode.json").is_file()
