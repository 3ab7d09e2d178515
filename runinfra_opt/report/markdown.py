"""GitHub-flavoured markdown pieces every markdown report is built of: escaped cell text and tables."""

from __future__ import annotations


def md_escape(text: str) -> str:
    """`text` as one markdown table cell or line: backslashes and pipes escaped, newlines folded."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(columns: tuple[str, ...] | list[str], cells: list[list[str]], numeric: frozenset[str]) -> list[str]:
    """A GitHub-flavoured markdown table, the `numeric` columns right-aligned."""
    align = ["---:" if c in numeric else "---" for c in columns]
    lines = ["| " + " | ".join(md_escape(c) for c in columns) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in cells]
    return lines
