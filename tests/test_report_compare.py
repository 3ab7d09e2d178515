"""`report --compare OLD NEW`: what changed, changes beyond noise, and the regression gate's exit codes 0/2/4."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.errors import UserInputError
from runinfra_opt.report import compare, render_comparison_markdown, render_comparison_table
from runinfra_opt.results import SCHEMA_VERSION, RunResults, save_results
from tests.report_fixtures import DEFAULT_SPECS, Spec, build_results, running


def save(tmp_path: Path, name: str, results: RunResults) -> str:
    path = tmp_path / name / "results.json"
    save_results(results, path)
    return str(path.parent)


def test_same_run_passes_and_nothing_changed() -> None:
    old = build_results()
    comparison = compare(old, build_results(run_id="again"))
    assert not comparison.failed
    assert [c.field for c in comparison.context if c.changed] == []
    assert {d.name for d in comparison.variants} == {v.name for v in old.variants if v.measured}
    assert all(d.beyond_noise is False for d in comparison.variants)
    assert comparison.checks[0].check == "chosen configuration"
    assert comparison.checks[0].regression == pytest.approx(0.0)


def test_winner_slower_beyond_noise_fails() -> None:
    comparison = compare(build_results(), build_results(run_id="new", scales={"ngram-n2-k4": 0.8}))
    assert comparison.failed
    check = comparison.checks[0]
    assert check.beyond_noise is True
    assert check.regression > 0.05
    assert "chosen configuration ngram-n2-k4" in check.detail
    delta = next(d for d in comparison.variants if d.name == "ngram-n2-k4")
    assert delta.throughput_change < -0.1
    assert delta.beyond_noise is True


def test_small_slowdown_within_noise_passes() -> None:
    # 4% slower with +-3% intervals: the intervals overlap, so it is noise even though 4% < 5% anyway...
    comparison = compare(build_results(), build_results(run_id="new", scales={"ngram-n2-k4": 0.96}))
    assert not comparison.failed
    # ...and 8% slower but with wide (+-6%) intervals on both: overlapping, so not beyond noise: passes.
    wide_old = build_results(spread=0.06)
    wide_new = build_results(run_id="new", spread=0.06, scales={"ngram-n2-k4": 0.92})
    comparison = compare(wide_old, wide_new)
    assert comparison.checks[0].regression > 0.05
    assert comparison.checks[0].beyond_noise is False
    assert not comparison.failed


def test_max_regression_threshold() -> None:
    old, new = build_results(), build_results(run_id="new", scales={"ngram-n2-k4": 0.8})
    assert compare(old, new, max_regression=0.05).failed
    assert not compare(old, new, max_regression=0.5).failed
    with pytest.raises(UserInputError, match="--max-regression must be >= 0"):
        compare(old, new, max_regression=-0.1)


def test_old_winner_regressed_while_new_winner_differs() -> None:
    old = build_results()
    # The new run picks ngram-n2-k8 (as fast as the old winner) but the old winner itself got much slower.
    specs = tuple(Spec(s.name, speed=s.speed, ttft=s.ttft, accept=s.accept, measured=s.measured,
                       disqualified=s.disqualified, ruled_out=s.ruled_out, category_speed=s.category_speed)
                  for s in DEFAULT_SPECS)
    new = build_results(run_id="new", specs=specs, winner="ngram-n2-k8",
                        scales={"ngram-n2-k4": 0.7, "ngram-n2-k8": 1.08})
    comparison = compare(old, new)
    names = [c.check for c in comparison.checks]
    assert names == ["chosen configuration", "old winner"]
    assert not comparison.checks[0].failed
    assert comparison.checks[1].failed
    assert "old winner ngram-n2-k4" in comparison.checks[1].detail
    assert next(c for c in comparison.context if c.field == "winner").changed


def test_different_workload_refused_unless_allowed() -> None:
    old = build_results()
    new = build_results(run_id="new", fingerprint="sha256:0000aaaa1111bbbb")
    with pytest.raises(UserInputError, match="different workloads"):
        compare(old, new)
    comparison = compare(old, new, allow_workload_change=True)
    assert any("different workloads" in w for w in comparison.warnings)
    assert next(c for c in comparison.context if c.field == "workload fingerprint").changed


def test_different_device_is_shown_not_refused() -> None:
    old = build_results()
    new = build_results(run_id="new")
    assert new.target is not None
    new.target.device = "cuda:0"
    comparison = compare(old, new)
    device = next(c for c in comparison.context if c.field == "device")
    assert (device.old, device.new, device.changed) == ("cpu", "cuda:0", True)


def test_incompatible_inputs() -> None:
    old = build_results()
    older_schema = build_results(run_id="v0")
    older_schema.schema_version = 0
    with pytest.raises(UserInputError, match=f"schema version {SCHEMA_VERSION} and NEW has 0"):
        compare(old, older_schema)
    with pytest.raises(UserInputError, match="NEW: run .* has no decision"):
        compare(old, running())


def test_ttft_priority_gates_on_ttft() -> None:
    old = build_results()
    new = build_results(run_id="new")
    assert new.decision is not None
    new.decision = new.decision.model_copy(update={"priority": "ttft"})  # frozen: a copy
    winner = new.variant("ngram-n2-k4")
    assert winner is not None
    assert winner.measured is not None
    winner.measured.ttft_s = {k: v * 1.3 for k, v in winner.measured.ttft_s.items()}
    comparison = compare(old, new)
    check = comparison.checks[0]
    assert check.metric == "TTFT p95"
    assert check.beyond_noise is None  # no interval for a TTFT percentile: point estimates
    assert check.regression == pytest.approx(0.3)
    assert check.failed


def test_comparison_renderers() -> None:
    comparison = compare(build_results(), build_results(run_id="new", scales={"ngram-n2-k4": 0.8}))
    console = Console(width=100, file=io.StringIO(), color_system=None)
    render_comparison_table(comparison, console)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "Gate FAILED (max regression 5.0%)" in text
    assert "What changed" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    markdown = render_comparison_markdown(comparison)
    assert markdown.startswith("## runinfra-opt compare: gate FAILED")
    assert "| ngram-n2-k4 | 22.7 | 18.6 |" in markdown
    data = comparison.to_dict()
    assert data["failed"] is True
    json.dumps(data)


# CLI exit codes -----------------------------------------------------------------------------------------------


def test_cli_compare_exit_0(runner: CliRunner, tmp_path: Path) -> None:
    old = save(tmp_path, "old", build_results())
    new = save(tmp_path, "new", build_results(run_id="new", scales={"ngram-n2-k4": 1.02}))
    result = runner.invoke(app, ["report", "--compare", old, new])
    assert result.exit_code == 0, result.output
    assert "Gate passed" in result.stdout


def test_cli_compare_exit_4_says_which(runner: CliRunner, tmp_path: Path) -> None:
    old = save(tmp_path, "old", build_results())
    new = save(tmp_path, "new", build_results(run_id="new", scales={"ngram-n2-k4": 0.8}))
    result = runner.invoke(app, ["report", "--compare", old, new, "--max-regression", "0.05"])
    assert result.exit_code == 4, result.output
    assert "Gate FAILED" in result.stdout
    assert "error: Gate FAILED" in result.stderr
    assert "chosen configuration ngram-n2-k4" in result.stderr
    # A looser gate passes the same pair.
    result = runner.invoke(app, ["report", "--compare", old, new, "--max-regression", "0.3"])
    assert result.exit_code == 0, result.output


def test_cli_compare_formats(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = save(tmp_path, "old", build_results())
    new = save(tmp_path, "new", build_results(run_id="new"))
    result = runner.invoke(app, ["report", "--compare", old, new, "-f", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["failed"] is False
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = runner.invoke(app, ["report", "--compare", old, new, "-f", "markdown"])
    assert result.exit_code == 0, result.output
    assert summary.read_text(encoding="utf-8").startswith("## runinfra-opt compare: gate passed")
    result = runner.invoke(app, ["report", "--compare", old, new, "-f", "html"])
    assert result.exit_code == 2
    assert "--compare renders as table, markdown, json; not html" in result.stderr


def test_cli_compare_exit_2(runner: CliRunner, tmp_path: Path) -> None:
    old = save(tmp_path, "old", build_results())
    other = save(tmp_path, "other", build_results(run_id="other", fingerprint="sha256:0000aaaa1111bbbb"))
    truncated = tmp_path / "truncated.json"
    truncated.write_text((Path(old) / "results.json").read_text(encoding="utf-8")[:500], encoding="utf-8")
    unfinished = save(tmp_path, "running", running())

    cases = [
        ([old, str(truncated)], f"{truncated}: corrupt or truncated results file"),
        ([old, other], "different workloads"),
        ([old, unfinished], "has no decision (status running"),
        ([old, str(tmp_path / "missing")], "no such run directory"),
    ]
    for pair, message in cases:
        result = runner.invoke(app, ["report", "--compare", *pair])
        assert result.exit_code == 2, (pair, result.output)
        assert message in result.stderr, (message, result.stderr)
        assert "Traceback" not in result.output
    result = runner.invoke(app, ["report", "--compare", old, other, "--allow-workload-change"])
    assert result.exit_code == 0, result.output
    assert "Warning: the runs used different workloads" in result.stdout
    result = runner.invoke(app, ["report", old, "--compare", old, old])
    assert result.exit_code == 2
    assert "either RUN or --compare" in result.stderr


def test_comparison_snapshots() -> None:
    from tests.test_report import check_snapshot

    comparison = compare(build_results(), build_results(run_id="new", scales={"ngram-n2-k4": 0.8}))
    console = Console(width=100, file=io.StringIO(), color_system=None)
    render_comparison_table(comparison, console)
    check_snapshot("compare_regression.txt", console.file.getvalue())  # type: ignore[attr-defined]
    check_snapshot("compare_regression.md", render_comparison_markdown(comparison))
