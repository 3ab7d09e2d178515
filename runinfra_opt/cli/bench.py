"""`runinfra-opt bench`: time one variant (and the baseline) over a workload and print aggregate figures."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from runinfra_opt.cli.app import app, handle_errors, progress_bar
from runinfra_opt.cli.optimize import BUDGET, ENGINE, SPACE, WORKLOAD
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
        help="baseline, ngram, early_exit, draft, vllm_ngram (vllm), eagle or eagle3 (vllm).",
        rich_help_panel=SPACE,
    ),
    lookahead: int | None = typer.Option(
        None, "--lookahead", help="Tokens drafted per target pass (k).", rich_help_panel=SPACE
    ),
    target: str = typer.Option(
        "default", "--target", help="default, a model directory, a .gguf file or a hub id.", rich_help_panel=SPACE
    ),
    engine: str = typer.Option(
        DEFAULT_ENGINE,
        "--engine",
        help="The engine that runs and measures: transformers (in-process) or vllm (a server per variant).",
        rich_help_panel=ENGINE,
    ),
    vllm_python: str | None = typer.Option(
        None,
        "--vllm-python",
        help="vllm: Python of an existing vLLM environment (default: `engine install vllm`'s).",
        rich_help_panel=ENGINE,
    ),
    tie_tolerance: float | None = typer.Option(
        None,
        "--tie-tolerance",
        help="vllm, nats: a greedy divergence where the baseline's top two tokens are this close is a near-tie "
        "(default by dtype: bfloat16 0.25, float16 0.05, float32 0.01).",
        rich_help_panel=ENGINE,
    ),
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
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N].", rich_help_panel=ENGINE),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, bfloat16 or float16.", rich_help_panel=ENGINE),
    threads: int | None = typer.Option(
        None, "--threads", help="CPU threads for torch (default: torch's).", rich_help_panel=ENGINE
    ),
    max_tokens: int = typer.Option(
        128,
        "--max-tokens",
        help="Max new tokens per request (a request's own max_tokens caps it further).",
        rich_help_panel=WORKLOAD,
    ),
    skip_too_long: bool = typer.Option(
        False,
        "--skip-too-long",
        help="Skip requests longer than the target's context instead of failing.",
        rich_help_panel=WORKLOAD,
    ),
    allow_tokenizer_mismatch: bool = typer.Option(
        False,
        "--allow-tokenizer-mismatch",
        help="Run a draft with another tokenizer (universal assisted generation).",
        rich_help_panel=SPACE,
    ),
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
        engine_options=engine_options(engine, {"vllm_python": vllm_python, "tie_tolerance": tie_tolerance}),
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
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    out = Console(highlight=False)
    out.print(bench_table(result))
    for line in bench_notes(result):
        out.print(line, markup=False)
