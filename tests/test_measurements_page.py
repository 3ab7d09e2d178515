"""docs/measurements.md is generated from benchmarks/results/*.json (`python -m runinfra_opt.measurements`): the
page in the repository is the one the kept summaries give, and each summary shows its command, commit, machine
and headline figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runinfra_opt import measurements


def test_the_page_is_the_one_the_kept_summaries_give() -> None:
    page = measurements.PAGE.read_text(encoding="utf-8")
    assert page == measurements.render(), "stale: run python -m runinfra_opt.measurements"
    for path in sorted(measurements.RESULTS.glob("*.json")):
        assert f"## {path.stem}\n" in page, path.name


def test_check_fails_on_a_stale_page_and_passes_once_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "measurements.md"
    page.write_text("# Measurements\n\nan edit by hand\n", encoding="utf-8")
    monkeypatch.setattr(measurements, "PAGE", page)
    assert measurements.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert measurements.main([]) == 0
    assert measurements.main(["--check"]) == 0


def test_a_summary_shows_its_command_commit_machine_and_headline(tmp_path: Path) -> None:
    record = {
        "benchmark": "benchmarks/some_bench.py",
        "date": "2026-12-07T10:00:00Z",
        "command": "benchmarks/some_bench.py --requests 8",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "machine": {"cpu": "Some CPU", "cpu_extensions": ["avx2", "avx512f"], "cores": 2, "gpus": []},
        "headline": [["variants", "*", "speedup"], ["wall_s"]],
        "figures": {
            "variants": {"ngram-k2": {"speedup": 1.2345, "notes": "not shown"}, "ngram-k4": {"speedup": 0.9}},
            "wall_s": 12.5,
            "settings": {"shown": False},
        },
    }
    (tmp_path / "some_bench.json").write_text(json.dumps(record), encoding="utf-8")
    page = measurements.render(tmp_path)
    assert "## some_bench\n" in page
    assert "`benchmarks/some_bench.py --requests 8`; commit 0123456789ab, 2026-12-07;" in page
    assert "Some CPU; 2 cores; avx2, avx512f; no GPU." in page
    assert "| variants.ngram-k2.speedup | 1.234 |" in page
    assert "| variants.ngram-k4.speedup | 0.9 |" in page
    assert "| wall_s | 12.5 |" in page
    assert "not shown" not in page
    assert "settings" not in page
