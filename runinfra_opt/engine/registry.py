"""The engine registry: engine name -> a function that opens it, as lazy `"module:function"` entries (an
engine's module imports its heavy libraries; `--help` must not). Adding an engine means one module that
implements `engine.protocol.Engine` and one line in `BUILTIN` (or a `register` call)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from runinfra_opt.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.engine.protocol import Engine

DEFAULT_ENGINE = "transformers"
BUILTIN: dict[str, str] = {
    "transformers": "runinfra_opt.engine.hf.engine:open_engine",
    "vllm": "runinfra_opt.engine.vllm.engine:open_engine",
}

Opener = Callable[..., "Engine"]
"""`opener(target, drafts, *, device, dtype, threads, allow_tokenizer_mismatch, skip_too_long, on_load, log_dir,
seed, **engine_specific)`: `log_dir` is where an engine keeps its logs (a serving engine's server logs);
engine-specific options (the vllm engine's `vllm_python`) are passed only when given."""

_extra: dict[str, Opener] = {}


def register(name: str, opener: Opener) -> None:
    _extra[name] = opener


def unregister(name: str) -> None:
    _extra.pop(name, None)


def names() -> list[str]:
    return sorted(set(BUILTIN) | set(_extra))


def check(name: str) -> str:
    """`name` when it is a known engine, else UserInputError listing the known ones."""
    if name not in BUILTIN and name not in _extra:
        raise UserInputError(f"--engine {name}: unknown engine; available: {', '.join(names())}")
    return name


def open_engine(name: str, target: str, drafts: Sequence[str] = (), **options: Any) -> Engine:
    """Open the engine `name` over the target and drafts (options as `Opener` says)."""
    if name in _extra:
        return _extra[name](target, drafts, **options)
    module, _, function = BUILTIN[check(name)].partition(":")
    opener: Opener = getattr(importlib.import_module(module), function)
    return opener(target, drafts, **options)
