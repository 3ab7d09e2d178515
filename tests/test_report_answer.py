"""The end-of-run answer lines: best per category, drafts against n-gram, time per phase."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from runinfra_opt.cli.optimize import decision_json
from runinfra_opt.report import answer, render_markdown
from runinfra_opt.report.summary import render_summary
from runinfra_opt.results import load_results
from tests import report_fixtures


def _render(results: object) -> str:
    out = io.StringIO()
    render_summary(results, Console(width=100, file=out, color_system=None))  # type: ignore[arg-type]
    return out.getvalue()


def test_the_category_line_names_each_categorys_best_variant_and_its_gain() -> None:
    results = report_fixtures.build_results()
    assert results.decision is not None
    line = answer.category_line(results)
    assert line is not None
    for c in results.decision.per_category:
        part = f"{c.category} {c.best}"
        if c.best != "baseline":
            part += f" {c.speedup:.2f}x"
        assert f"{part} ({c.requests} req)" in line


def test_a_baseline_winning_a_category_is_named_without_a_gain() -> None:
    results = report_fixtures.baseline_wins()
    assert results.decision is not None
    results.decision.per_category[0].best = "baseline"
    line = answer.category_line(results)
    assert line is not None
    assert f"{results.decision.per_category[0].category} baseline (" in line


def test_drafts_are_set_against_the_best_ngram_variant() -> None:
    line = answer.drafts_line(report_fixtures.build_results())
    # draft:tiny-draft-k4 was timed (1.38x invented speed); ngram-n2-k4 is the best timed n-gram variant.
    assert line is not None
    assert line.startswith("Drafts vs other methods: best draft draft:tiny-draft-k4 measured ")
    assert "; best ngram ngram-n2-k4 measured " in line
    assert "of drafted tokens accepted" in line


def test_a_run_without_drafts_has_no_drafts_line() -> None:
    assert answer.drafts_line(report_fixtures.baseline_wins()) is None


def test_a_results_file_from_before_the_setup_phase_was_named_so_reads_with_todays_names(tmp_path: Path) -> None:
    data = report_fixtures.build_results().model_dump(mode="json")
    data.update(phase="load", phases_done=["load", "cost"], timings_s={"load": 9.4, "cost": 2.0})
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    results = load_results(path)
    assert (results.phase, results.phases_done) == ("setup", ["setup", "cost"])
    assert results.timings_s == {"setup": 9.4, "cost": 2.0}


def test_the_timings_line_lists_the_phases_in_run_order_and_the_total() -> None:
    results = report_fixtures.build_results()
    results.timings_s = {"confirm": 160.2, "setup": 9.4, "baseline": 41.0, "total": 210.6}
    assert answer.timings_line(results) == "Time: setup 9 s, baseline 41 s, confirm 160 s; total 3.5 min"
    results.timings_s = {}
    assert answer.timings_line(results) is None


def test_the_summary_ends_with_the_decision_the_answer_lines_and_the_time() -> None:
    results = report_fixtures.build_results()
    text = _render(results)
    lines = [line for line in text.splitlines() if line.strip()]
    decision = next(i for i, line in enumerate(lines) if line.startswith("Use ngram-n2-k4:"))
    assert "95% CI" in " ".join(lines[decision : decision + 3])
    rest = "\n".join(lines[decision:])
    assert "Best per category (measured, point estimates): summarize " in rest
    assert "Drafts vs other methods: best draft " in rest
    assert lines[-1].startswith("Time: baseline 41 s, profile 12 s, confirm 160 s; total 3.6 min")


def test_the_summary_and_the_report_pick_notes_by_kind_not_by_their_text() -> None:
    results = report_fixtures.build_results()
    assert results.workload is not None
    assert results.workload.subsampled is not None
    results.add_note(results.workload.subsampled, kind="subsampled")
    results.add_note("resumed at 2026-11-29T23:10:00+00:00")
    results.add_note("a draft was distilled on 3 requests", kind="left_out")
    results.add_note("written to out/serve.yaml", kind="manifest")
    summary = _render(results)
    assert "Note: a draft was distilled on 3 requests" in summary
    assert "resumed at" not in summary  # only what changes what was measured
    assert f"Written to out/serve.yaml; full report: runinfra-opt report {results.run_id}" in summary
    report = render_markdown(results)
    assert "- Note: resumed at 2026-11-29T23:10:00+00:00" in report
    assert "- Note: a draft was distilled on 3 requests" in report
    assert f"- Note: {results.workload.subsampled}" not in report  # already said once, above the tables
    assert decision_json(results)["notes"] == [note.text for note in results.notes]  # `optimize --json`


def test_notes_written_as_plain_strings_still_load_as_info(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    raw = json.loads(report_fixtures.build_results().model_dump_json())
    raw["notes"] = ["left out 3 of 4 requests that drafts were distilled on", "manifest written to out/serve.yaml"]
    path.write_text(json.dumps(raw), encoding="utf-8")
    results = load_results(path)
    assert [(n.kind, n.text) for n in results.notes] == [("info", text) for text in raw["notes"]]
    assert "- Note: manifest written to out/serve.yaml" in render_markdown(results)
    assert json.loads(results.model_dump_json())["notes"][0] == {"kind": "info", "text": raw["notes"][0]}


def test_a_note_is_kept_once_however_often_a_rerun_phase_adds_it() -> None:
    results = report_fixtures.build_results()
    before = len(results.notes)
    for _ in range(3):  # e.g. repredict and the summaries, run again on every resume
        results.add_note("a repeated note")
        results.add_note("a repeated note", kind="left_out")  # another kind is another note
    assert len(results.notes) == before + 2
    assert [n.kind for n in results.notes if n.text == "a repeated note"] == ["info", "left_out"]
