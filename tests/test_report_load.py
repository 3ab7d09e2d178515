"""The report's per-load section (`optimize --engine vllm --load ...`): terminal table, markdown, HTML plots, CSV,
`optimize`'s summary and `report --compare` per level, all through the real CLI on hand-built results.

The fixture is a vLLM run on this CPU's scale (numbers in the range docs/measurements.md records): a baseline and two
n-gram variants at replay and concurrency 1, 4 and 16, where k=4 pays at 1 (1.30x), is even at 4 and loses at 16
(0.79x), and k=8 never pays; one crossover, near 4.3 requests in flight.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.report import render_html, render_markdown, render_table
from runinfra_opt.report.summary import render_summary
from runinfra_opt.results import (
    Crossover,
    Interval,
    KSchedule,
    LevelDecision,
    LevelMetrics,
    LevelResult,
    LoadSummary,
    MeasuredWindow,
    RunResults,
    save_results,
)
from tests.report_fixtures import Spec, build_results
from tests.test_report import check_snapshot
from tests.test_report_browser import CHROMIUM, run_chromium

BASE = "baseline"
K4 = "vllm_ngram-m1-n3-k4"
K8 = "vllm_ngram-m1-n3-k8"
LEVELS = ("replay", "concurrency:1", "concurrency:4", "concurrency:16")

# level -> variant -> (output tokens/s, ratio to the baseline [low, high], TTFT p50/p95 ms, TPOT p50 ms, goodput)
FIGURES: dict[str, dict[str, tuple[float, tuple[float, float, float] | None, float, float, float, float]]] = {
    "replay": {
        BASE: (20.1, None, 151, 312, 36.0, 0.96),
        K4: (22.9, (1.14, 1.06, 1.22), 158, 329, 29.8, 0.94),
    },
    "concurrency:1": {
        BASE: (26.7, None, 140, 188, 36.5, 1.0),
        K4: (34.7, (1.30, 1.22, 1.38), 149, 204, 27.9, 1.0),
        K8: (25.9, (0.97, 0.90, 1.04), 152, 215, 37.4, 1.0),
    },
    "concurrency:4": {
        BASE: (98.0, None, 171, 262, 39.6, 0.98),
        K4: (99.0, (1.01, 0.95, 1.07), 185, 290, 38.9, 0.97),
        K8: (86.2, (0.88, 0.82, 0.94), 190, 311, 44.1, 0.95),
    },
    "concurrency:16": {
        BASE: (160.4, None, 312, 488, 92.0, 0.81),
        K4: (126.7, (0.79, 0.74, 0.84), 371, 612, 118.5, 0.62),
        K8: (110.7, (0.69, 0.64, 0.74), 402, 655, 131.2, 0.55),
    },
}
K4_CROSSOVER = (
    f"{K4} stops paying at about 4.3 requests in flight (95% interval 2.6-7.5): 1.30x at 1, 1.01x at 4, "
    "0.79x at 16 concurrent requests"
)


def _metrics(level: str, variant: str, *, slo_ttft_ms: float | None, requests: int = 48) -> LevelMetrics:
    tps, _, ttft50, ttft95, tpot50, goodput = FIGURES[level][variant]
    descriptions = {"replay": "recorded arrivals, time x0.5"}
    concurrency = level.partition(":")[2]
    return LevelMetrics(
        level=level,
        description=descriptions.get(level, f"closed loop, {concurrency} in flight"),
        runs=2,
        requests=requests,
        succeeded=requests,
        failed=0,
        windows=[MeasuredWindow(start_s=2.1, end_s=61.4, warmup_requests=4, steady=True)] * 2,
        output_tokens_per_s=Interval(value=tps, low=round(tps * 0.97, 2), high=round(tps * 1.03, 2)),
        requests_per_s=round(tps / 64, 3),
        ttft_s={"p50": ttft50 / 1000, "p90": ttft95 * 0.9 / 1000, "p95": ttft95 / 1000, "p99": ttft95 * 1.2 / 1000},
        tpot_s={"p50": tpot50 / 1000, "p90": tpot50 * 1.3 / 1000, "p95": tpot50 * 1.4 / 1000,
                "p99": tpot50 * 1.6 / 1000},
        itl_s={"p50": tpot50 * 0.9 / 1000, "p90": tpot50 * 2 / 1000, "p95": tpot50 * 2.5 / 1000,
               "p99": tpot50 * 3 / 1000},
        e2e_s={"p50": 2.4, "p90": 3.1, "p95": 3.4, "p99": 4.0},
        send_lag_s={"p50": 0.0011, "p90": 0.004, "p95": 0.006, "p99": 0.0142 if level == "replay" else 0.008},
        late_requests=2 if level == "replay" else 0,
        peak_in_flight=int(concurrency) if concurrency else 6,
        slo_ttft_ms=slo_ttft_ms,
        goodput=None if slo_ttft_ms is None else Interval(
            value=goodput, low=max(0.0, goodput - 0.1), high=min(1.0, goodput + 0.08)),
        goodput_requests_per_s=None if slo_ttft_ms is None else round(goodput * tps / 64, 3),
        notes=["send lag p99 14.2 ms above 10 ms: the client, not the server, was late"] if level == "replay" else [],
    )


def load_results(
    *, slos: bool = True, schedule: KSchedule | None = None, scale: dict[str, float] | None = None,
    levels: tuple[str, ...] = LEVELS, run_id: str = "20261201T070000Z-10ad01",
) -> RunResults:
    """A finished vLLM run with the per-load results above. `scale` multiplies a variant's tokens/s at every level
    (a second run on a slower build)."""
    specs = (Spec(BASE), Spec(K4, speed=1.30, accept=0.42), Spec(K8, speed=0.97, accept=0.30))
    results = build_results(specs=specs, winner=K4, run_id=run_id)
    slo = 500.0 if slos else None
    for result in results.variants:
        result.load = []
        for level in levels:
            if result.name not in FIGURES[level]:
                continue
            metrics = _metrics(level, result.name, slo_ttft_ms=slo)
            factor = (scale or {}).get(result.name, 1.0)
            if metrics.output_tokens_per_s is not None and factor != 1.0:
                iv = metrics.output_tokens_per_s
                metrics.output_tokens_per_s = Interval(value=iv.value * factor, low=iv.low * factor,
                                                       high=iv.high * factor)
            ratio = FIGURES[level][result.name][1]
            if ratio is not None:
                ratio = (ratio[0] * factor, ratio[1] * factor, ratio[2] * factor)
            speculative = result.name != BASE
            result.load.append(LevelResult(
                level=level,
                metrics=metrics,
                records=f"load/{result.name}/{level.replace(':', '-')}.jsonl",
                vs_baseline=Interval(value=ratio[0], low=ratio[1], high=ratio[2]) if ratio else None,
                drafted_tokens=4200 if speculative else None,
                accepted_tokens=(1764 if result.name == K4 else 1260) if speculative else None,
                mismatched=1 if (result.name, level) == (K4, "concurrency:16") else 0,
            ))
    decisions = [
        LevelDecision(level="replay", winner=K4, figure="output tokens/s", gain=Interval(value=1.14, low=1.06,
                      high=1.22), reason=f"{K4} 1.14x [1.06,1.22] the baseline's tokens/s, beyond noise"),
        LevelDecision(level="concurrency:1", winner=K4, figure="output tokens/s", gain=Interval(value=1.30, low=1.22,
                      high=1.38), reason=f"{K4} 1.30x [1.22,1.38] the baseline's tokens/s, beyond noise"),
        LevelDecision(level="concurrency:4", winner=BASE, figure="output tokens/s",
                      reason=f"no variant beats the baseline beyond noise (best: {K4} 1.01x [0.95,1.07])"),
        LevelDecision(level="concurrency:16", winner=BASE, figure="output tokens/s",
                      reason=f"every variant is slower than the baseline (best: {K4} 0.79x [0.74,0.84])"),
    ]
    results.load = LoadSummary(
        spec="replay+concurrency:1,4,16",
        levels=list(levels),
        time_scale=0.5,
        slo_ttft_ms=slo,
        requests_per_level=48,
        decisions=[d for d in decisions if d.level in levels],
        crossovers=[
            Crossover(variant=K4, method="vllm_ngram", status="crosses", concurrency=4.3, low=2.6, high=7.5,
                      ratios={level: Interval(value=r[0], low=r[1], high=r[2]) for level in LEVELS[1:]
                              if (r := FIGURES[level][K4][1])},
                      text=K4_CROSSOVER),
            Crossover(variant=K8, method="vllm_ngram", status="never_pays",
                      text=f"{K8} never pays: 0.97x at 1, 0.88x at 4, 0.69x at 16 concurrent requests"),
        ],
        schedule=schedule,
        deploy_level="replay",
    )
    return results


def save(tmp_path: Path, name: str, results: RunResults) -> str:
    path = tmp_path / name / "results.json"
    save_results(results, path)
    return str(path)


def report(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(app, ["report", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def row_of(text: str, level: str, variant: str) -> str:
    """The markdown table row of `variant` at `level` (the winner's name is bold)."""
    pattern = rf"^\| {re.escape(level)} \| (\*\*)?{re.escape(variant)}(\*\*)? \|.*$"
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no row for {variant} at {level}"
    return match.group(0)


# Terminal and markdown ----------------------------------------------------------------------------------------


def test_markdown_per_load_rows_numbers_and_winners(runner: CliRunner, tmp_path: Path) -> None:
    text = report(runner, save(tmp_path, "run", load_results()), "--format", "markdown")
    assert "### Under load (measured on the serving engine)" in text
    assert ("Load: replay+concurrency:1,4,16, 48 requests per level; replay time x0.5; SLOs: TTFT <= 500 ms; "
            "the manifest carries the winner at replay.") in text
    assert ("| level | variant | out tok/s [95% CI] | vs baseline [95% CI] | TTFT p50/p95 ms | TPOT p50 ms | "
            "goodput [95% CI] | accept | status |") in text
    # Speculation pays at concurrency 1 (its row is the winner's, in bold) and loses at 16 (the baseline wins).
    assert row_of(text, "concurrency:1", K4) == (
        f"| concurrency:1 | **{K4}** | 34.7 [33.7,35.7] | 1.30x [1.22,1.38] | 149/204 | 28 | 100% [90,100] | "
        "42% | winner |")
    assert row_of(text, "concurrency:16", K4) == (
        f"| concurrency:16 | {K4} | 127 [123,130] | 0.79x [0.74,0.84] | 371/612 | 118 | 62% [52,70] | 42% | "
        "1 differ |")
    assert row_of(text, "concurrency:16", BASE).startswith(
        f"| concurrency:16 | **{BASE}** | 160 [156,165] | 1.00x | 312/488 | 92 | 81% [71,89] | - | winner |")
    assert row_of(text, "replay", K4).endswith("| 1.14x [1.06,1.22] | 158/329 | 30 | 94% [84,100] | 42% | winner |")
    # Levels in the run's order, the baseline first within each; no k8 at replay (not measured there).
    rows = text[text.index("### Under load"):text.index("#### Winner per load level")]
    order = re.findall(r"^\| (replay|concurrency:\d+) \| (?:\*\*)?([\w:-]+?)(?:\*\*)? \|", rows, re.MULTILINE)
    assert order == [("replay", BASE), ("replay", K4)] + [
        (level, name) for level in LEVELS[1:] for name in (BASE, K4, K8)]
    # The per-level decisions, the crossover's text, the k schedule line, the notes.
    assert "#### Winner per load level" in text
    assert f"| concurrency:1 | {K4} | output tokens/s | 1.30x [1.22,1.38] |" in text
    assert f"| concurrency:4 | {BASE} | output tokens/s | - | no variant beats the baseline" in text
    assert f"- Crossover: {K4_CROSSOVER}" in text
    assert f"- Crossover: {K8} never pays" in text
    assert "- K schedule: none built in this run." in text
    assert f"- Note: {BASE}, {K4}: send lag p99 14.2 ms above 10 ms: the client, not the server, was late" in text
    assert f"- Note: {K4} at concurrency:16: 1 greedy output(s) differ from the baseline's batch-1 output" in text
    # The batch-1 table is still there, unchanged in form.
    assert "### Variants" in text
    assert f"| **{K4}** |" in text


def test_table_per_load_section_fits_100_columns(runner: CliRunner, tmp_path: Path) -> None:
    text = report(runner, save(tmp_path, "run", load_results()))
    assert max(len(line) for line in text.splitlines()) <= 100
    section = text[text.index("Under load (measured on the serving engine)"):]
    assert "Variants" in text[:text.index("Under load (measured")]
    flat = " ".join(section.split())
    for expected in ("replay: recorded arrivals, time x0.5", "concurrency:16: closed loop, 16 in flight",
                     f"{K4} 34.7 [33.7,35.7] 1.30x [1.22,1.38] 149/204 28 100% [90,100] 42% winner",
                     f"{K4} 127 [123,130] 0.79x [0.74,0.84] 371/612 118 62% [52,70] 42% 1 differ",
                     f"- concurrency:16: {BASE} (ranked on output tokens/s): every variant is slower",
                     f"Crossover: {K4_CROSSOVER}", "K schedule: none built in this run."):
        assert expected in flat, expected
    # One table per level, each with its winner marked on its own row.
    winner_rows = [line for line in section.splitlines() if line.rstrip().endswith("winner")]
    assert len(winner_rows) == 4
    assert [bool(re.search(K4, line)) for line in winner_rows] == [True, True, False, False]


def test_no_slo_no_goodput(runner: CliRunner, tmp_path: Path) -> None:
    path = save(tmp_path, "run", load_results(slos=False))
    text = report(runner, path, "--format", "markdown")
    assert "goodput [95% CI]" not in text
    assert "no SLO given (no goodput)" in text
    assert row_of(text, "concurrency:1", K4).endswith("| 149/204 | 28 | 42% | winner |")
    page = report(runner, path, "--format", "html")
    assert 'id="plot-load-throughput"' in page
    assert 'id="plot-load-goodput"' not in page


def test_schedule_written_and_not_written() -> None:
    from runinfra_opt.report.load import schedule_line

    written = KSchedule(variant="vllm_ngram-m1-n3-sched", schedule=[[1, 2, 8], [3, 16, 4]], verified=True,
                        written=True, reason="better than every fixed k at each level it covers")
    assert schedule_line(load_results(schedule=written)) == (
        "k schedule: written to the manifest (batch 1-2: k=8, batch 3-16: k=4; measured as vllm_ngram-m1-n3-sched): "
        "better than every fixed k at each level it covers")
    worse = KSchedule(variant="vllm_ngram-m1-n3-sched", schedule=[[1, 2, 8], [3, 16, 4]], verified=False,
                      reason="measured 0.96x the best fixed k at concurrency:4")
    assert schedule_line(load_results(schedule=worse)) == (
        "k schedule (batch 1-2: k=8, batch 3-16: k=4): not written: measured 0.96x the best fixed k at concurrency:4")


def test_unchecked_outputs_under_load_are_said() -> None:
    """An engine that gets no token ids under load leaves `mismatched` unset (None): the report says the outputs
    were not compared there, instead of showing nothing."""
    from runinfra_opt.report.load import note_lines

    results = load_results()
    for result in results.variants:
        for level in result.load:
            if result.name != BASE:
                level.mismatched = None  # the schema on main allows None (not checked)
    assert ("greedy outputs under load were not compared with the baseline's at 7 of 7 variant x level "
            "measurements (losslessness is judged at batch 1)") in note_lines(results)
    assert not any("differ from the baseline" in line for line in note_lines(results))


def test_optimize_summary_lists_winners_per_level() -> None:
    console = Console(width=100, file=io.StringIO(), color_system=None)
    render_summary(load_results(), console)
    text = console.file.getvalue()
    assert (f"Under load, winner per level (output tokens/s vs the baseline's): replay {K4} 1.14x [1.06,1.22]; "
            f"concurrency:1 {K4} 1.30x [1.22,1.38]; concurrency:4 {BASE}; concurrency:16 {BASE}") in " ".join(
        text.split())
    assert "Crossover: " + K4 in text


def test_snapshots() -> None:
    """The whole report of the fixture, terminal and markdown (RUNINFRA_UPDATE_SNAPSHOTS=1 rewrites them)."""
    results = load_results()
    console = Console(width=100, file=io.StringIO(), color_system=None)
    render_table(results, console)
    check_snapshot("report_load.txt", console.file.getvalue())
    check_snapshot("report_load.md", render_markdown(results))


# HTML -----------------------------------------------------------------------------------------------------------


def _plot_json(page: str, div_id: str) -> dict[str, Any]:
    """The figure plotly.py wrote for one plot div: its `Plotly.newPlot(id, data, layout, config)` arguments."""
    start = page.index(f'Plotly.newPlot(                        "{div_id}",')
    decoder = json.JSONDecoder()
    rest = page[page.index("[", start):]
    data, end = decoder.raw_decode(rest)
    layout, _ = decoder.raw_decode(rest[end:].lstrip(", "))
    return {"data": data, "layout": layout}


def test_html_plots_against_load_with_the_crossover(runner: CliRunner, tmp_path: Path) -> None:
    path = save(tmp_path, "run", load_results())
    page = report(runner, path, "--format", "html")
    assert page == report(runner, path, "--format", "html"), "not deterministic"
    for title in ("Output tokens/s against load", "TTFT p95 against load", "Goodput against load"):
        assert f"<h3>{title}</h3>" in page, title
    throughput = _plot_json(page, "plot-load-throughput")
    traces = {(t["name"], t.get("xaxis", "x")): t for t in throughput["data"]}
    # The sweep on a log axis (x), the open-loop replay on its own categorical axis (x2).
    k4 = traces[(K4, "x")]
    assert k4["x"] == [1, 4, 16]
    assert k4["y"] == [34.7, 99.0, 126.7]
    assert k4["error_y"]["array"] == pytest.approx([1.04, 2.97, 3.8], abs=0.001)
    assert traces[(K4, "x2")]["x"] == ["replay"]
    assert traces[(BASE, "x")]["y"] == [26.7, 98.0, 160.4]
    layout = throughput["layout"]
    assert layout["xaxis"]["type"] == "log"
    assert layout["xaxis2"]["type"] == "category"
    # The crossover: a band from 2.6 to 7.5 and a dashed line at 4.3, labelled (annotation x is log10 on a log axis).
    shapes = layout["shapes"]
    assert {(s["type"], s["x0"], s["x1"]) for s in shapes} == {("rect", 2.6, 7.5), ("line", 4.3, 4.3)}
    label = next(a for a in layout["annotations"] if a["text"].startswith("crossover"))
    assert label["text"] == f"crossover {K4} at ~4.3 [2.6, 7.5]"
    assert label["x"] == pytest.approx(0.6335, abs=1e-3)
    ttft = _plot_json(page, "plot-load-ttft")
    assert next(t for t in ttft["data"] if t["name"] == K4 and t.get("xaxis", "x") == "x")["y"] == [
        204, 290, 612]
    goodput = _plot_json(page, "plot-load-goodput")
    assert next(t for t in goodput["data"] if t["name"] == BASE and t.get("xaxis", "x") == "x")["y"] == [
        1.0, 0.98, 0.81]
    assert "Left: the closed-loop concurrency sweep (requests in flight, log scale); right: the open-loop" in page
    assert f"<li>Crossover: {K4_CROSSOVER}</li>" in page
    assert '<tr class="winner"><td>concurrency:1</td><td>' + K4 in page


def test_html_sweep_only_has_one_panel(runner: CliRunner, tmp_path: Path) -> None:
    page = report(runner, save(tmp_path, "run", load_results(levels=LEVELS[1:])), "--format", "html")
    throughput = _plot_json(page, "plot-load-throughput")
    assert {t.get("xaxis", "x") for t in throughput["data"]} == {"x"}
    assert "The closed-loop concurrency sweep (requests in flight, log scale)." in page
    assert "Dashed vertical line: where a speculative variant" in page

    results = load_results(levels=LEVELS[1:])
    assert results.load is not None
    results.load.crossovers = [c for c in results.load.crossovers if c.status != "crosses"]
    page = report(runner, save(tmp_path, "none", results), "--format", "html")
    assert "No crossover to mark: no variant" in page
    assert "shapes" not in _plot_json(page, "plot-load-throughput")["layout"]


# CSV ------------------------------------------------------------------------------------------------------------


def test_csv_load_rows(runner: CliRunner, tmp_path: Path) -> None:
    text = report(runner, save(tmp_path, "run", load_results()), "-f", "csv", "--csv-kind", "load")
    frame = pd.read_csv(io.StringIO(text))
    assert len(frame) == 11  # 2 at replay + 3 at each of three concurrencies
    assert list(frame["level"][:3]) == ["replay", "replay", "concurrency:1"]
    row = frame[(frame["level"] == "concurrency:16") & (frame["variant"] == K4)].iloc[0]
    assert row["concurrency"] == 16
    assert row["output_tokens_per_s"] == pytest.approx(126.7)
    assert (row["vs_baseline"], row["vs_baseline_low"], row["vs_baseline_high"]) == (0.79, 0.74, 0.84)
    assert row["ttft_p95_ms"] == pytest.approx(612)
    assert row["goodput"] == pytest.approx(0.62)
    assert row["acceptance_rate"] == pytest.approx(0.42)
    assert row["mismatched"] == 1
    assert not row["is_winner"]
    winners = frame[frame["is_winner"]][["level", "variant"]].values.tolist()
    assert winners == [["replay", K4], ["concurrency:1", K4], ["concurrency:4", BASE], ["concurrency:16", BASE]]


# Runs without load --------------------------------------------------------------------------------------------


def test_run_without_load_has_no_section(runner: CliRunner, tmp_path: Path) -> None:
    path = save(tmp_path, "run", build_results())
    for fmt in ("table", "markdown", "html"):
        assert "Under load (measured" not in report(runner, path, "--format", fmt), fmt
    assert "plot-load-" not in report(runner, path, "--format", "html")
    frame = pd.read_csv(io.StringIO(report(runner, path, "-f", "csv", "--csv-kind", "load")))
    assert frame.empty
    assert list(frame.columns[:4]) == ["level", "concurrency", "level_description", "variant"]


# Compare --------------------------------------------------------------------------------------------------------


def test_compare_per_level(runner: CliRunner, tmp_path: Path) -> None:
    old = save(tmp_path, "old", load_results(levels=LEVELS[:3], run_id="old-run"))
    new_results = load_results(levels=LEVELS[1:], run_id="new-run", scale={K4: 0.8})
    assert new_results.load is not None
    new_results.load.decisions[0].winner = BASE  # k=4 slower in NEW: 1.04x [0.98,1.10] at 1, within noise
    new = save(tmp_path, "new", new_results)
    text = report(runner, "--compare", old, new, "--format", "markdown", "--max-regression", "100")
    assert "### Under load, per level (levels both runs measured)" in text
    assert f"| concurrency:1 | {K4} | 34.7 | 27.8 | 0.80x | yes | 1.30x | 1.04x |" in text
    assert f"| concurrency:1 | {BASE} | 26.7 | 26.7 | 1.00x | no | 1.00x | 1.00x |" in text
    assert f"| concurrency:4 | {K4} | 99.0 | 79.2 | 0.80x | yes | 1.01x | 0.81x |" in text
    assert "| concurrency:16 |" not in text.split("### Winner per load level")[0].split("### Under load")[1]
    assert f"| concurrency:1 | {K4} | {BASE} | CHANGED |" in text
    assert f"| concurrency:4 | {BASE} | {BASE} |  |" in text
    assert f"- Load levels measured only in OLD ({old}): replay" in text
    assert f"- Load levels measured only in NEW ({new}): concurrency:16" in text

    table = report(runner, "--compare", old, new, "--max-regression", "100")
    assert "Under load, per level" in table
    assert re.search(rf"^concurrency:4 +{K4} +99\.0 +79\.2 +0\.80x +yes +1\.01x +0\.81x$", table, re.MULTILINE)
    data = json.loads(report(runner, "--compare", old, new, "--format", "json", "--max-regression", "100"))
    assert data["load"]["levels"] == ["concurrency:1", "concurrency:4"]
    ratios = {(d["level"], d["variant"]): d["ratio"] for d in data["load"]["variants"]}
    assert ratios[("concurrency:4", K4)] == pytest.approx(0.8)
    assert data["load"]["only_old"] == ["replay"]
    assert [(w["level"], w["old"], w["new"], w["changed"]) for w in data["load"]["winners"]] == [
        ("concurrency:1", K4, BASE, True), ("concurrency:4", BASE, BASE, False)]


def test_compare_without_load_in_one_run(runner: CliRunner, tmp_path: Path) -> None:
    old = save(tmp_path, "old", build_results(specs=(Spec(BASE), Spec(K4, speed=1.30, accept=0.42)), winner=K4))
    new = save(tmp_path, "new", load_results())
    text = report(runner, "--compare", old, new, "--format", "markdown", "--max-regression", "100")
    assert "Under load, per level" not in text
    assert f"only NEW ({new}) was measured under load (--load): no per-level comparison with OLD ({old})" in text
    assert json.loads(report(runner, "--compare", old, new, "-f", "json", "--max-regression", "100"))["load"] is None


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (see tests/test_report_browser.py)")
def test_html_load_plots_draw_in_chromium(tmp_path: Path) -> None:
    """plotly.js, offline, draws the three load plots (two panels each), the crossover's band and line, and its
    label."""
    page = tmp_path / "report-load.html"
    page.write_text(render_html(load_results()), encoding="utf-8")
    dom = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    drawn = re.findall(r'<div id="(plot-[a-z-]+)" class="[^"]*js-plotly-plot', html)
    assert drawn == ["plot-lookahead", "plot-accepted", "plot-ttft", "plot-categories", "plot-load-throughput",
                     "plot-load-ttft", "plot-load-goodput"]
    section = html[html.index('id="plot-load-throughput"'):]
    assert f"crossover {K4} at ~4.3 [2.6, 7.5]" in section
    assert section.count('class="xtick"') >= 4  # 1, 4, 16 on the sweep, replay in its own panel
    shapes = re.findall(r'<g class="shapelayer"[^>]*>(.*?)</g>', section[:section.index('id="plot-load-ttft"')])
    assert sum(s.count("<path") for s in shapes) == 2  # the band and the line
