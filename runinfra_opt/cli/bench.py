"""`runinfra-opt bench`: time one variant (and the baseline) over a workload and print aggregate figures."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from runinfra_opt.cli.app import app, handle_errors, progress_bar
from runinfra_opt.cli.options import (
    BUDGET,
    SPACE,
    WORKLOAD,
    AllowTokenizerMismatch,
    Device,
    Dtype,
    EngineName,
    SkipTooLong,
    Threads,
    TieTolerance,
    VllmPython,
    VllmServeArgs,
)
from runinfra_opt.engine.registry import DEFAULT_ENGINE


@app.command()
@handle_errors
def bench(
    workload: str = typer.Option(
        "mixed", "--workload", help="Bundled workload name or a workload file.", rich_help_panel=WORKLOAD
    ),
    method: str = typer.Option(
        ...,
        "--method",
        help="baseline, ngram, early_exit, draft, vllm_ngram (vllm), suffix (vllm), eagle or eagle3 (vllm).",
        rich_help_panel=SPACE,
    ),
    lookahead: int | None = typer.Option(
        None, "--lookahead", help="Tokens drafted per target pass (k).", rich_help_panel=SPACE
    ),
    target: str = typer.Option(
        "default", "--target", help="default, a model directory, a .gguf file or a hub id.", rich_help_panel=SPACE
    ),
    engine: EngineName = DEFAULT_ENGINE,
    vllm_python: VllmPython = None,
    vllm_serve_args: VllmServeArgs = None,
    tie_tolerance: TieTolerance = None,
    draft: str | None = typer.Option(
        None,
        "--draft",
        help="Draft model for --method draft, or eagle3:PATH / eagle:PATH (an EAGLE-3 / EAGLE head).",
        rich_help_panel=SPACE,
    ),
    ngram_max: int = typer.Option(
        2, "--ngram-max", help="Prompt lookup's max n-gram match size.", rich_help_panel=SPACE
    ),
    ngram_min: int = typer.Option(
        1, "--ngram-min", help="vllm_ngram's prompt_lookup_min (min n-gram match size).", rich_help_panel=SPACE
    ),
    exit_layer: int | None = typer.Option(
        None, "--exit-layer", help="Layer that drafts, for --method early_exit.", rich_help_panel=SPACE
    ),
    requests: int | None = typer.Option(
        None, "--requests", help="Use only the first N requests.", rich_help_panel=WORKLOAD
    ),
    repeat: int = typer.Option(1, "--repeat", help="Time every request this many times.", rich_help_panel=BUDGET),
    vs_baseline: bool = typer.Option(
        False, "--vs-baseline", help="Also time the baseline, interleaved.", rich_help_panel=BUDGET
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON on stdout.", rich_help_panel=BUDGET),
    device: Device = "auto",
    dtype: Dtype = "auto",
    threads: Threads = None,
    max_tokens: int = typer.Option(
        128,
        "--max-tokens",
        help="Max new tokens per request (a request's own max_tokens caps it further).",
        rich_help_panel=WORKLOAD,
    ),
    skip_too_long: SkipTooLong = False,
    allow_tokenizer_mismatch: AllowTokenizerMismatch = False,
) -> None:
    """Time one variant over a workload, one request at a time, and print TTFT/TPOT/e2e percentiles,
    tokens/s, acceptance and losslessness (and the speedup over the baseline with --vs-baseline)."""

    from runinfra_opt.bench import BenchConfig, make_variant, run_bench
    from runinfra_opt.engine.registry import engine_options
    from runinfra_opt.report.bench import bench_notes, bench_table

    variant = make_variant(
        method, lookahead=lookahead, draft=draft, ngram_max=ngram_max, ngram_min=ngram_min, exit_layer=exit_layer
    )
    config = BenchConfig(
        variant=variant,
        workload=workload,
        target=target,
        engine=engine,
        engine_options=engine_options(
            engine, {"vllm_python": vllm_python, "vllm_serve_args": vllm_serve_args, "tie_tolerance": tie_tolerance}
        ),
        draft=draft,
        requests=requests,
        repeat=repeat,
        vs_baseline=vs_baseline,
        device=device,
        dtype=dtype,
        threads=threads,
        max_tokens=max_tokens,
        skip_too_long=skip_too_long,
        allow_tokenizer_mismatch=allow_tokenizer_mismatch,
    )
    with progress_bar(transient=True) as bar:
        task = bar.add_task("loading", total=None)

        def on_progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        result = run_bench(config, progress=on_progress)
    if as_json:
        typer.echo(json.dumps({**result.to_dict(), "notes": bench_notes(result)}, indent=2))
        return
    out = Console(highlight=False)
    out.print(bench_table(result))
    for line in bench_notes(result):
        out.print(line, markup=False)
