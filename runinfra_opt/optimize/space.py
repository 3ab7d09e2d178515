"""The search space: which variants an `optimize` run considers.

Defaults (issue 4): the baseline; prompt lookup (n-gram) with lookahead {1, 2, 3, 4, 5, 6, 8, 10, 12} and max
match size {1, 2, 3}; each `--draft` model with lookahead {1, 2, 3, 4, 5, 6, 8, 10, 12, 16}; early exit at
L/4, L/2 and 3L/4 of the target's L layers with lookahead {1, 2, 4, 6, 8}. `--methods` keeps only the methods
named, `--lookahead` replaces every method's lookaheads, `--ngram-max` and `--exit-layers` replace theirs
(each can narrow or widen the defaults).
"""

from __future__ import annotations

from collections.abc import Sequence

from runinfra_opt.errors import UserInputError
from runinfra_opt.variants import BASELINE, Method, Variant

NGRAM_LOOKAHEADS = (1, 2, 3, 4, 5, 6, 8, 10, 12)
NGRAM_MAX = (1, 2, 3)
DRAFT_LOOKAHEADS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
EARLY_EXIT_LOOKAHEADS = (1, 2, 4, 6, 8)


def default_exit_layers(num_layers: int) -> tuple[int, ...]:
    """L/4, L/2, 3L/4 (rounded, distinct, within 1..L-1)."""
    layers = sorted({max(1, min(num_layers - 1, round(num_layers * f))) for f in (0.25, 0.5, 0.75)})
    return tuple(layer for layer in layers if 1 <= layer < num_layers)


def build_space(
    *,
    num_layers: int,
    drafts: Sequence[str] = (),
    methods: Sequence[Method] | None = None,
    lookaheads: Sequence[int] | None = None,
    ngram_max: Sequence[int] | None = None,
    exit_layers: Sequence[int] | None = None,
) -> list[Variant]:
    """Every variant to consider, baseline first, then in order of simplicity."""
    chosen = tuple(methods) if methods else ("ngram", "early_exit", *(("draft",) if drafts else ()))
    if "draft" in chosen and not drafts:
        raise UserInputError("--methods draft needs at least one --draft model")
    if exit_layers:
        bad = [layer for layer in exit_layers if not 1 <= layer < num_layers]
        if bad:
            raise UserInputError(
                f"--exit-layers {','.join(map(str, bad))}: the target has {num_layers} layers; use 1..{num_layers - 1}"
            )
    variants: list[Variant] = [BASELINE]
    if "ngram" in chosen:
        for n in ngram_max or NGRAM_MAX:
            variants += [Variant("ngram", lookahead=k, ngram_max=n) for k in lookaheads or NGRAM_LOOKAHEADS]
    if "early_exit" in chosen and num_layers >= 2:
        for layer in exit_layers or default_exit_layers(num_layers):
            variants += [
                Variant("early_exit", lookahead=k, exit_layer=layer) for k in lookaheads or EARLY_EXIT_LOOKAHEADS
            ]
    if "draft" in chosen:
        for draft in drafts:
            variants += [Variant("draft", lookahead=k, draft=draft) for k in lookaheads or DRAFT_LOOKAHEADS]
    seen: set[str] = set()
    unique = []
    for v in variants:
        if v.name in seen:
            raise UserInputError(f"two variants share the name {v.name!r}: give drafts distinct directory names")
        seen.add(v.name)
        unique.append(v)
    return unique
