"""A command's parameters built from its option declarations (`runinfra_opt.options.Option`): each becomes a
`typer.Option` with the declaration's flags, type, default, help and panel, in the declarations' order."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import typer

from runinfra_opt.options import Option

F = TypeVar("F", bound=Callable[..., Any])


def declared(options: Sequence[Option], *, context: bool = False) -> Callable[[F], F]:
    """Give `func(ctx, **values)` the signature typer reads its parameters from: `ctx` (with `context`), then one
    parameter per option. Apply it below `handle_errors` (which copies the annotations)."""

    def decorate(func: F) -> F:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter("ctx", kind, annotation=typer.Context)] if context else []
        params += [
            inspect.Parameter(
                option.name,
                kind,
                default=typer.Option(option.default, option.flags, help=option.help, rich_help_panel=option.panel),
                annotation=option.type,
            )
            for option in options
        ]
        func.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        func.__annotations__ = {param.name: param.annotation for param in params} | {"return": None}
        return func

    return decorate
