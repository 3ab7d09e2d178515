"""What `optimize` prints when it ends: a compact table (confirmed variants, the best predicted ones and the
best of every other method) and the decision in one sentence. A pure function of the results;
`runinfra-opt report` shows every variant."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runinfra_opt.methods import get_method, method_names
from runinfra_opt.report import answer, capacity, load, view
from runinfra_opt.report.text import TERMINAL_HEADERS, variant_cells
from runinfra_opt.results import RunResults

PREDICTED_ONLY_SHOWN = 5
_LEFT_OUT = TERMINAL_HEADERS.index("acc.\n/pass")
"""The report's column the summary leaves out, so that it keeps to 80 columns."""
HEADERS = TERMINAL_HEADERS[:_LEFT_OUT] + TERMINAL_HEADERS[_LEFT_OUT + 1 :]
SHORT_STATUS = {"predicted only": "predicted", "ruled out": "ruled out", "disqualified": "disqual."}


def _method_key(row: view.VariantRow) -> str:
    """Methods as the summary groups them: each draft model apart, every n-gram size or exit layer together."""
    return row.family if row.method in method_names() and get_method(row.method).needs_draft_model else row.method


def summary_rows(results: RunResults) -> list[view.VariantRow]:
    """Confirmed variants (the baseline included), the best few predicted-only ones, and the best predicted
    variant of every other method and draft model, so that a method that loses is seen losing."""
    rows = view.variant_rows(results)
    confirmed = [r for r in rows if r.confirmed]
    others = [r for r in rows if not r.confirmed and r.predicted_tokens_per_s is not None]
    others.sort(key=lambda r: -(r.predicted_tokens_per_s or 0.0))
    shown = confirmed + others[:PREDICTED_ONLY_SHOWN]
    methods = {_method_key(r) for r in shown}
    for row in others[PREDICTED_ONLY_SHOWN:]:
        if _method_key(row) not in methods:
            shown.append(row)
            methods.add(_method_key(row))
    return shown


def _cells(row: view.VariantRow) -> list[str]:
    """The report's variant cells without the column left out, status shortened."""
    cells = variant_cells(row, short_status=True)
    del cells[_LEFT_OUT]
    cells[-1] = SHORT_STATUS.get(row.status, row.status)
    return cells


def decision_sentence(results: RunResults) -> str:
    if results.decision is None:
        return f"no decision (run status: {results.status})"
    d = results.decision
    if d.speculation:
        return f"Use {d.winner}: {d.reason}"
    return f"Keep the baseline: {d.reason}"


def render_summary(results: RunResults, console: Console) -> None:
    """The end-of-run table and the decision."""
    table = Table(
        title=f"optimize: run {results.run_id}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        show_edge=False,
    )
    rows = summary_rows(results)
    name_width = min(max((len(r.name) for r in rows), default=8), 32)
    for i, header in enumerate(HEADERS):
        if i == 0:
            table.add_column(header, min_width=name_width, overflow="fold")
        else:
            table.add_column(
                header, justify="left" if i == 7 else "right", no_wrap=True, min_width=9 if i == 7 else None
            )
    for row in rows:
        style = "bold green" if row.status == "winner" else ("dim" if not row.confirmed else None)
        table.add_row(*_cells(row), style=style)
    console.print(table)
    console.print(
        Text(
            f"{view.PREDICTED_MARK} = predicted, not measured. "
            f"{sum(1 for v in results.variants if v.predicted is not None)} variants predicted, "
            f"{sum(1 for v in results.variants if v.confirmed)} timed end to end (baseline included)."
            + (f" {view.TIES_LEGEND}" if any(r.near_ties_only for r in rows) else ""),
            style="dim",
        )
    )
    for vr in results.variants:
        if vr.disqualified:
            console.print(Text(f"disqualified {vr.name}: {vr.disqualified}"))
    for note in results.notes_of("left_out"):  # what the run did not measure changes what its figures mean
        console.print(Text(f"Note: {note.text}"))
    if results.workload and results.workload.subsampled:
        console.print(Text(f"Note: {results.workload.subsampled}"))
    console.print(Text(decision_sentence(results), style="bold"))
    if results.certainty is not None:
        console.print(Text(f"How sure: {results.certainty.summary}"))
    for line in (answer.category_line(results), answer.drafts_line(results)):
        if line:
            console.print(Text(line))
    for line in load.summary_lines(results):
        console.print(Text(line))
    capacity.render_section(results, console)
    manifest = next(reversed(results.notes_of("manifest")), None)
    if manifest:
        line = manifest.text[0].upper() + manifest.text[1:]
        console.print(Text(f"{line}; full report: runinfra-opt report {results.run_id}"))
    if servers := answer.launches_line(results):
        console.print(Text(servers))
    if timings := answer.timings_line(results):
        console.print(Text(timings, style="dim"))


def predicted_vs_measured(results: RunResults) -> list[dict[str, Any]]:
    """For every confirmed variant: predicted and measured tokens/s and their ratio (and TTFT p50)."""
    rows = []
    for vr in results.variants:
        if not vr.confirmed or vr.predicted is None or vr.measured is None:
            continue
        pred, meas = vr.predicted.tokens_per_s, vr.measured.tokens_per_s
        rows.append(
            {
                "variant": vr.name,
                "predicted_tokens_per_s": pred,
                "measured_tokens_per_s": meas,
                "error": (pred / meas - 1.0) if meas else None,
                "predicted_ttft_p50_s": vr.predicted.ttft_s.get("p50"),
                "measured_ttft_p50_s": vr.measured.ttft_s.get("p50"),
            }
        )
    return rows
