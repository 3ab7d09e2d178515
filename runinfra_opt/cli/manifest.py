"""`runinfra-opt manifest validate FILE`: check a serving manifest against the shipped JSON Schema."""

from __future__ import annotations

from pathlib import Path

import typer

from runinfra_opt.cli.app import app, handle_errors
from runinfra_opt.errors import InputProblems

manifest_app = typer.Typer(
    help="Work with serving manifests (runinfra.dev/v1 ServingOptimization).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(manifest_app, name="manifest")


@manifest_app.command("validate")
@handle_errors
def validate_command(
    file: Path = typer.Argument(..., metavar="FILE", help="A manifest file, YAML or JSON (by its .json suffix)."),
) -> None:
    """Validate FILE against the manifest schema. Exit 0 when valid; 2 with `FILE: field.path: problem` lines."""
    from runinfra_opt.manifest import API_VERSION, KIND, check_manifest_file

    problems = check_manifest_file(file)
    if problems:
        raise InputProblems(problems[:20], total=len(problems))
    typer.echo(f"{file}: valid {API_VERSION} {KIND} manifest")
