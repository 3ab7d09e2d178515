"""Speculative-decoding variants as immutable data, with short stable names.

Names: `baseline`, `ngram-n2-k4` (prompt lookup, max match 2, lookahead 4), `draft:<name>-k6`,
`early_exit-l8-k4` (self-drafting from layer 8). `parse_variant_name` inverts `Variant.name` for the methods
whose parameters are all in the name (a draft's full path is not: pass `drafts` to resolve it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from runinfra_opt.errors import UserInputError

Method = Literal["baseline", "draft", "ngram", "early_exit"]
METHODS: tuple[Method, ...] = ("baseline", "ngram", "early_exit", "draft")
"""All methods, in order of simplicity (ties go to the simpler one)."""


def draft_short_name(spec: str) -> str:
    """A short stable name for a draft model spec: the directory or file stem, or the hub id's last part."""
    if spec == "default":
        return "default"
    path = Path(spec)
    name = path.stem if path.suffix == ".gguf" else path.name
    return name or spec


@dataclass(frozen=True, order=True)
class Variant:
    """One speculative-decoding configuration. `lookahead` is k, the tokens drafted per target pass."""

    method: Method
    lookahead: int = 0
    draft: str | None = None
    """Draft model spec (path, GGUF file, cached hub id) for method `draft`."""
    ngram_max: int | None = None
    """Prompt lookup's max_matching_ngram_size for method `ngram`."""
    exit_layer: int | None = None
    """Layer whose hidden state drafts, for method `early_exit`."""
    confidence_threshold: float = field(default=0.0, compare=False)
    """transformers' assistant_confidence_threshold; 0 keeps the lookahead constant (measured = shipped)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserInputError(f"unknown method {self.method!r}; available: {', '.join(METHODS)}")
        if self.method == "baseline":
            if self.lookahead != 0:
                raise UserInputError("the baseline has no lookahead")
            return
        if self.lookahead < 1:
            raise UserInputError(f"lookahead must be >= 1 for method {self.method}, got {self.lookahead}")
        if self.method == "draft" and not self.draft:
            raise UserInputError("method draft needs a draft model (--draft)")
        if self.method == "ngram" and (self.ngram_max is None or self.ngram_max < 1):
            raise UserInputError("method ngram needs a max n-gram match size >= 1 (--ngram-max)")
        if self.method == "early_exit" and (self.exit_layer is None or self.exit_layer < 1):
            raise UserInputError("method early_exit needs an exit layer >= 1 (--exit-layer)")

    @property
    def name(self) -> str:
        if self.method == "baseline":
            return "baseline"
        if self.method == "ngram":
            return f"ngram-n{self.ngram_max}-k{self.lookahead}"
        if self.method == "early_exit":
            return f"early_exit-l{self.exit_layer}-k{self.lookahead}"
        return f"draft:{draft_short_name(self.draft or '')}-k{self.lookahead}"

    @property
    def is_speculative(self) -> bool:
        return self.method != "baseline"

    @property
    def simplicity_key(self) -> tuple[int, int, str]:
        """Sort key for ties: baseline < ngram < early exit < draft; then smaller lookahead.
        (Draft size is compared by the selector, which knows the models' costs.)"""
        return (METHODS.index(self.method), self.lookahead, self.name)

    def to_dict(self) -> dict[str, object]:
        return {
            "method": self.method,
            "lookahead": self.lookahead,
            "draft": self.draft,
            "ngram_max": self.ngram_max,
            "exit_layer": self.exit_layer,
            "confidence_threshold": self.confidence_threshold,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Variant:
        return cls(
            method=data["method"],  # type: ignore[arg-type]
            lookahead=int(data.get("lookahead") or 0),  # type: ignore[call-overload]
            draft=data.get("draft"),  # type: ignore[arg-type]
            ngram_max=data.get("ngram_max"),  # type: ignore[arg-type]
            exit_layer=data.get("exit_layer"),  # type: ignore[arg-type]
            confidence_threshold=float(data.get("confidence_threshold") or 0.0),  # type: ignore[arg-type]
        )


BASELINE = Variant("baseline")

_NAME_RE = re.compile(
    r"^(?:(?P<baseline>baseline)"
    r"|ngram-n(?P<n>\d+)-k(?P<nk>\d+)"
    r"|early_exit-l(?P<l>\d+)-k(?P<ek>\d+)"
    r"|draft:(?P<d>.+)-k(?P<dk>\d+))$"
)


def parse_variant_name(name: str, drafts: dict[str, str] | None = None) -> Variant:
    """Inverse of `Variant.name`. `drafts` maps a draft's short name to its full spec."""
    m = _NAME_RE.match(name)
    if not m:
        raise UserInputError(
            f"cannot parse variant name {name!r}; expected baseline, ngram-n<N>-k<K>, "
            "early_exit-l<L>-k<K> or draft:<name>-k<K>"
        )
    if m["baseline"]:
        return BASELINE
    if m["n"]:
        return Variant("ngram", lookahead=int(m["nk"]), ngram_max=int(m["n"]))
    if m["l"]:
        return Variant("early_exit", lookahead=int(m["ek"]), exit_layer=int(m["l"]))
    short = m["d"]
    return Variant("draft", lookahead=int(m["dk"]), draft=(drafts or {}).get(short, short))
