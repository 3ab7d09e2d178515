"""Speculative-decoding variants as immutable data, with short stable names.

A variant is a method and its parameters. Names come from the method (`baseline`, `ngram-n2-k4`,
`draft:<name>-k6`, `early_exit-l8-k4`, ...) and `parse_variant_name` inverts them by asking every registered
method (a draft's full path is not in its name: pass `drafts` to resolve it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import registry

OptionValue = int | float | str | bool


def draft_short_name(spec: str) -> str:
    """A short stable name for a draft model spec: the directory or file stem, or the hub id's last part."""
    if spec == "default":
        return "default"
    path = Path(spec)
    name = path.stem if path.suffix == ".gguf" else path.name
    return name or spec


@dataclass(frozen=True, order=True)
class Variant:
    """One speculative-decoding configuration. `lookahead` is k, the tokens drafted per target pass. The
    typed fields serve the built-in methods; `options` holds the parameters of any other method, as sorted
    (name, value) pairs so that the variant stays hashable."""

    method: str
    lookahead: int = 0
    draft: str | None = None
    """Draft model spec (path, GGUF file, cached hub id) for method `draft`."""
    ngram_max: int | None = None
    """Prompt lookup's max_matching_ngram_size for method `ngram`."""
    exit_layer: int | None = None
    """Layer whose hidden state drafts, for method `early_exit`."""
    confidence_threshold: float = field(default=0.0, compare=False)
    """transformers' assistant_confidence_threshold; 0 keeps the lookahead constant (measured = shipped)."""
    options: tuple[tuple[str, OptionValue], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(sorted(self.options)))
        registry.get(self.method).validate(self)

    def option(self, name: str, default: OptionValue | None = None) -> OptionValue | None:
        return dict(self.options).get(name, default)

    @property
    def name(self) -> str:
        return registry.get(self.method).variant_name(self)

    @property
    def is_speculative(self) -> bool:
        return registry.get(self.method).speculative

    @property
    def simplicity_key(self) -> tuple[int, int, str]:
        """Sort key for ties: the method's rank (baseline < ngram < early exit < draft), then the smaller
        lookahead. (Draft size is compared by the selector, which knows the models' costs.)"""
        return (registry.get(self.method).rank, self.lookahead, self.name)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "method": self.method,
            "lookahead": self.lookahead,
            "draft": self.draft,
            "ngram_max": self.ngram_max,
            "exit_layer": self.exit_layer,
            "confidence_threshold": self.confidence_threshold,
        }
        if self.options:
            data["options"] = dict(self.options)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Variant:
        return cls(
            method=str(data["method"]),
            lookahead=int(data.get("lookahead") or 0),
            draft=data.get("draft"),
            ngram_max=data.get("ngram_max"),
            exit_layer=data.get("exit_layer"),
            confidence_threshold=float(data.get("confidence_threshold") or 0.0),
            options=tuple((data.get("options") or {}).items()),
        )


BASELINE = Variant("baseline")


def parse_variant_name(name: str, drafts: dict[str, str] | None = None) -> Variant:
    """Inverse of `Variant.name`. `drafts` maps a draft's short name to its full spec."""
    for method in registry.names():
        found = registry.get(method).parse_name(name, drafts or {})
        if found is not None:
            return found
    patterns = ", ".join(registry.get(m).name_pattern() for m in registry.names())
    raise UserInputError(f"cannot parse variant name {name!r}; expected {patterns}")
