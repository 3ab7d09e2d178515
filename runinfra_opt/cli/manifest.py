"""`runinfra-opt manifest validate FILE`: check a serving manifest against the shipped JSON Schema.
`runinfra-opt manifest export --format vllm-config FILE`: its vLLM arguments as a `vllm serve --config` file."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from runinfra_opt.cli.app import CommandGroup, app, err_console, handle_errors
from runinfra_opt.errors import InputProblems, UserInputError

manifest_app = typer.Typer(
    cls=CommandGroup,
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


@manifest_app.command("export")
@handle_errors
def export_command(
    file: Path = typer.Argument(..., metavar="FILE", help="A manifest file, YAML or JSON (by its .json suffix)."),
    fmt: str = typer.Option(
        "vllm-config",
        "--format",
        "-f",
        help="vllm-config: the `vllm serve --config` YAML of serving.vllm.args; helm-values: the vLLM production-stack "
        "chart's servingEngineSpec (the model, the winner's arguments, replicaCount = the servers capacity needs).",
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write it to this file (atomically) instead of printing it."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object on stdout (the arguments, the config mapping, where written)."
    ),
) -> None:
    """Export FILE's serving settings for an engine: `vllm-config` is a YAML file that `vllm serve --config`
    reads back into exactly the manifest's serving.vllm.args. Exit 0 when exported; 2 when FILE is not a valid
    manifest or its winner has no vLLM equivalent."""
    from runinfra_opt.fsutil import atomic_write_text
    from runinfra_opt.manifest import export_manifest

    text, content = export_manifest(file, fmt)
    if output is not None:
        try:
            atomic_write_text(output, text)
        except OSError as exc:
            raise UserInputError(f"--output {output}: cannot write: {exc.strerror or exc}") from None
    if as_json:
        typer.echo(json.dumps({**content, "output": str(output) if output is not None else None}, indent=2))
    elif output is None:
        typer.echo(text, nl=False)
    if output is not None and not as_json:
        err_console.print(f"wrote {output}", markup=False)
