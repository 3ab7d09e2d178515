"""The docs stay a record, not a diary: word budgets (counted as `wc -w` counts, runs of non-whitespace) and no
machine named by a letter ("on F", "machine F"): a figure belongs to a summary in benchmarks/results/, which
records its machine, and docs/measurements.md is generated from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_WORDS = 1_200
PAGE_WORDS = 3_000
HOW_IT_WORKS_WORDS = 5_000
DOCS_WORDS = 18_000
MACHINE_LETTER = re.compile(
    r"\b(?:on|machine|machines)\s+[A-F]\b"
    r"|\b[A-F]'s\s+(?:steps|tables|knees|figures)\b"
    r"|\|\s*[A-F](?:,\s*(?:quiet|busy)[^|]*)?\s*\|"
    r"|^-\s+\*\*[A-F]\*\*"
)
"""A machine named by a letter: "on F", "machine D", "machines A-F", "E's steps", a table cell "| F, quiet |", a
list of machines "- **A** (...)"."""


def words(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").split())


def pages() -> list[Path]:
    found = sorted(DOCS.glob("*.md"))
    assert found
    return found


def test_the_readme_is_within_its_budget() -> None:
    assert words(REPO / "README.md") <= README_WORDS


@pytest.mark.parametrize("page", [p.name for p in sorted(DOCS.glob("*.md"))])
def test_each_page_is_within_its_budget(page: str) -> None:
    limit = HOW_IT_WORKS_WORDS if page == "how-it-works.md" else PAGE_WORDS
    assert words(DOCS / page) <= limit, f"docs/{page}: {words(DOCS / page)} words, the budget is {limit}"


def test_all_of_docs_is_within_its_budget() -> None:
    total = sum(words(page) for page in pages())
    assert total <= DOCS_WORDS, f"docs/: {total} words, the budget is {DOCS_WORDS}"


def test_no_line_under_docs_names_a_machine_letter() -> None:
    found = [
        f"{page.name}:{number}: {line.strip()[:80]}"
        for page in pages()
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if MACHINE_LETTER.search(line)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("the knee on F was 0.15 requests/s", True),
        ("machine D ran it", True),
        ("machines A-F", True),
        ("E's steps took 47 ms", True),
        ("| 2026-12-06 10:13 | 912f049 | F | summarize |", True),
        ("| 2026-12-02 20:24 | f8a69c1 | A, quiet | summarize |", True),
        ("- **B** (12-03 night): AMD EPYC, AVX2 only", True),
        ("| `-f`, `--format` | `table` | `table`, `markdown` |", False),
        ("a `replay` level on vLLM", False),
        ("prefills of 64 to 1,024 tokens on a CPU", False),
        ("exit code 2 on a bad option", False),
    ],
)
def test_the_machine_letter_rule_catches_what_the_diary_wrote(line: str, named: bool) -> None:
    assert bool(MACHINE_LETTER.search(line)) is named
