"""HTML pieces the report's page and its per-load section are built of: a table, a plot in its box, and the
box that stands in for a plot with nothing to show. The page's stylesheet (report/html.py) styles them."""

from __future__ import annotations

import html
from typing import Any


def table(columns: tuple[str, ...] | list[str], cells: list[list[str]], row_classes: list[str] | None = None, *,
          numeric: frozenset[str]) -> str:
    """A table of escaped text, the `numeric` columns right-aligned; `row_classes` style rows (e.g. `winner`)."""
    head = "".join(f'<th class="num">{html.escape(c)}</th>' if c in numeric else f"<th>{html.escape(c)}</th>"
                   for c in columns)
    body = []
    for i, row in enumerate(cells):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        tds = "".join(
            f'<td class="num">{html.escape(v)}</td>' if columns[j] in numeric else f"<td>{html.escape(v)}</td>"
            for j, v in enumerate(row)
        )
        body.append(f"<tr{cls}>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def plot_box(fig: Any, div_id: str, title: str, caption: str) -> str:
    """A plotly figure in its box: the title as a heading (plotly's own title would sit under its mode bar),
    then the plot, then a caption saying how to read it."""
    fig.update_layout(
        template="plotly_white",
        margin={"l": 60, "r": 20, "t": 30, "b": 40},
        height=440,
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0, "font": {"size": 10}},
    )
    plot = fig.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False, "responsive": True}
    )
    return (f'<div class="plot-box"><h3>{html.escape(title)}</h3>{plot}'
            f'<p class="caption">{html.escape(caption)}</p></div>')


def empty_box(title: str, why: str) -> str:
    """The box of a plot that has nothing to show, saying why."""
    return f'<div class="plot-box"><h3>{html.escape(title)}</h3><p class="empty">{html.escape(why)}</p></div>'
