"""`runinfra-opt workload ...`: inspect, validate, convert and list recorded traffic.

Thin commands: each parses its options, calls one core function of `runinfra_opt.workload` and renders.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from runinfra_opt.cli.app import CommandGroup, app, handle_errors
from runinfra_opt.workload import (
    DEFAULT_MAX_TOKENS,
    FORMATS,
    convert_workload,
    list_bundled,
    load_workload,
    short_fingerprint,
    validate_workload,
)
from runinfra_opt.workload.inspect import WorkloadStats, inspect_workload

workload_app = typer.Typer(
    cls=CommandGroup,
    help="Inspect, validate, convert and list workloads (recorded traffic).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(workload_app, name="workload")

_FORMAT_HELP = f"Input format: {', '.join(FORMATS)} (default: by extension and the first record's shape)."
_PATH_HELP = "A workload file, or a bundled workload's name (see `workload list`)."
_MAX_TOKENS_HELP = f"max_tokens for requests that have none (default {DEFAULT_MAX_TOKENS})."


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False)


@workload_app.command("inspect")
@handle_errors
def inspect_command(
    path: str = typer.Argument(..., metavar="PATH", help=_PATH_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of tables."),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Count tokens with this model's tokenizer (default, a directory, a .gguf, a hub id)."
    ),
    format: str | None = typer.Option(None, "--format", help=_FORMAT_HELP),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help=_MAX_TOKENS_HELP),
) -> None:
    """Show the traffic's shape: sizes, timing, lengths, sampling and per-category predictability."""
    workload = load_workload(path, format=format, default_max_tokens=max_tokens)
    loaded_tokenizer = None
    if tokenizer is not None:
        from runinfra_opt.models import load_tokenizer

        loaded_tokenizer = load_tokenizer(tokenizer)
    stats = inspect_workload(workload, tokenizer=loaded_tokenizer, tokenizer_name=tokenizer)
    if as_json:
        payload = stats.to_dict()
        payload["fingerprint_short"] = short_fingerprint(stats.fingerprint)
        typer.echo(json.dumps(payload, indent=2))
        return
    render_stats(stats, _console())


def _num(value: float | None, fmt: str = "{:.2f}", na: str = "n/a") -> str:
    return na if value is None else fmt.format(value)


def render_stats(stats: WorkloadStats, console: Console) -> None:
    """The inspect tables (people's view of `WorkloadStats`)."""
    console.print(
        f"workload {stats.name} ({short_fingerprint(stats.fingerprint)}), {stats.format}: {stats.path}", markup=False
    )
    overview = Table(title="Traffic", show_header=False, title_justify="left")
    overview.add_column("what")
    overview.add_column("value")
    overview.add_row(
        "requests", f"{stats.requests} ({stats.chat_requests} chat, {stats.requests - stats.chat_requests} prompt)"
    )
    overview.add_row("categories", ", ".join(f"{name} {count}" for name, count in stats.categories.items()))
    no_timing = "n/a (no arrival times: back to back)"
    overview.add_row("duration", _num(stats.duration_s, "{:.2f} s", no_timing))
    overview.add_row("mean arrival rate", _num(stats.mean_rate_per_s, "{:.3f} requests/s", "n/a"))
    overview.add_row("burstiness (CV of gaps)", _num(stats.burstiness_cv, "{:.2f}", "n/a"))
    overview.add_row("greedy / sampled", f"{stats.greedy_share:.0%} / {stats.sampled_share:.0%}")
    if stats.session_turns is not None:
        t = stats.session_turns
        overview.add_row("sessions", f"{stats.sessions} (turns per session p50 {t.p50:.0f}, p90 {t.p90:.0f})")
    overview.add_row("repeated content", _num(stats.repeated_share, "{:.0%} of 3-grams (" + stats.ngram_unit + ")"))
    console.print(overview)

    title = f"Lengths ({stats.length_unit}" + (
        f", tokenizer {stats.tokenizer}, chat template applied)" if stats.tokenizer else ")"
    )
    lengths = Table(title=title, title_justify="left")
    for column in ("", "p50", "p90", "p99"):
        lengths.add_column(column, justify="right" if column else "left")
    p = stats.prompt_length
    lengths.add_row(f"prompt ({stats.length_unit})", f"{p.p50:.0f}", f"{p.p90:.0f}", f"{p.p99:.0f}")
    m = stats.max_tokens
    lengths.add_row("max_tokens (tokens)", f"{m.p50:.0f}", f"{m.p90:.0f}", f"{m.p99:.0f}")
    console.print(lengths)
    if stats.max_tokens_defaulted:
        console.print(
            f"{stats.max_tokens_defaulted} request(s) without max_tokens got {stats.default_max_tokens}", markup=False
        )

    categories = Table(
        title="Per category",
        title_justify="left",
        caption=(
            f"prompt p50 in {stats.length_unit}; predictability: share of response 3-grams ({stats.ngram_unit}) "
            "also found in the prompt (n/a: no recorded responses)"
        ),
        caption_justify="left",
    )
    for column in ("category", "requests", "prompt p50", "greedy", "responses", "predictability"):
        categories.add_column(column, justify="left" if column == "category" else "right")
    for c in stats.per_category:
        categories.add_row(
            c.name,
            f"{c.requests} ({c.share:.0%})",
            f"{c.prompt_p50:.0f}",
            f"{c.greedy_share:.0%}",
            str(c.responses),
            _num(c.predictability, "{:.0%}"),
        )
    console.print(categories)


@workload_app.command("validate")
@handle_errors
def validate_command(
    path: str = typer.Argument(..., metavar="PATH", help=_PATH_HELP),
    format: str | None = typer.Option(None, "--format", help=_FORMAT_HELP),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help=_MAX_TOKENS_HELP),
) -> None:
    """Check a workload; exit 0 with a summary, or 2 listing every problem (file:line: field: problem)."""
    summary = validate_workload(path, format=format, default_max_tokens=max_tokens)
    requests = f"{summary.requests} request{'' if summary.requests == 1 else 's'}"
    typer.echo(
        f"ok: {requests}, fingerprint {short_fingerprint(summary.fingerprint)} "
        f"({summary.format}, {len(summary.categories)} categor{'y' if len(summary.categories) == 1 else 'ies'})"
    )


@workload_app.command("convert")
@handle_errors
def convert_command(
    path: str = typer.Argument(..., metavar="PATH", help=_PATH_HELP),
    out: Path = typer.Option(..., "--out", help="Output file (native JSONL, .jsonl); written atomically."),
    format: str | None = typer.Option(None, "--format", help=_FORMAT_HELP),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help=_MAX_TOKENS_HELP),
) -> None:
    """Convert a workload in any accepted format to native JSONL (never over its input)."""
    workload = convert_workload(path, out, format=format, default_max_tokens=max_tokens)
    typer.echo(
        f"wrote {out}: {len(workload.requests)} requests from {workload.format}, "
        f"fingerprint {short_fingerprint(workload.fingerprint)}"
    )


@workload_app.command("list")
@handle_errors
def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list on stdout instead of a table."),
) -> None:
    """The bundled workloads: name, requests, categories, description, fingerprint."""
    infos = list_bundled()
    if as_json:
        typer.echo(json.dumps([info.__dict__ for info in infos], indent=2))
        return
    table = Table(title="Bundled workloads", title_justify="left")
    for column in ("name", "requests", "categories", "description"):
        table.add_column(column, justify="right" if column == "requests" else "left", no_wrap=column == "name")
    table.add_column("fingerprint", no_wrap=True, min_width=len("sha256:") + 12)
    for info in infos:
        table.add_row(
            info.name,
            str(info.requests),
            ", ".join(f"{k} {v}" for k, v in info.categories.items()),
            info.description,
            short_fingerprint(info.fingerprint),
        )
    _console().print(table)
