"""`runinfra-opt report`: re-render a run from its results file, or compare two runs and gate on regressions."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from runinfra_opt.cli.app import app, err_console, handle_errors
from runinfra_opt.errors import GateFailedError, UserInputError

FORMATS = ("table", "markdown", "json", "csv", "html")
COMPARE_FORMATS = ("table", "markdown", "json")


def _emit_table(render: Callable[[Any, Console], None], subject: object, output: Path | None) -> None:
    """Print a rich rendering sized to the terminal, or write it at width 100 without colour to --output."""
    if output is None:
        render(subject, Console(highlight=False, width=None if sys.stdout.isatty() else 100))
        return
    console = Console(width=100, file=io.StringIO(), color_system=None, highlight=False)
    render(subject, console)
    _emit(console.file.getvalue(), output)  # type: ignore[attr-defined]


def _emit(text: str, output: Path | None) -> None:
    """Print, or write to --output atomically."""
    from runinfra_opt.report.locate import write_report

    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
    else:
        write_report(output, text)
        err_console.print(f"wrote {output}", markup=False)


def _append_summary(markdown: str, github: bool) -> None:
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        if github:
            raise UserInputError("--github: GITHUB_STEP_SUMMARY is not set (GitHub Actions sets it in each step)")
        return
    with Path(summary).open("a", encoding="utf-8") as fh:
        fh.write(markdown if markdown.endswith("\n") else markdown + "\n")


@app.command()
@handle_errors
def report(
    run: str | None = typer.Argument(
        None, help="A run directory, its results.json, a run id under --runs-dir, or `latest` (the default)."
    ),
    fmt: str = typer.Option("table", "--format", "-f", help="table, markdown, json, csv or html."),
    csv_kind: str | None = typer.Option(
        None, "--csv-kind", help="With --format csv: `variants` (one row per variant; default), `requests` or `load` "
        "(one row per variant x load level)."
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to this file (atomically) instead."),
    github: bool = typer.Option(
        False, "--github", help="Also append the markdown report to $GITHUB_STEP_SUMMARY (done anyway for "
        "--format markdown when that variable is set)."
    ),
    compare_runs: tuple[str, str] | None = typer.Option(
        None, "--compare", metavar="OLD NEW", help="Compare two runs (directories, results files, run ids)."
    ),
    max_regression: float = typer.Option(
        0.05, "--max-regression", help="With --compare: exit 4 when the new run's chosen configuration (or the old "
        "winner) is worse beyond noise by more than this fraction."
    ),
    allow_workload_change: bool = typer.Option(
        False, "--allow-workload-change", help="With --compare: compare runs on different workloads anyway."
    ),
    runs_dir: Path = typer.Option(Path(".runinfra/runs"), "--runs-dir", help="Where run ids and `latest` live."),
) -> None:
    """Show a run's decision, variants, per-category winners, predicted vs measured figures and environment
    from its results file alone (no model is loaded); or, with --compare, what changed between two runs."""
    from runinfra_opt import report as rep
    from runinfra_opt.report.locate import load_run

    if fmt not in FORMATS:
        raise UserInputError(f"unknown format {fmt!r}; available: {', '.join(FORMATS)}")
    if csv_kind is not None and fmt != "csv":
        raise UserInputError("--csv-kind applies only to --format csv")
    if csv_kind is not None and csv_kind not in rep.CSV_KINDS:
        raise UserInputError(f"unknown --csv-kind {csv_kind!r}; available: {', '.join(rep.CSV_KINDS)}")
    wants_summary = github or (fmt == "markdown" and bool(os.environ.get("GITHUB_STEP_SUMMARY")))
    if github and not os.environ.get("GITHUB_STEP_SUMMARY"):
        _append_summary("", github=True)  # raises the clear error before any work

    if compare_runs is not None:
        if run is not None:
            raise UserInputError("give either RUN or --compare OLD NEW, not both")
        if fmt not in COMPARE_FORMATS:
            raise UserInputError(f"--compare renders as {', '.join(COMPARE_FORMATS)}; not {fmt}")
        old_arg, new_arg = compare_runs
        old, new = load_run(old_arg, runs_dir), load_run(new_arg, runs_dir)
        comparison = rep.compare(
            old, new, max_regression=max_regression, old_label=f"OLD ({old_arg})", new_label=f"NEW ({new_arg})",
            allow_workload_change=allow_workload_change,
        )
        if fmt == "table":
            _emit_table(rep.render_comparison_table, comparison, output)
        elif fmt == "markdown":
            _emit(rep.render_comparison_markdown(comparison), output)
        else:
            import json

            _emit(json.dumps(comparison.to_dict(), indent=2) + "\n", output)
        if wants_summary:
            _append_summary(rep.render_comparison_markdown(comparison), github)
        if comparison.failed:
            raise GateFailedError(rep.compare_verdict(comparison))
        return

    results = load_run(run or "latest", runs_dir)
    if fmt == "table":
        _emit_table(rep.render_table, results, output)
    elif fmt == "markdown":
        _emit(rep.render_markdown(results), output)
    elif fmt == "json":
        _emit(rep.render_json(results), output)
    elif fmt == "csv":
        _emit(rep.render_csv(results, kind=csv_kind or "variants"), output)
    else:
        _emit(rep.render_html(results), output)
    if wants_summary:
        _append_summary(rep.render_markdown(results), github)
