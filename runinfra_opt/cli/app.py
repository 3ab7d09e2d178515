"""The `runinfra-opt` Typer application: sub-command registration and error-to-exit-code mapping.

Keep this module and every command module free of module-level heavy imports (torch, transformers,
pandas, ...): `runinfra-opt --help` must return in well under a second.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from runinfra_opt import __version__
from runinfra_opt.errors import RuninfraError
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.signals import Terminated, cancellation

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class CommandGroup(TyperGroup):
    """Typer's group, listing each command by its help's first paragraph on one line. In rich markup mode Typer
    keeps that paragraph's line breaks in a group's list of commands, so a docstring wrapped in the source made a
    ragged column there (a command's own page joins them already). Every group of the CLI is one of these."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.short_help is None and command.help:
            command.short_help = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
        return command


app = typer.Typer(
    name="runinfra-opt",
    cls=CommandGroup,
    help="Find the fastest lossless speculative-decoding setup for your own LLM traffic.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

F = TypeVar("F", bound=Callable[..., Any])

WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
"""Errors of the machine's storage, not of runinfra-opt: one line and exit 6, never a traceback."""


def handle_errors(func: F) -> F:
    """Map domain errors to one clear line on stderr and their exit code; never a traceback for user input.
    SIGTERM and SIGINT stop the command keeping what is finished (see `runinfra_opt.signals`): 143 and 130."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with cancellation():
                return func(*args, **kwargs)
        except RuninfraError as exc:
            for line in str(exc).splitlines() or [type(exc).__name__]:
                err_console.print(f"error: {line}", markup=False)
            raise typer.Exit(int(exc.exit_code)) from None
        except OSError as exc:
            if exc.errno not in WRITE_ERRNOS:
                raise
            where = f" {exc.filename}" if exc.filename else ""
            err_console.print(
                f"error: cannot write{where}: {exc.strerror}; what was written before is intact", markup=False
            )
            raise typer.Exit(int(ExitCode.WRITE_FAILED)) from None
        except Terminated:
            err_console.print("terminated (SIGTERM): what was finished is kept on disk", markup=False)
            raise typer.Exit(int(ExitCode.TERMINATED)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted (SIGINT): what was finished is kept on disk", markup=False)
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None

    return wrapper  # type: ignore[return-value]


def quiet_transformers() -> None:
    """Silence transformers' own load/save bars and once-only notices (they would interleave with ours)."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def progress_bar(*, transient: bool) -> Any:
    """The commands' progress bar on stderr (description, bar, done/total, elapsed), with transformers' own
    load bars and once-only notices silenced so they do not interleave with it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    quiet_transformers()
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=transient,
    )


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"runinfra-opt {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Find the fastest lossless speculative-decoding setup for your own LLM traffic."""


def main() -> None:
    """Console-script entry point. A cancelled command (exit 130 or 143) leaves without the interpreter's
    teardown (see `_leave_now`)."""
    # transformers converts a GGUF file under a plain tqdm bar that `quiet_transformers` cannot reach: on a log (CI)
    # it is a line of carriage-return frames between ours. tqdm reads its settings from the environment when it is
    # first imported, which is later than here (commands import their libraries lazily); a user's value stands.
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        app(prog_name="runinfra-opt")
    except SystemExit as exc:
        if exc.code in (ExitCode.TERMINATED, ExitCode.INTERRUPTED):
            _leave_now(int(exc.code))
        raise
    sys.exit(0)


def _leave_now(code: int) -> None:
    """Exit a cancelled command at once: by now its servers are stopped and what was finished is on disk, and
    what is left of a normal exit is the exit hooks (run here: they stop a Ray cluster this process started and
    flush logs) and the interpreter's teardown of every loaded module (torch's and transformers' included), which
    a CI grace period cannot spare (docs/measurements.md, faults.py). `atexit` has no public way to run its hooks
    early; `_run_exitfuncs` is the one Python's own shutdown calls."""
    import atexit
    import os

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
