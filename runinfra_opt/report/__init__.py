"""Reports of a run, rendered from its results file alone (no model loaded): terminal table, markdown, JSON,
CSV, a self-contained HTML page; and comparisons of two runs with a CI regression gate.

Every renderer is a pure function of a `RunResults` (or a `Comparison`). Heavy libraries (pandas, plotly)
are imported inside the functions that need them.
"""

from runinfra_opt.report.compare import (
    Comparison,
    compare,
    compare_verdict,
    render_comparison_markdown,
    render_comparison_table,
)
from runinfra_opt.report.data import CSV_KINDS, render_csv, render_json
from runinfra_opt.report.html import render_html
from runinfra_opt.report.text import render_markdown, render_table

__all__ = [
    "CSV_KINDS",
    "Comparison",
    "compare",
    "compare_verdict",
    "render_comparison_markdown",
    "render_comparison_table",
    "render_csv",
    "render_html",
    "render_json",
    "render_markdown",
    "render_table",
]
