"""Human-readable reports of one run: a rich terminal rendering and a markdown document (PR comments,
GitHub step summaries). Both are pure functions of a `RunResults` and show the same sections."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runinfra_opt.report import capacity, load, view
from runinfra_opt.report.markdown import md_escape, md_table
from runinfra_opt.report.view import VariantRow
from runinfra_opt.results import RunResults

VARIANT_COLUMNS = (
    "variant",
    "pred. tok/s",
    "meas. tok/s",
    "speedup [95% CI]",
    "TTFT p50/p95 ms",
    "accept",
    "acc./pass",
    "lossless",
    "status",
)
TERMINAL_HEADERS = (
    "variant",
    "pred.\ntok/s",
    "meas.\ntok/s",
    "speedup\n[95% CI]",
    "TTFT ms\np50/p95",
    "accept",
    "acc.\n/pass",
    "loss-\nless",
    "status",
)
LEGEND = (
    "~ = predicted by the cost model, not measured. Speedup: tokens/s over the baseline's, paired by request, "
    "with its bootstrap 95% interval. acc./pass: draft tokens accepted per target pass."
)


def legend(rows: list[VariantRow]) -> str:
    """The variant table's legend; it explains `ties` where the table shows it."""
    return LEGEND + (f" {view.TIES_LEGEND}" if any(r.near_ties_only for r in rows) else "")


def variant_cells(row: VariantRow, *, short_status: bool = False) -> list[str]:
    """The variant table's cells; `short_status` leaves the why of exclusions to the section below."""
    predicted = not row.ttft_measured
    return [
        row.name,
        view.fmt_num(row.predicted_tokens_per_s),
        view.fmt_num(row.measured_tokens_per_s),
        view.fmt_speedup(row.speedup, predicted=not row.speedup_measured),
        view.fmt_ttft(row),
        view.fmt_pct(row.acceptance_rate, predicted=predicted),
        view.fmt_num(row.mean_accepted_per_pass, ".2f", predicted=predicted),
        view.fmt_lossless(row.lossless, row.near_ties_only),
        row.status if short_status else row.status_text,
    ]


def category_cells(results: RunResults) -> list[list[str]]:
    if results.decision is None:
        return []
    return [
        [c.category, str(c.requests), c.best, "-" if c.speedup is None else f"{c.speedup:.2f}x"]
        for c in results.decision.per_category
    ]


def prediction_cells(rows: list[VariantRow]) -> list[list[str]]:
    return [
        [r.name, view.fmt_num(r.predicted_tokens_per_s), view.fmt_num(r.measured_tokens_per_s),
         view.fmt_change(r.prediction_error)]
        for r in rows
        if r.predicted_tokens_per_s is not None and r.measured_tokens_per_s is not None
    ]


def excluded_lines(rows: list[VariantRow]) -> list[str]:
    lines = [f"{r.name}: disqualified: {r.disqualified}" for r in rows if r.disqualified]
    lines += [f"{r.name}: ruled out: {'; '.join(r.ruled_out)}" for r in rows if r.ruled_out and not r.disqualified]
    return lines


def queue_cells(results: RunResults) -> list[list[str]]:
    return [
        [name, view.fmt_ms(p50), view.fmt_ms(p95), view.fmt_ms(wait), f"{util:.0%}"]
        for name, p50, p95, wait, util in view.queue_rows(results)
    ]


def notes(results: RunResults) -> list[str]:
    """The run's notes, without those already shown (the subsampling line)."""
    return [note.text for note in results.notes if note.kind != "subsampled"]


def intro_lines(results: RunResults) -> list[str]:
    lines = []
    if results.decision is not None and results.decision.reason:
        lines.append(f"Why: {results.decision.reason}")
    if results.certainty is not None:
        lines.append(f"How sure: {results.certainty.summary}")
    constraints = view.constraints_line(results)
    if constraints:
        lines.append(f"Settings: {constraints}")
    subsample = view.subsample_line(results)
    if subsample:
        lines.append(subsample)
    if results.status in ("running", "failed", "interrupted", "died"):
        lines.append(
            f"Note: this run is not complete (status {results.status}, last phase finished: {results.phase}); "
            "the figures are those written so far."
        )
    return lines


NUMERIC_COLUMNS = frozenset(
    VARIANT_COLUMNS[1:-1]
    + ("requests", "speedup", "predicted tok/s", "measured tok/s", "error", "TTFT p50 ms", "TTFT p95 ms")
    + ("mean wait ms", "utilisation")
)
QUEUE_TITLE = "Under the recorded load (simulated single-replica FIFO queue)"
QUEUE_COLUMNS = ("variant", "TTFT p50 ms", "TTFT p95 ms", "mean wait ms", "utilisation")
CATEGORY_COLUMNS = ("category", "requests", "best variant", "speedup")
PREDICTION_COLUMNS = ("variant", "predicted tok/s", "measured tok/s", "error")


def render_table(results: RunResults, console: Console) -> None:
    """Print the run's report on a rich console."""
    rows = view.variant_rows(results)
    console.print(Text(f"runinfra-opt report: run {results.run_id}", style="bold"))
    console.print(Text(view.headline(results), style="bold green" if _speculates(results) else "bold"))
    for line in intro_lines(results):
        console.print(Text(line))

    table = Table(
        title="Variants", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
        show_edge=False,
    )
    for i, column in enumerate(TERMINAL_HEADERS):
        if i == 0:
            table.add_column(column, overflow="fold", min_width=12)
        else:
            table.add_column(column, justify="left" if i == 8 else "right", no_wrap=i in (3, 4, 8), min_width=4)
    for row in rows:
        dim = row.status in ("ruled out", "disqualified")
        style = "bold green" if row.status == "winner" else ("dim" if dim else None)
        table.add_row(*variant_cells(row, short_status=True), style=style)
    console.print(table)
    console.print(Text(legend(rows), style="dim"))
    excluded = excluded_lines(rows)
    if excluded:
        console.print(Text("Excluded variants", style="bold"))
        for reason in excluded:
            console.print(Text(f"- {reason}"))

    for title, columns, cells in (
        ("Per category", CATEGORY_COLUMNS, category_cells(results)),
        ("Predicted vs measured", PREDICTION_COLUMNS, prediction_cells(rows)),
        (QUEUE_TITLE, QUEUE_COLUMNS, queue_cells(results)),
    ):
        if not cells:
            continue
        sub = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for column in columns:
            sub.add_column(column, justify="right" if column in NUMERIC_COLUMNS else "left")
        for cell_row in cells:
            sub.add_row(*cell_row)
        console.print(sub)
    load.render_section(results, console)
    capacity.render_section(results, console)

    for note in notes(results):
        console.print(Text(f"Note: {note}"))
    console.print(Text(f"Environment: {view.environment_line(results)}", style="dim"))


def _speculates(results: RunResults) -> bool:
    return results.decision is not None and results.decision.speculation


def render_markdown(results: RunResults) -> str:
    """The run's report as GitHub-flavoured markdown. Predicted-only variants fold into a <details> block."""
    rows = view.variant_rows(results)
    out = [f"## runinfra-opt: {view.headline(results)}", ""]
    for line in intro_lines(results):
        out += [md_escape(line), ""]

    def table_cells(selected: list[VariantRow]) -> list[list[str]]:
        cells = []
        for row in selected:
            line = variant_cells(row)
            if row.status == "winner":
                line[0] = f"**{line[0]}**"
            cells.append(line)
        return cells

    main = [r for r in rows if r.status != "predicted only"]
    predicted_only = [r for r in rows if r.status == "predicted only"]
    out += ["### Variants", ""]
    out += md_table(VARIANT_COLUMNS, table_cells(main), NUMERIC_COLUMNS)
    out += ["", f"_{legend(rows)}_", ""]
    if predicted_only:
        out += [
            f"<details><summary>{len(predicted_only)} more variant(s) predicted only (not timed)</summary>",
            "",
        ]
        out += md_table(VARIANT_COLUMNS, table_cells(predicted_only), NUMERIC_COLUMNS)
        out += ["", "</details>", ""]

    for title, columns, cells in (
        ("Per category", CATEGORY_COLUMNS, category_cells(results)),
        ("Predicted vs measured", PREDICTION_COLUMNS, prediction_cells(rows)),
        (QUEUE_TITLE, QUEUE_COLUMNS, queue_cells(results)),
    ):
        if cells:
            out += [f"### {title}", ""] + md_table(columns, cells, NUMERIC_COLUMNS) + [""]
    out += load.markdown_section(results)
    out += capacity.markdown_section(results)

    excluded = excluded_lines(rows)
    if excluded:
        out += ["### Excluded variants", ""] + [f"- {md_escape(line)}" for line in excluded] + [""]
    out += [f"- Note: {md_escape(note)}" for note in notes(results)]
    if notes(results):
        out.append("")
    out += [f"<sub>Environment: {md_escape(view.environment_line(results))}</sub>", ""]
    return "\n".join(out)
