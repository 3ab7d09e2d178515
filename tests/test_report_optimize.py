"""Every report format rendered from the results of a real `optimize` run on the tiny models (not hand-built),
through the CLI, and a comparison of that run with itself."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.results import RunResults, load_results
from tests.test_report_browser import CHROMIUM
from tests.test_report_browser import run_chromium as chromium

WORKLOAD = [
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc abc", "max_tokens": 16, "arrival_s": 0.0},
    {"id": "echo-2", "category": "echo", "prompt": "hello hello hello hello", "max_tokens": 16, "arrival_s": 0.4},
    {
        "id": "chat-1",
        "category": "chat",
        "messages": [{"role": "user", "content": "tell me a story about a cat"}],
        "max_tokens": 16,
        "arrival_s": 0.8,
    },
]


@pytest.fixture(scope="module")
def optimized_run(tiny_models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of one small real `optimize` run: 3 requests, 7 variants, 2 confirmed + baseline."""
    tmp = tmp_path_factory.mktemp("report-optimize")
    workload = tmp / "tiny.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in WORKLOAD), encoding="utf-8")
    target, draft = tiny_models
    run_dir = tmp / "runs" / "run-1"
    args = [
        "optimize", "--workload", str(workload), "--target", str(target), "--draft", str(draft),
        "--lookahead", "2,4", "--ngram-max", "2", "--exit-layers", "2", "--confirm", "2", "--repeats", "1",
        "--threads", "1", "--runs-dir", str(tmp / "runs"), "--run-dir", str(run_dir), "--out", str(tmp / "m.yaml"),
    ]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return run_dir


def _report(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(app, ["report", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_table_and_markdown_from_a_real_run(runner: CliRunner, optimized_run: Path) -> None:
    results = load_results(optimized_run)
    assert results.status == "complete"
    assert results.decision is not None
    table = _report(runner, str(optimized_run))
    markdown = _report(runner, str(optimized_run), "--format", "markdown")
    winner = results.decision.winner
    for text in (table, markdown):
        assert f"Winner: {winner}" in text
        assert results.decision.reason[:60] in text.replace("\n", " ") or results.decision.reason[:40] in text
        assert "Environment: run run-1" in text
        for variant in results.variants:
            assert variant.name in text, variant.name
    confirmed = [v for v in results.variants if v.measured is not None and v.predicted is not None]
    assert len(confirmed) >= 2
    for variant in confirmed:  # predicted vs measured lists every confirmed variant
        assert re.search(rf"\| {re.escape(variant.name)} \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% \|", markdown), variant.name


def test_json_and_csv_from_a_real_run(runner: CliRunner, optimized_run: Path, tmp_path: Path) -> None:
    import pandas as pd

    results = load_results(optimized_run)
    text = _report(runner, str(optimized_run), "--format", "json")
    assert RunResults.model_validate_json(text) == results

    variants = pd.read_csv(io.StringIO(_report(runner, str(optimized_run), "-f", "csv")))
    assert set(variants["variant"]) == {v.name for v in results.variants}
    assert (variants["status"] == "winner").sum() == (1 if results.decision else 0)
    measured = variants.dropna(subset=["measured_tokens_per_s"])
    assert set(measured["variant"]) == {v.name for v in results.variants if v.measured is not None}

    requests = pd.read_csv(io.StringIO(_report(runner, str(optimized_run), "-f", "csv", "--csv-kind", "requests")))
    expected = sum(len(v.measured_requests) + len(v.predicted_requests) for v in results.variants)
    assert len(requests) == expected
    assert set(requests["request_id"]) == {r["id"] for r in WORKLOAD}
    assert (requests["output_tokens"] > 0).all()


def test_html_from_a_real_run(runner: CliRunner, optimized_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert _report(runner, str(optimized_run), "-f", "html", "--output", str(out)) == ""
    page = out.read_text(encoding="utf-8")
    for div in ("plot-lookahead", "plot-accepted", "plot-ttft", "plot-categories"):
        assert f'id="{div}"' in page, div
    assert not re.search(r"<script[^>]+src=", page)
    if CHROMIUM is None:
        return  # test_report_browser.py reports the skip; the checks above still ran
    dom = chromium(tmp_path, "--dump-dom", out.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    drawn = re.findall(r'<div id="(plot-[a-z]+)" class="[^"]*js-plotly-plot', dom.stdout)
    assert sorted(drawn) == ["plot-accepted", "plot-categories", "plot-lookahead", "plot-ttft"]


def test_compare_a_real_run_with_itself(runner: CliRunner, optimized_run: Path) -> None:
    result = runner.invoke(app, ["report", "--compare", str(optimized_run), str(optimized_run)])
    assert result.exit_code == 0, result.output
    assert "Gate passed" in result.stdout
