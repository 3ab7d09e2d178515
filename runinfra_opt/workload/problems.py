"""Collects every problem found in an input file, one `<file>:<line>: <field>: <problem>` line each."""

from __future__ import annotations

from runinfra_opt.errors import InputProblems

MAX_SHOWN = 20
"""Problems listed in full; the rest are counted ("... and N more")."""


class Problems:
    """Problem lines for one source file: the first `MAX_SHOWN` kept in full, all counted."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.shown: list[str] = []
        self.total = 0

    def add(self, line: int | None, field: str, problem: str) -> None:
        self.total += 1
        if len(self.shown) < MAX_SHOWN:
            where = f"{self.source}:{line}" if line is not None else self.source
            self.shown.append(f"{where}: {field}: {problem}")

    def __bool__(self) -> bool:
        return self.total > 0

    def raise_if_any(self) -> None:
        if self.total:
            raise InputProblems(self.shown, total=self.total)


def describe(value: object) -> str:
    """A short description of a JSON value for error messages: `'abc' (a string)`, `true (a boolean)`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int):
        return f"{value} (an integer)"
    if isinstance(value, float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"{shown!r} (a string)"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
