"""`runinfra-opt report`: every format rendered from hand-built results, snapshots of the human formats on a
deterministic console, machine formats parsed back, and the CLI's error handling (exit 2, one clear line)."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.report import render_csv, render_html, render_json, render_markdown, render_table
from runinfra_opt.report.view import variant_rows
from runinfra_opt.results import SCHEMA_VERSION, RunResults, load_results, resolve_run, save_results
from tests.report_fixtures import baseline_wins, build_results, running

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("RUNINFRA_UPDATE_SNAPSHOTS") == "1"
FIXTURES = {"speculation": build_results, "baseline_wins": baseline_wins, "running": running}


def check_snapshot(name: str, text: str) -> None:
    """Compare with tests/snapshots/<name>; RUNINFRA_UPDATE_SNAPSHOTS=1 rewrites it (review the diff)."""
    path = SNAPSHOTS / name
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"snapshot {path} missing: run with RUNINFRA_UPDATE_SNAPSHOTS=1 and review it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"output differs from {path}"


def table_text(results: RunResults) -> str:
    console = Console(width=100, file=io.StringIO(), color_system=None)
    render_table(results, console)
    return console.file.getvalue()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", sorted(FIXTURES))
def test_table_snapshot(kind: str) -> None:
    check_snapshot(f"report_{kind}.txt", table_text(FIXTURES[kind]()))


@pytest.mark.parametrize("kind", sorted(FIXTURES))
def test_markdown_snapshot(kind: str) -> None:
    check_snapshot(f"report_{kind}.md", render_markdown(FIXTURES[kind]()))


def test_table_shows_every_section_and_fits_100_columns() -> None:
    text = table_text(build_results())
    assert max(len(line) for line in text.splitlines()) <= 100
    for expected in (
        "Winner: ngram-n2-k4, 1.52x [1.48,1.57] throughput over the baseline",
        "Why: ngram-n2-k4 is 1.52x",
        "Per category",
        "Predicted vs measured",
        "simulated single-replica FIFO queue",
        "early_exit-l2-k4: disqualified: greedy output differs from the baseline on request r3",
        "draft:tiny-draft-k4: ruled out: max TTFT regression 10%",
        "Environment: run 20261129T230000Z-a1b2c3",
        "transformers 5.24.0",
    ):
        assert expected in text, expected
    # Every variant has a row, and predicted-only ones are marked as predicted.
    for name in ("baseline", "ngram-n2-k4", "ngram-n2-k8", "ngram-n1-k2", "ngram-n3-k6", "draft:tiny-draft-k8",
                 "early_exit-l2-k2"):
        assert re.search(rf"^{re.escape(name)}\s", text, re.MULTILINE), name
    assert re.search(r"^ngram-n1-k2 .*~1\.\d\dx .* predicted only", text, re.MULTILINE)


def test_status_of_each_variant() -> None:
    rows = {r.name: r for r in variant_rows(build_results())}
    assert rows["ngram-n2-k4"].status == "winner"
    assert rows["baseline"].status == "baseline"
    assert rows["ngram-n2-k8"].status == "confirmed"
    assert rows["ngram-n1-k2"].status == "predicted only"
    assert rows["draft:tiny-draft-k4"].status == "ruled out"
    assert rows["early_exit-l2-k4"].status == "disqualified"
    assert rows["early_exit-l2-k4"].lossless is False
    assert list(rows)[0] == "ngram-n2-k4"  # winner first
    winner = rows["ngram-n2-k4"]
    assert winner.prediction_error is not None
    assert winner.predicted_tokens_per_s is not None
    assert winner.measured_tokens_per_s is not None
    assert winner.prediction_error == pytest.approx(winner.predicted_tokens_per_s / winner.measured_tokens_per_s - 1)


def test_markdown_folds_predicted_only_variants() -> None:
    text = render_markdown(build_results())
    assert text.startswith("## runinfra-opt: Winner: ngram-n2-k4")
    head, _, details = text.partition("<details>")
    assert "| **ngram-n2-k4** |" in head
    assert "ngram-n1-k2" not in head
    assert "| ngram-n1-k2 |" in details
    assert "4 more variant(s) predicted only" in details


def test_incomplete_run_says_so() -> None:
    text = table_text(running())
    assert "No decision yet: run status running (last phase finished: confirm)." in text
    assert "this run is not complete" in text


def test_json_round_trips(tmp_path: Path) -> None:
    results = build_results()
    path = tmp_path / "results.json"
    path.write_text(render_json(results), encoding="utf-8")
    assert load_results(path) == results


def test_csv_variants_parse_back() -> None:
    import pandas as pd

    results = build_results()
    frame = pd.read_csv(io.StringIO(render_csv(results, "variants")))
    assert len(frame) == len(results.variants)
    assert set(frame["variant"]) == {v.name for v in results.variants}
    row = frame.set_index("variant").loc["ngram-n2-k4"]
    winner = results.variant("ngram-n2-k4")
    assert winner is not None
    assert winner.measured is not None
    assert row["status"] == "winner"
    assert row["measured_tokens_per_s"] == pytest.approx(winner.measured.tokens_per_s)
    assert row["ngram_max"] == 2
    assert row["lookahead"] == 4
    assert pd.isna(frame.set_index("variant").loc["ngram-n1-k2", "measured_tokens_per_s"])
    assert "differs from the baseline" in frame.set_index("variant").loc["early_exit-l2-k4", "disqualified"]


def test_csv_requests_parse_back() -> None:
    import pandas as pd

    results = build_results()
    frame = pd.read_csv(io.StringIO(render_csv(results, "requests")))
    expected = sum(len(v.measured_requests) + len(v.predicted_requests) for v in results.variants)
    assert len(frame) == expected
    assert set(frame["source"]) == {"measured", "predicted"}
    winner = results.variant("ngram-n2-k4")
    assert winner is not None
    first = winner.measured_requests[0]
    row = frame[(frame.variant == "ngram-n2-k4") & (frame.source == "measured")].iloc[0]
    assert json.loads(row["accepted_per_pass"]) == first.accepted_per_pass
    assert row["e2e_s"] == pytest.approx(first.e2e_s)
    mismatch = frame[(frame.variant == "early_exit-l2-k4") & (frame.request_id == "r3") & (frame.source == "measured")]
    assert set(mismatch["first_mismatch"]) == {17}


def test_html_is_self_contained_and_deterministic() -> None:
    results = build_results()
    page = render_html(results)
    assert page == render_html(results)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src=", page), "external script"
    assert not re.search(r"<link[^>]+href=", page), "external stylesheet"
    assert len(page) > 1_000_000, "plotly.js should be inlined"
    for div in ("plot-lookahead", "plot-accepted", "plot-ttft", "plot-categories"):
        assert f'id="{div}"' in page
    assert "ngram-n2-k4" in page
    assert "greedy output differs from the baseline" in page


def test_html_without_plot_data_says_why() -> None:
    page = render_html(running())
    assert "No per-category figures (no decision yet)." in page
    assert 'id="plot-lookahead"' in page


# CLI ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runs" / "20261129T230000Z-a1b2c3"
    save_results(build_results(), path / "results.json")
    (tmp_path / "runs" / "latest").symlink_to(path.name)
    return path


@pytest.mark.parametrize("fmt", ["table", "markdown", "json", "csv", "html"])
def test_cli_every_format(runner: CliRunner, run_dir: Path, fmt: str) -> None:
    result = runner.invoke(app, ["report", str(run_dir), "--format", fmt])
    assert result.exit_code == 0, result.output
    expected = {
        "table": "Winner: ngram-n2-k4",
        "markdown": "## runinfra-opt: Winner: ngram-n2-k4",
        "json": f'"schema_version": {SCHEMA_VERSION}',
        "csv": "variant,method,lookahead",
        "html": 'id="plot-lookahead"',
    }[fmt]
    assert expected in result.stdout


def test_cli_latest_and_run_id(runner: CliRunner, run_dir: Path) -> None:
    runs = run_dir.parent
    for args in ([], ["latest"], [run_dir.name], [str(run_dir / "results.json")]):
        result = runner.invoke(app, ["report", *args, "--runs-dir", str(runs), "-f", "markdown"])
        assert result.exit_code == 0, (args, result.output)
        assert "Winner: ngram-n2-k4" in result.stdout
    # `latest` as a plain file naming the run (no symlinks).
    (runs / "latest").unlink()
    (runs / "latest").write_text(run_dir.name + "\n", encoding="utf-8")
    assert resolve_run("latest", runs) == run_dir / "results.json"


def test_cli_no_latest_run(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert "no run to report" in result.stderr
    assert "Traceback" not in result.output


def test_cli_output_file(runner: CliRunner, run_dir: Path, tmp_path: Path) -> None:
    for fmt, name in (("html", "report.html"), ("table", "report.txt"), ("csv", "variants.csv")):
        out = tmp_path / "out" / name
        result = runner.invoke(app, ["report", str(run_dir), "-f", fmt, "--output", str(out)])
        assert result.exit_code == 0, result.output
        assert out.is_file()
        assert result.stdout == ""
        umask = os.umask(0)
        os.umask(umask)
        assert out.stat().st_mode & 0o777 == 0o666 & ~umask, "a report gets the usual permissions, not 0600"
    assert "Winner: ngram-n2-k4" in (tmp_path / "out" / "report.txt").read_text(encoding="utf-8")
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_cli_csv_requests(runner: CliRunner, run_dir: Path) -> None:
    result = runner.invoke(app, ["report", str(run_dir), "-f", "csv", "--csv-kind", "requests"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("variant,source,request_id")


def test_cli_github_step_summary(runner: CliRunner, run_dir: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("previous step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = runner.invoke(app, ["report", str(run_dir), "-f", "markdown"])
    assert result.exit_code == 0, result.output
    text = summary.read_text(encoding="utf-8")
    assert text.startswith("previous step\n## runinfra-opt: Winner: ngram-n2-k4")
    # --github appends the markdown whatever the printed format.
    result = runner.invoke(app, ["report", str(run_dir), "-f", "json", "--github"])
    assert result.exit_code == 0, result.output
    assert summary.read_text(encoding="utf-8").count("## runinfra-opt: Winner") == 2
    # A table with the variable set (but no --github) does not append.
    runner.invoke(app, ["report", str(run_dir)])
    assert summary.read_text(encoding="utf-8").count("## runinfra-opt: Winner") == 2


def test_cli_github_without_summary_variable(runner: CliRunner, run_dir: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    result = runner.invoke(app, ["report", str(run_dir), "--github"])
    assert result.exit_code == 2
    assert "GITHUB_STEP_SUMMARY is not set" in result.stderr


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = render_json(build_results())
    future = json.loads(good)
    future["schema_version"] = SCHEMA_VERSION + 1
    wrong_field = json.loads(good)
    wrong_field["variants"][0]["measured"]["tokens_per_s"] = "fast"
    return {
        "truncated": (_write(tmp_path / "truncated.json", good[: len(good) // 2]), "corrupt or truncated"),
        "corrupt": (_write(tmp_path / "corrupt.json", "{not json"), "corrupt or truncated"),
        "empty": (_write(tmp_path / "empty.json", ""), "corrupt or truncated"),
        "future": (
            _write(tmp_path / "future.json", json.dumps(future)), f"schema version {SCHEMA_VERSION + 1} is newer"
        ),
        "not ours": (_write(tmp_path / "other.json", '{"hello": "world"}'), "not a runinfra-opt results file"),
        "binary": (tmp_path / "binary.json", "not UTF-8"),
        "bad field": (
            _write(tmp_path / "field.json", json.dumps(wrong_field)), "field variants.0.measured.tokens_per_s"
        ),
        "missing": (tmp_path / "nowhere" / "results.json", "no such run directory"),
    }


@pytest.mark.parametrize(
    "case", ["truncated", "corrupt", "empty", "future", "not ours", "binary", "bad field", "missing"]
)
def test_cli_unreadable_results_exit_2(runner: CliRunner, tmp_path: Path, case: str) -> None:
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    path, message = bad_files(tmp_path)[case]
    result = runner.invoke(app, ["report", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "pdf"], "unknown format 'pdf'; available: table, markdown, json, csv, html"),
        (["--csv-kind", "requests"], "--csv-kind applies only to --format csv"),
        (["-f", "csv", "--csv-kind", "rows"], "unknown --csv-kind 'rows'; available: variants, requests"),
    ],
)
def test_cli_bad_options_exit_2(runner: CliRunner, run_dir: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["report", str(run_dir), *args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_minimal_and_unusual_results_render_in_every_format() -> None:
    """A run that has only started, and a variant this version cannot parse, still render (no crash)."""
    minimal = RunResults(run_id="r0", created_at="2026-11-29T23:00:00Z")
    odd = build_results()
    odd.variants[1].name = "eagle-k4"
    odd.variants[1].variant = {"method": "eagle", "lookahead": 4}
    for results in (minimal, odd):
        assert "run r0" in table_text(minimal)
        text = table_text(results)
        assert "Environment: run" in text
        assert render_markdown(results).startswith("## runinfra-opt: ")
        assert load_results_from_text(render_json(results)) == results
        for kind in ("variants", "requests"):
            assert render_csv(results, kind).startswith("variant,")
        assert 'id="plot-' in render_html(results) or "No speculative variant" in render_html(results)
    assert "eagle-k4" in table_text(odd)
    assert "No decision yet: run status running (last phase finished: start)." in table_text(minimal)


def load_results_from_text(text: str) -> RunResults:
    return RunResults.model_validate_json(text)


@pytest.mark.parametrize(
    ("status", "headline"),
    [
        ("no_feasible", "No feasible variant: not even the baseline satisfies the constraints"),
        ("failed", "No decision: the run failed after phase confirm (see the notes)."),
    ],
)
def test_runs_without_a_decision_say_why(status: str, headline: str) -> None:
    results = build_results(winner=None, status=status)
    results.add_note("failed after phase confirm: out of memory", kind="failed")
    text = table_text(results)
    assert headline in text
    assert "Note: failed after phase confirm: out of memory" in text
    assert headline in render_markdown(results)


def test_outputs_that_differ_only_at_near_ties_show_as_ties_not_as_lossy() -> None:
    from runinfra_opt.records import RequestRecord
    from runinfra_opt.report.view import fmt_lossless
    from runinfra_opt.stats import summarize

    def record(request_id: str, lossless: bool, near_tie: bool | None = None) -> RequestRecord:
        return RequestRecord(request_id=request_id, category="c", prompt_tokens=3, output_tokens=4, ttft_s=0.1,
                             e2e_s=0.4, target_passes=4, lossless=lossless, near_tie=near_tie)  # fmt: skip

    ties = summarize([record("a", True), record("b", False, near_tie=True)])
    assert ties.lossless is False
    assert ties.near_ties_only
    assert fmt_lossless(ties.lossless, ties.near_ties_only) == "ties"
    lossy = summarize([record("a", False, near_tie=True), record("b", False, near_tie=False)])
    assert lossy.lossless is False
    assert not lossy.near_ties_only
    assert fmt_lossless(lossy.lossless, lossy.near_ties_only) == "NO"
    exact = summarize([record("a", True)])
    assert fmt_lossless(exact.lossless, exact.near_ties_only) == "yes"
