"""The search space: which variants an `optimize` run considers.

Each method contributes its own part (`SpecMethod.space`); the defaults: prompt lookup (n-gram) with
lookahead {1, 2, 3, 4, 5, 6, 8, 10, 12} and max match size {1, 2, 3}; each `--draft` model with lookahead
{1, 2, 3, 4, 5, 6, 8, 10, 12, 16}; early exit at L/4, L/2 and 3L/4 of the target's L layers with lookahead
{1, 2, 4, 6, 8}. On the vLLM engine: vLLM's n-gram rule (`vllm_ngram`) with lookahead {2, 4, 8} and
match windows [1, 3] and [2, 4], and each `--draft` as above. `--methods` keeps only the methods named,
`--lookahead` replaces every method's lookaheads, `--ngram-max` and `--exit-layers` replace theirs (each can
narrow or widen the defaults; on vllm_ngram, `--ngram-max N` means the window [1, N]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runinfra_opt.engine.registry import DEFAULT_ENGINE
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE, Variant, get_method, method_names
from runinfra_opt.methods.base import SpaceSpec


@dataclass(frozen=True)
class SpaceSettings:
    """What the user asked of the search space (`--draft`, `--methods`, `--lookahead`, `--ngram-max`,
    `--exit-layers`; None keeps the defaults). A run's: `OptimizeConfig.space_settings()`."""

    drafts: Sequence[str] = ()
    methods: Sequence[str] | None = None
    lookaheads: Sequence[int] | None = None
    ngram_max: Sequence[int] | None = None
    exit_layers: Sequence[int] | None = None


def build_space(settings: SpaceSettings, *, num_layers: int, engine: str = DEFAULT_ENGINE) -> list[Variant]:
    """Every variant to consider, baseline first, then in order of simplicity (method rank). Without
    `settings.methods`, the methods whose defaults include `engine` (`SpecMethod.default_engines`)."""
    drafts, methods = settings.drafts, settings.methods
    if methods:
        chosen = [get_method(name) for name in methods]
        for method in chosen:
            if method.needs_draft_model and not drafts:
                raise UserInputError(f"--methods {method.name} needs at least one --draft model")
    else:
        chosen = [
            get_method(name)
            for name in method_names()
            if get_method(name).in_default_space and _on(get_method(name).default_engines, engine)
        ]
    spec = SpaceSpec(
        num_layers=num_layers,
        drafts=tuple(drafts),
        lookaheads=settings.lookaheads,
        ngram_max=settings.ngram_max,
        exit_layers=settings.exit_layers,
    )
    variants: list[Variant] = [BASELINE]
    for method in sorted(chosen, key=lambda m: m.rank):
        if method.speculative:
            variants += method.space(spec)
    seen: set[str] = set()
    unique = []
    for v in variants:
        if v.name in seen:
            raise UserInputError(f"two variants share the name {v.name!r}: give drafts distinct directory names")
        seen.add(v.name)
        unique.append(v)
    return unique


def _on(engines: frozenset[str] | None, engine: str) -> bool:
    return engines is None or engine in engines
