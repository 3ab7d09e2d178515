"""The method registry: method name -> `SpecMethod`, with helpful errors.

Built-in methods are lazy `"module:attribute"` entries (importing a method module is cheap, but `--help` need
not pay even that); `register` adds another at run time (a plugin, or a toy method in a test). Adding a
method means writing one module under `runinfra_opt/methods/` and one line in `BUILTIN` (or calling
`register`); nothing else in the program names methods.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from runinfra_opt.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods.base import SpecMethod

BUILTIN: dict[str, str] = {
    "baseline": "runinfra_opt.methods.baseline:METHOD",
    "ngram": "runinfra_opt.methods.ngram:METHOD",
    "early_exit": "runinfra_opt.methods.early_exit:METHOD",
    "draft": "runinfra_opt.methods.draft:METHOD",
    "vllm_ngram": "runinfra_opt.methods.vllm_ngram:METHOD",
    "suffix": "runinfra_opt.methods.suffix:METHOD",
    "eagle": "runinfra_opt.methods.eagle:EAGLE",
    "eagle3": "runinfra_opt.methods.eagle:EAGLE3",
}

_loaded: dict[str, SpecMethod] = {}
_extra: dict[str, SpecMethod] = {}


def register(method: SpecMethod) -> SpecMethod:
    """Add (or replace) a method by its `name`. Returns it, so it can decorate an instance's creation."""
    if not method.name or not method.name.replace("_", "").isalnum():
        raise ValueError(f"a method name must be a non-empty word of letters, digits and _: {method.name!r}")
    _extra[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method added with `register` (built-ins stay)."""
    _extra.pop(name, None)


def names() -> list[str]:
    """Every method's name, simplest first (by rank, then name)."""
    return sorted(set(BUILTIN) | set(_extra), key=lambda n: (get(n).rank, n))


def get(name: str) -> SpecMethod:
    """The method called `name`; an unknown name raises UserInputError listing the available ones."""
    if name in _extra:
        return _extra[name]
    if name in _loaded:
        return _loaded[name]
    entry = BUILTIN.get(name)
    if entry is None:
        available = ", ".join(sorted(set(BUILTIN) | set(_extra)))
        raise UserInputError(f"unknown method {name!r}; available: {available}")
    module, _, attribute = entry.partition(":")
    method: SpecMethod = getattr(importlib.import_module(module), attribute)
    _loaded[name] = method
    return method


def speculative_names() -> list[str]:
    return [n for n in names() if get(n).speculative]


def draft_owner(spec: str) -> SpecMethod | None:
    """The method a draft spec written `<prefix>:PATH` belongs to (e.g. `eagle3:PATH`), else None (a draft
    model: a directory, a GGUF file or a hub id)."""
    prefix, sep, _ = spec.partition(":")
    if not sep:
        return None
    return next((get(n) for n in names() if get(n).draft_prefix == prefix), None)


def check_drafts(specs: Sequence[str]) -> None:
    """Raise UserInputError (naming the spec and the problem) for the first draft spec that a method claims by
    its prefix and finds unusable (e.g. `--draft eagle3:PATH` without PATH/config.json)."""
    for spec in specs:
        owner = draft_owner(spec)
        if owner is not None:
            owner.check_draft(spec)
