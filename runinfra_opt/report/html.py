"""The HTML report: one self-contained file (plotly.js inlined, no CDN, no network) with the decision, the
tables and four plots, and for a run measured under load its section (report/load_html.py). A pure function of
the results: the same results give the same bytes."""

from __future__ import annotations

import html
from collections import Counter

from runinfra_opt.records import RequestRecord
from runinfra_opt.report import capacity, load_html, text, view
from runinfra_opt.report.html_blocks import empty_box, plot_box, table
from runinfra_opt.report.view import VariantRow
from runinfra_opt.results import RunResults, VariantResult

_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #1b1f24; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
.headline { font-size: 1.15em; font-weight: 600; padding: 10px 14px; border-left: 4px solid #2ca02c;
            background: #f3faf3; }
.headline.neutral { border-color: #7f7f7f; background: #f5f5f5; }
p.meta, p.legend { color: #57606a; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.88em; margin: 8px 0; }
th, td { padding: 4px 8px; border-bottom: 1px solid #d0d7de; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td:first-child, td.num { white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.winner td { font-weight: 600; background: #f3faf3; } tr.excluded td { color: #8c959f; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.plot-box { border: 1px solid #d0d7de; border-radius: 6px; padding: 4px; min-height: 440px; }
.caption { color: #57606a; font-size: 0.85em; margin: 2px 8px 6px; }
.empty { color: #57606a; padding: 16px; }
.plot-box h3 { font-size: 15px; font-weight: 600; margin: 8px 10px 0; }
"""


def _family_colors(rows: list[VariantRow]) -> dict[str, str]:
    families = sorted({r.family for r in rows if r.method != "baseline"})
    return {family: _PALETTE[i % len(_PALETTE)] for i, family in enumerate(families)}


def plot_lookahead(results: RunResults, rows: list[VariantRow]) -> str:
    """Tokens/s against lookahead, one colour per method and draft: predicted (dashed line), measured (points
    with their 95% interval); the baseline as a horizontal line."""
    import plotly.graph_objects as go

    title = "Tokens/s against lookahead"
    speculative = [r for r in rows if r.method != "baseline" and r.lookahead > 0]
    if not speculative:
        return empty_box(title, "No speculative variant in this run.")
    fig = go.Figure()
    colors = _family_colors(rows)
    for family, color in colors.items():
        members = sorted((r for r in speculative if r.family == family), key=lambda r: r.lookahead)
        predicted = [r for r in members if r.predicted_tokens_per_s is not None]
        if predicted:
            fig.add_trace(go.Scatter(
                x=[r.lookahead for r in predicted], y=[r.predicted_tokens_per_s for r in predicted],
                mode="lines+markers", name=f"{family} (predicted)", line={"color": color, "dash": "dash"},
                marker={"symbol": "circle-open", "size": 7}, legendgroup=family,
                hovertext=[r.name for r in predicted],
            ))
        measured = [r for r in members if r.measured_tokens_per_s is not None]
        if measured:
            intervals = [r.measured_tokens_per_s_interval for r in measured]
            fig.add_trace(go.Scatter(
                x=[r.lookahead for r in measured], y=[r.measured_tokens_per_s for r in measured],
                mode="markers", name=f"{family} (measured)", marker={"color": color, "size": 11},
                legendgroup=family, hovertext=[r.name for r in measured],
                error_y={
                    "type": "data", "symmetric": False,
                    "array": [(iv.high - r.measured_tokens_per_s) if iv and r.measured_tokens_per_s else 0
                              for r, iv in zip(measured, intervals, strict=True)],
                    "arrayminus": [(r.measured_tokens_per_s - iv.low) if iv and r.measured_tokens_per_s else 0
                                   for r, iv in zip(measured, intervals, strict=True)],
                },
            ))
    baseline = next((r for r in rows if r.method == "baseline"), None)
    if baseline is not None:
        # Labels on opposite sides so they stay readable when the two levels are close.
        for level, label, dash, side in (
            (baseline.measured_tokens_per_s, "baseline (measured)", "dot", "bottom right"),
            (baseline.predicted_tokens_per_s, "baseline (predicted)", "dash", "top left"),
        ):
            if level:
                fig.add_hline(y=level, line={"color": "#444", "dash": dash, "width": 1}, annotation_text=label,
                              annotation_position=side, annotation_font_size=10)
    lookaheads = sorted({r.lookahead for r in speculative})
    fig.update_layout(xaxis_title="lookahead (tokens drafted per target pass)",
                      yaxis_title="output tokens/s", xaxis={"tickmode": "array", "tickvals": lookaheads})
    return plot_box(fig, "plot-lookahead", title, "Dashed lines: predicted by the cost model for every lookahead; "
                    "filled points: measured end to end, with their 95% interval.")


def _spotlight(results: RunResults, rows: list[VariantRow], limit: int) -> list[VariantResult]:
    """The winner first, then the fastest other speculative variants (measured before predicted)."""
    ordered = [r for r in rows if r.method != "baseline" and not r.disqualified]
    ordered.sort(key=lambda r: (r.status != "winner", r.measured_tokens_per_s is None,
                                -(r.measured_tokens_per_s or r.predicted_tokens_per_s or 0.0)))
    out = []
    for row in ordered[:limit]:
        result = results.variant(row.name)
        if result is not None:
            out.append(result)
    return out


def _requests(result: VariantResult) -> tuple[list[RequestRecord], str]:
    return (result.measured_requests, "measured") if result.measured_requests else (
        result.predicted_requests, "predicted")


def plot_accepted(results: RunResults, rows: list[VariantRow]) -> str:
    """Distribution of draft tokens accepted per target pass, for the winner and the best other variants."""
    import plotly.graph_objects as go

    title = "Accepted draft tokens per target pass"
    fig = go.Figure()
    for i, result in enumerate(_spotlight(results, rows, 4)):
        requests, source = _requests(result)
        counts = Counter(n for r in requests for n in r.accepted_per_pass)
        total = sum(counts.values())
        if not total:
            continue
        xs = list(range(max(counts) + 1))
        fig.add_trace(go.Bar(x=xs, y=[counts.get(x, 0) / total for x in xs], name=f"{result.name} ({source})",
                             marker={"color": _PALETTE[i % len(_PALETTE)]}))
    if not fig.data:
        return empty_box(title, "No speculative variant with recorded target passes.")
    fig.update_layout(barmode="group", xaxis_title="draft tokens accepted in one target pass",
                      yaxis_title="share of target passes", yaxis_tickformat=".0%", xaxis={"dtick": 1})
    return plot_box(fig, "plot-accepted", title, "Share of target verification passes that accepted 0, 1, 2, ... "
                    "draft tokens (the winner and the fastest other variants).")


def plot_ttft(results: RunResults, rows: list[VariantRow]) -> str:
    """TTFT distribution of the baseline against the winner (or, when the baseline won, the best other)."""
    import plotly.graph_objects as go

    title = "TTFT: baseline vs winner"
    baseline = next((results.variant(r.name) for r in rows if r.method == "baseline"), None)
    others = _spotlight(results, rows, 1)
    if results.decision is None or results.decision.winner == "baseline":
        title = "TTFT: baseline (the winner) vs the best speculative variant"
        if results.decision is None:
            title = "TTFT: baseline vs the best speculative variant so far (no decision yet)"
    fig = go.Figure()
    for i, result in enumerate([r for r in (baseline, *others) if r is not None]):
        requests, source = _requests(result)
        if not requests:
            continue
        fig.add_trace(go.Box(y=[r.ttft_s * 1000 for r in requests], name=f"{result.name} ({source})",
                             boxpoints="all", jitter=0.4, pointpos=0, marker={"color": _PALETTE[i]}))
    if not fig.data:
        return empty_box(title, "No per-request TTFT in this run.")
    fig.update_layout(yaxis_title="TTFT (ms)", showlegend=False)
    return plot_box(fig, "plot-ttft", title, "One point per request and repeat; box: quartiles and median.")


def plot_categories(results: RunResults) -> str:
    """Speedup over the baseline per workload category: the winner's, and the best variant's for that category."""
    import plotly.graph_objects as go

    title = "Speedup per category"
    decision = results.decision
    winner = results.variant(decision.winner) if decision else None
    categories = [c.category for c in decision.per_category] if decision else []
    if winner is not None and not categories:
        categories = sorted(winner.per_category)
    if not categories:
        return empty_box(title, "No per-category figures (no decision yet).")
    fig = go.Figure()
    if winner is not None and winner.name != "baseline":
        speedups = [winner.per_category[c].speedup if c in winner.per_category else None for c in categories]
        fig.add_trace(go.Bar(x=categories, y=[s.value if s else None for s in speedups],
                             name=f"winner ({winner.name})", marker={"color": _PALETTE[0]},
                             error_y={"type": "data", "symmetric": False,
                                      "array": [s.high - s.value if s else 0 for s in speedups],
                                      "arrayminus": [s.value - s.low if s else 0 for s in speedups]}))
    if decision is not None and decision.per_category:
        fig.add_trace(go.Bar(x=[c.category for c in decision.per_category],
                             y=[c.speedup for c in decision.per_category], name="best for the category",
                             text=[c.best for c in decision.per_category], textposition="outside",
                             marker={"color": _PALETTE[2]}))
    fig.add_hline(y=1.0, line={"color": "#444", "dash": "dot"}, annotation_text="1.0x = baseline",
                  annotation_position="bottom right", annotation_font_size=10)
    fig.update_layout(barmode="group", yaxis_title="speedup (x baseline tokens/s)")
    return plot_box(fig, "plot-categories", title, "Measured tokens/s over the baseline's on each workload "
                    "category; the label names the best variant for that category.")


def render_html(results: RunResults) -> str:
    """The report as one self-contained HTML page (plotly.js inlined; opens offline)."""
    from plotly.offline import get_plotlyjs

    rows = view.variant_rows(results)
    headline_class = "headline" if results.decision is not None and results.decision.speculation else "headline neutral"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>runinfra-opt report: run {html.escape(results.run_id)}</title>",
        f"<style>{_CSS}</style>",
        f'<script type="text/javascript">{get_plotlyjs()}</script>',
        "</head><body>",
        f"<h1>runinfra-opt report: run {html.escape(results.run_id)}</h1>",
        f'<p class="{headline_class}">{html.escape(view.headline(results))}</p>',
    ]
    parts += [f"<p>{html.escape(line)}</p>" for line in text.intro_lines(results)]

    parts.append('<h2>Plots</h2><div class="plots">')
    parts += [plot_lookahead(results, rows), plot_accepted(results, rows), plot_ttft(results, rows),
              plot_categories(results)]
    parts.append("</div>")

    parts.append("<h2>Variants</h2>")
    classes = ["winner" if r.status == "winner" else ("excluded" if r.status in ("ruled out", "disqualified")
                                                      else "") for r in rows]
    parts.append(table(text.VARIANT_COLUMNS, [text.variant_cells(r) for r in rows], classes,
                       numeric=text.NUMERIC_COLUMNS))
    parts.append(f'<p class="legend">{html.escape(text.legend(rows))}</p>')
    for title, columns, cells in (
        ("Per category", text.CATEGORY_COLUMNS, text.category_cells(results)),
        ("Predicted vs measured", text.PREDICTION_COLUMNS, text.prediction_cells(rows)),
        (text.QUEUE_TITLE, text.QUEUE_COLUMNS, text.queue_cells(results)),
    ):
        if cells:
            parts += [f"<h2>{html.escape(title)}</h2>", table(columns, cells, numeric=text.NUMERIC_COLUMNS)]
    excluded = text.excluded_lines(rows)
    if excluded:
        parts.append("<h2>Excluded variants</h2><ul>")
        parts += [f"<li>{html.escape(line)}</li>" for line in excluded]
        parts.append("</ul>")
    if results.load is not None:
        parts.append(load_html.html_section(results))
    if results.capacity is not None:
        parts.append(capacity.html_section(results))
    parts += [f"<p>Note: {html.escape(note)}</p>" for note in text.notes(results)]
    parts.append(f'<p class="meta">Environment: {html.escape(view.environment_line(results))}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
