"""The HTML report's per-load section: plots of output tokens/s, TTFT p95 and goodput (with SLOs) against load
per variant, each crossover marked, then the section's tables. A pure function of the results (plotly figures
with fixed div ids: the same results give the same bytes).

The concurrency sweep and the open-loop levels do not share an axis: the closed-loop levels (`concurrency:N`)
are drawn against N on a log axis, the open-loop levels (`replay`, `rate:R`) as separate categorical points in a
narrow panel on the right, sharing the y axis. A crossover (where a speculative variant's throughput ratio to
the baseline falls to 1) is a dashed vertical line at its concurrency on the sweep's axis, with a shaded band
between where the ratio's 95% interval bounds cross 1.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from runinfra_opt.report import load as load_view
from runinfra_opt.report.html_blocks import empty_box, plot_box, table
from runinfra_opt.report.load import LoadRow
from runinfra_opt.results import Crossover, Interval, RunResults

BASELINE_COLOR = "#444444"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
CROSSOVER_NOTE = (
    "Dashed vertical line: where a speculative variant's throughput ratio to the baseline falls to 1 (log-linear "
    "between measured levels); shaded: between where the ratio's 95% interval bounds cross 1 (to the edge of the "
    "sweep where a bound does not cross)."
)


def _axes_note(closed: list[int], open_loop: list[str]) -> str:
    if closed and open_loop:
        return ("Left: the closed-loop concurrency sweep (requests in flight, log scale); right: the open-loop levels "
                f"({', '.join(open_loop)}) as separate points, not on the concurrency axis.")
    if closed:
        return "The closed-loop concurrency sweep (requests in flight, log scale)."
    return f"The open-loop levels ({', '.join(open_loop)}) as separate points; no concurrency sweep in this run."


def _colors(rows: list[LoadRow]) -> dict[str, str]:
    names = list(dict.fromkeys(r.variant for r in rows if not r.baseline))
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    colors.update({r.variant: BASELINE_COLOR for r in rows if r.baseline})
    return colors


def _error(values: list[float], intervals: list[Interval | None]) -> dict[str, Any]:
    return {
        "type": "data", "symmetric": False,
        "array": [iv.high - v if iv else 0 for v, iv in zip(values, intervals, strict=True)],
        "arrayminus": [v - iv.low if iv else 0 for v, iv in zip(values, intervals, strict=True)],
    }


def _crossover_span(crossover: Crossover, closed: list[int]) -> tuple[float, float] | None:
    """The shaded band: between the interval bounds' crossings, clipped to the sweep (None: nothing to shade)."""
    if crossover.low is None and crossover.high is None:
        return None
    low = crossover.low if crossover.low is not None else min(closed)
    high = crossover.high if crossover.high is not None else max(closed)
    return (min(low, high), max(low, high))


def _mark_crossovers(fig: Any, results: RunResults, colors: dict[str, str], closed: list[int]) -> None:
    """Each crossover on the sweep's axis (x1): a band, a dashed line and a label. Shapes take data coordinates on
    a log axis; annotations take log10 of them."""
    if results.load is None or not closed:
        return
    marked = [c for c in results.load.crossovers if c.concurrency is not None or c.low is not None
              or c.high is not None]
    for i, crossover in enumerate(marked):
        color = colors.get(crossover.variant, PALETTE[i % len(PALETTE)])
        span = _crossover_span(crossover, closed)
        if span is not None:
            fig.add_shape(type="rect", xref="x", yref="y domain", x0=span[0], x1=span[1], y0=0, y1=1,
                          fillcolor=color, opacity=0.12, line={"width": 0}, layer="below")
        at = crossover.concurrency
        if at is None or at <= 0:
            continue
        fig.add_shape(type="line", xref="x", yref="y domain", x0=at, x1=at, y0=0, y1=1,
                      line={"color": color, "dash": "dash", "width": 1.5})
        band = "" if span is None else f" [{span[0]:.3g}, {span[1]:.3g}]"
        fig.add_annotation(x=math.log10(at), xref="x", yref="y domain", y=1 - 0.07 * i, yanchor="top",
                           xanchor="left", showarrow=False, font={"size": 10, "color": color},
                           text=f"crossover {html.escape(crossover.variant)} at ~{at:.3g}{band}")


def _figure(
    results: RunResults,
    rows: list[LoadRow],
    value: Callable[[LoadRow], float | None],
    interval: Callable[[LoadRow], Interval | None] | None,
    yaxis: dict[str, Any],
) -> Any:
    """One metric against load, one trace per variant (and panel)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    levels = load_view.levels(results)
    closed = sorted({n for level in levels if (n := load_view.concurrency_of(level)) is not None})
    open_loop = [level for level in levels if load_view.concurrency_of(level) is None]
    both = bool(closed) and bool(open_loop)
    if both:
        fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.74, 0.26], horizontal_spacing=0.03)
    else:
        fig = go.Figure()
    colors = _colors(rows)
    for name in dict.fromkeys(r.variant for r in rows):
        mine = [r for r in rows if r.variant == name and value(r) is not None]
        shown_legend = False
        for panel, members in ((1, [r for r in mine if load_view.concurrency_of(r.level) is not None]),
                               (2 if both else 1, [r for r in mine if load_view.concurrency_of(r.level) is None])):
            if not members:
                continue
            if panel == 1 and closed:
                members.sort(key=lambda r: load_view.concurrency_of(r.level) or 0)
                xs: list[Any] = [load_view.concurrency_of(r.level) for r in members]
                mode = "lines+markers"
            else:
                xs = [r.level for r in members]
                mode = "markers"
            ys = [value(r) for r in members]
            trace: dict[str, Any] = {
                "x": xs, "y": ys, "mode": mode, "name": name, "legendgroup": name, "showlegend": not shown_legend,
                "line": {"color": colors[name], "dash": "dot" if members[0].baseline else "solid"},
                "marker": {"color": colors[name], "size": 9, "symbol": "square" if members[0].baseline else "circle"},
                "hovertext": [f"{name} at {r.level}" + (" (winner)" if r.winner else "") for r in members],
            }
            if interval is not None:
                trace["error_y"] = _error([float(y) for y in ys if y is not None], [interval(r) for r in members])
            shown_legend = True
            if both:
                fig.add_trace(go.Scatter(**trace), row=1, col=panel)
            else:
                fig.add_trace(go.Scatter(**trace))
    if closed:
        fig.update_xaxes(type="log", tickmode="array", tickvals=closed, ticktext=[str(n) for n in closed],
                         title_text="concurrency (requests in flight)", **({"row": 1, "col": 1} if both else {}))
    if open_loop:
        axis = {"row": 1, "col": 2} if both else {}
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=open_loop,
                         title_text="open-loop level", **axis)
    fig.update_yaxes(**yaxis, **({"row": 1, "col": 1} if both else {}))
    _mark_crossovers(fig, results, colors, closed)
    return fig


def _plots(results: RunResults, rows: list[LoadRow]) -> list[str]:
    levels = load_view.levels(results)
    closed = sorted({n for level in levels if (n := load_view.concurrency_of(level)) is not None})
    open_loop = [level for level in levels if load_view.concurrency_of(level) is None]
    axes = _axes_note(closed, open_loop)
    marked = bool(closed) and results.load is not None and any(
        c.concurrency is not None or c.low is not None or c.high is not None for c in results.load.crossovers)
    crossover_note = CROSSOVER_NOTE if marked else "No crossover to mark: no variant's ratio falls to 1 in the sweep."
    out = []

    title = "Output tokens/s against load"
    if any(r.tokens_per_s is not None for r in rows):
        fig = _figure(results, rows, lambda r: r.tokens_per_s.value if r.tokens_per_s else None,
                      lambda r: r.tokens_per_s, {"title_text": "output tokens/s", "rangemode": "tozero"})
        out.append(plot_box(fig, "plot-load-throughput", title,
                            f"{axes} Points: output tokens/s over each level's measured window, bars: its 95% "
                            f"interval; the baseline dotted. {crossover_note}"))
    else:
        out.append(empty_box(title, "No output tokens/s measured under load yet."))

    title = "TTFT p95 against load"
    if any(r.ttft_p95_ms is not None for r in rows):
        fig = _figure(results, rows, lambda r: r.ttft_p95_ms, None,
                      {"title_text": "TTFT p95 (ms)", "rangemode": "tozero"})
        out.append(plot_box(fig, "plot-load-ttft", title,
                            f"{axes} Points: the 95th percentile of time to first token over each level's "
                            f"measured requests (a percentile: no interval). {crossover_note}"))
    else:
        out.append(empty_box(title, "No TTFT measured under load yet."))

    if load_view.has_goodput(results):
        title = "Goodput against load"
        slos = load_view.slo_text(results) or "the SLOs given"
        fig = _figure(results, rows, lambda r: r.goodput.value if r.goodput else None, lambda r: r.goodput,
                      {"title_text": "share of requests within the SLOs", "tickformat": ".0%", "range": [0, 1.05]})
        out.append(plot_box(fig, "plot-load-goodput", title,
                            f"{axes} Points: the share of measured requests that succeeded within every SLO "
                            f"({slos}), bars: its 95% interval. {crossover_note}"))
    return out


def html_section(results: RunResults) -> str:
    """The per-load section of the HTML report ('' for a run without load)."""
    if results.load is None:
        return ""
    rows = load_view.load_rows(results)
    parts = [f"<h2>{html.escape(load_view.TITLE)}</h2>"]
    intro = load_view.intro_line(results)
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    parts.append('<div class="plots">')
    parts += _plots(results, rows)
    parts.append("</div>")
    if rows:
        classes = ["winner" if r.winner else "" for r in rows]
        parts.append(table(load_view.columns(results), load_view.table_cells(results), classes,
                           numeric=load_view.NUMERIC))
        legend = load_view.LEGEND + (" " + load_view.GOODPUT_LEGEND if load_view.has_goodput(results) else "")
        parts.append(f'<p class="legend">{html.escape(legend)}</p>')
    decisions = load_view.decision_cells(results)
    if decisions:
        parts += ["<h2>Winner per load level</h2>",
                  table(load_view.DECISION_COLUMNS, decisions, numeric=frozenset({"gain [95% CI]"}))]
    lines = [f"Crossover: {text}" for text in load_view.crossover_lines(results)]
    schedule = load_view.schedule_line(results)
    if schedule:
        lines.append(schedule[0].upper() + schedule[1:])
    lines += [f"Note: {note}" for note in load_view.note_lines(results)]
    if lines:
        parts.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>")
    return "\n".join(parts)
