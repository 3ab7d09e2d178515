"""`runinfra-opt load plan`: the schedule a `--load` spec makes of a workload, summarised without sending
anything (the load runner itself is a library piece the serving engine drives).

The workload is streamed (validated in one pass, planned in another): a recording of any size plans in memory
bounded by its busiest second.
"""

from __future__ import annotations

import dataclasses
import json

import typer
from rich.console import Console
from rich.table import Table

from runinfra_opt.cli.app import CommandGroup, app, handle_errors
from runinfra_opt.load.schedule import ScheduleSummary, plan, summarize
from runinfra_opt.load.spec import parse_load
from runinfra_opt.workload import DEFAULT_MAX_TOKENS, DEFAULT_WORKLOAD, FORMATS, short_fingerprint, stream_workload

load_app = typer.Typer(
    cls=CommandGroup,
    help="Plan how requests are offered to a serving engine (load models).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(load_app, name="load")


@load_app.command("plan")
@handle_errors
def plan_command(
    load: str = typer.Option(
        ..., "--load", help="replay, concurrency:N[,N...] or rate:R[,R...] (requests/s), joined with +."
    ),
    workload: str = typer.Option(DEFAULT_WORKLOAD, "--workload", help="A workload file or a bundled name."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="replay: multiply recorded gaps (0.5: twice as fast)."),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="rate: gamma shape of the gaps (1 Poisson, < 1 burstier, inf evenly spaced)."
    ),
    seed: int = typer.Option(0, "--seed", help="rate: seed of the random gaps."),
    format: str | None = typer.Option(None, "--format", help=f"Input format: {', '.join(FORMATS)}."),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", help=f"max_tokens for requests that have none (default {DEFAULT_MAX_TOKENS})."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of a table."),
) -> None:
    """Summarise each load level's schedule of the workload: requests, planned span, mean rate, the most requests
    in any one second, and the sum of their max_tokens."""
    levels = parse_load(load, time_scale=time_scale, burstiness=burstiness, seed=seed)
    stream = stream_workload(workload, format=format, default_max_tokens=max_tokens)
    summaries = [summarize(level, plan(level, stream)) for level in levels]
    if as_json:
        payload = {
            "workload": stream.name,
            "path": stream.path,
            "fingerprint": stream.fingerprint,
            "requests": stream.requests,
            "arrivals": stream.has_arrivals,
            "in_arrival_order": stream.in_arrival_order,
            "levels": [{**dataclasses.asdict(s), "mean_rate_per_s": s.mean_rate_per_s} for s in summaries],
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    console = Console(highlight=False, soft_wrap=False)
    timing = "arrivals recorded" if stream.has_arrivals else "no arrival times"
    if stream.has_arrivals and not stream.in_arrival_order:
        timing += " (not in file order: replay sorts them in memory)"
    console.print(
        f"workload {stream.name} ({short_fingerprint(stream.fingerprint)}): {stream.requests} requests, {timing}",
        markup=False,
    )
    console.print(_table(summaries))


def _table(summaries: list[ScheduleSummary]) -> Table:
    table = Table(title="Load levels", title_justify="left")
    table.add_column("level", no_wrap=True)
    table.add_column("schedule")
    for name in ("requests", "span s", "req/s", "peak/s", "max tokens"):
        table.add_column(name, justify="right")
    for s in summaries:
        rate = s.mean_rate_per_s
        table.add_row(
            s.level,
            s.description,
            str(s.requests),
            "-" if s.span_s is None else f"{s.span_s:.1f}",
            "-" if rate is None else f"{rate:.2f}",
            "-" if s.peak_per_s is None else str(s.peak_per_s),
            str(s.max_tokens),
        )
    return table
