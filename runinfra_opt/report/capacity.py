"""The capacity section of the reports (a run that searched capacity: `results.capacity`): a table of each
variant's capacity at the SLOs, the servers the target rate needs and their cost, measured or predicted; and in
the HTML report a plot of the attained TTFT and TPOT percentile against offered rate per variant, the SLO lines
drawn and each knee (the capacity) marked. Pure functions of the results."""

from __future__ import annotations

import html
from typing import Any

from rich.console import Console
from rich.text import Text

from runinfra_opt.load.capacity import rate_text
from runinfra_opt.report.html_blocks import plot_box, table
from runinfra_opt.report.markdown import md_escape, md_table
from runinfra_opt.results import CapacityRow, CapacitySummary, RunResults

TITLE = "Capacity per server"
COLUMNS = ("variant", "requests/s [interval]", "servers", "headroom", "cost/h", "cost/M tokens", "source")
NUMERIC = frozenset({"requests/s [interval]", "servers", "headroom", "cost/h", "cost/M tokens"})
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
BASELINE_COLOR = "#444444"


def _rate(row: CapacityRow) -> str:
    if row.low is not None and row.high is not None and row.high > row.low:
        return f"{rate_text(row.capacity)} [{rate_text(row.low)}, {rate_text(row.high)}]"
    return f"~{rate_text(row.capacity)}" if row.source == "predicted" else f">= {rate_text(row.capacity)}"


def _money(value: float | None) -> str:
    return "" if value is None else f"{value:,.2f}"


def cells(results: RunResults) -> list[list[str]]:
    summary = results.capacity
    if summary is None:
        return []
    out = []
    for row in summary.rows:
        source = row.source if row.eligible or row.why_not == "predicted only" else f"{row.source}; {row.why_not}"
        servers = [  # no capacity answer: no server count to provision by, as in the manifest
            "" if row.servers is None else str(row.servers), "" if row.headroom is None else f"{row.headroom:+.0%}",
            _money(row.cost_per_hour), _money(row.cost_per_million_tokens),
        ] if summary.answered else ["", "", "", ""]  # fmt: skip
        out.append([row.variant, _rate(row), *servers, source])
    return out


def intro(summary: CapacitySummary) -> str:
    """What was searched, against what, and the target."""
    if summary.criterion == "slo":
        slos = [f"TTFT <= {summary.slo_ttft_ms:g} ms" if summary.slo_ttft_ms is not None else "",
                f"TPOT <= {summary.slo_tpot_ms:g} ms" if summary.slo_tpot_ms is not None else ""]  # fmt: skip
        held = f"{summary.attainment:.0%} of requests within {' and '.join(s for s in slos if s)}"
    else:
        held = "the server keeping up (no SLO given)"
    target = ""
    if summary.target_rate:
        target = f"; target {rate_text(summary.target_rate)} requests/s ({summary.target_source})"
    return (
        f"The highest offered rate one server sustains with {held}, {summary.arrivals} arrivals, "
        f"{summary.requests_per_level} requests per rate{target}. Why capacity: {summary.why}."
    )


def lines(results: RunResults) -> list[str]:
    """The plan, the budget, the decision, in words."""
    summary = results.capacity
    if summary is None:
        return []
    out = [f"Plan: {text}" for text in summary.plan]
    out += [f"Budget ran out: {text}" for text in summary.budget_ran_out]
    out += [f"{vr.name}: {vr.capacity.note}" for vr in results.variants if vr.capacity and vr.capacity.note]
    if summary.reason:
        out.append(summary.reason)
    if not summary.answered:
        out.append(
            "No capacity answer in this run: no server count is given, and the manifest has no capacity section."
        )
    return out


def render_section(results: RunResults, console: Console) -> None:
    """The capacity table on a rich console (nothing without a capacity search)."""
    summary = results.capacity
    if summary is None:
        return
    from rich import box
    from rich.table import Table

    console.print(Text(TITLE, style="bold"))
    console.print(Text(intro(summary)))
    grid = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    for name in COLUMNS:
        grid.add_column(name, justify="right" if name in NUMERIC else "left")
    for line, row in zip(cells(results), summary.rows, strict=True):
        grid.add_row(*line, style="bold green" if row.variant == summary.winner else None)
    console.print(grid)
    for text in lines(results):
        console.print(Text(text))


def markdown_section(results: RunResults) -> list[str]:
    summary = results.capacity
    if summary is None:
        return []
    rows = cells(results)
    for line, row in zip(rows, summary.rows, strict=True):
        if row.variant == summary.winner:
            line[0] = f"**{line[0]}**"
    out = [f"### {TITLE}", "", md_escape(intro(summary)), ""]
    out += md_table(list(COLUMNS), rows, NUMERIC) + [""]
    out += [f"- {md_escape(text)}" for text in lines(results)]
    return [*out, ""]


def _knee_figure(results: RunResults, metric: str, slo_ms: float | None) -> Any:
    """Attained `metric` (ttft_s or tpot_s) p95 against offered rate per searched variant, the SLO line, the knees."""
    import plotly.graph_objects as go

    fig = go.Figure()
    names = [vr.name for vr in results.variants if vr.capacity and vr.capacity.levels]
    colors = {name: BASELINE_COLOR if name == "baseline" else PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    for vr in results.variants:
        vc = vr.capacity
        if vc is None or not vc.levels:
            continue
        levels = sorted(vc.levels, key=lambda level: level.rate)
        xs = [level.rate for level in levels]
        ys = [getattr(level, metric).get("p95", 0.0) * 1000 for level in levels]
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines+markers", name=vr.name, line={"color": colors[vr.name]},
            marker={"symbol": ["circle" if level.passed else "x" for level in levels], "size": 10},
            hovertext=[f"{vr.name} at {level.rate:g}/s: {'sustained' if level.passed else level.reason}"
                       for level in levels],
        ))  # fmt: skip
        if vc.measured is not None and vc.measured.value > 0:
            fig.add_vline(x=vc.measured.value, line={"color": colors[vr.name], "dash": "dash", "width": 1})
    if slo_ms is not None:
        fig.add_hline(y=slo_ms, line={"color": "#d62728", "dash": "dot"}, annotation_text=f"SLO {slo_ms:g} ms")
    label = "TTFT" if metric == "ttft_s" else "TPOT"
    fig.update_xaxes(title_text="offered rate (requests/s)", rangemode="tozero")
    fig.update_yaxes(title_text=f"{label} p95 (ms)", rangemode="tozero")
    return fig


def html_section(results: RunResults) -> str:
    """The capacity section of the HTML report ('' without a capacity search)."""
    summary = results.capacity
    if summary is None:
        return ""
    parts = [f"<h2>{html.escape(TITLE)}</h2>", f"<p>{html.escape(intro(summary))}</p>"]
    if any(vr.capacity and vr.capacity.levels for vr in results.variants):
        parts.append('<div class="plots">')
        caption = (
            "Points: the {0} p95 over each run's requests, per variant (x: a run that missed; a rate whose verdict "
            "was unclear, and the capacity found, were run twice, judged on both pooled); dashed "
            "vertical lines: each variant's capacity (its knee, the highest rate sustained); dotted: the SLO."
        )
        for metric, slo, div in (("ttft_s", summary.slo_ttft_ms, "plot-capacity-ttft"),
                                 ("tpot_s", summary.slo_tpot_ms, "plot-capacity-tpot")):  # fmt: skip
            label = "TTFT" if metric == "ttft_s" else "TPOT"
            fig = _knee_figure(results, metric, slo)
            parts.append(plot_box(fig, div, f"{label} against offered rate", caption.format(label)))
        parts.append("</div>")
    classes = ["winner" if row.variant == summary.winner else "" for row in summary.rows]
    parts.append(table(COLUMNS, cells(results), classes, numeric=NUMERIC))
    parts.append("<ul>" + "".join(f"<li>{html.escape(text)}</li>" for text in lines(results)) + "</ul>")
    return "\n".join(parts)
