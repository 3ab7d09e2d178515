"""`runinfra-opt bench`: time one variant (and the baseline) over a workload and print aggregate figures."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

from runinfra_opt.cli.app import app, handle_errors, progress_bar
from runinfra_opt.cli.options import declared
from runinfra_opt.options import (
    ALLOW_TOKENIZER_MISMATCH,
    BUDGET,
    DEVICE,
    DTYPE,
    ENGINE_NAME,
    ENGINE_OPTIONS,
    SKIP_TOO_LONG,
    SPACE,
    TARGET,
    THREADS,
    TIE_TOLERANCE,
    VLLM_PYTHON,
    VLLM_SERVE_ARGS,
    WORKLOAD,
    Option,
)
from runinfra_opt.workload import DEFAULT_MAX_TOKENS, DEFAULT_WORKLOAD

OPTIONS = (
    Option(
        "workload",
        "--workload",
        str,
        DEFAULT_WORKLOAD,
        "Bundled workload name or a workload file.",
        WORKLOAD,
        to="workload",
    ),
    Option(
        "method",
        "--method",
        str,
        ...,
        "baseline, ngram, early_exit, draft, vllm_ngram (vllm), suffix (vllm), eagle or eagle3 (vllm).",
        SPACE,
    ),
    Option("lookahead", "--lookahead", int | None, None, "Tokens drafted per target pass (k).", SPACE),
    TARGET,
    ENGINE_NAME,
    VLLM_PYTHON,
    VLLM_SERVE_ARGS,
    TIE_TOLERANCE,
    Option(
        "draft",
        "--draft",
        str | None,
        None,
        "Draft model for --method draft, or eagle3:PATH / eagle:PATH (an EAGLE-3 / EAGLE head).",
        SPACE,
        to="draft",
    ),
    Option("ngram_max", "--ngram-max", int, 2, "Prompt lookup's max n-gram match size.", SPACE),
    Option("ngram_min", "--ngram-min", int, 1, "vllm_ngram's prompt_lookup_min (min n-gram match size).", SPACE),
    Option("exit_layer", "--exit-layer", int | None, None, "Layer that drafts, for --method early_exit.", SPACE),
    Option("requests", "--requests", int | None, None, "Use only the first N requests.", WORKLOAD, to="requests"),
    Option("repeat", "--repeat", int, 1, "Time every request this many times.", BUDGET, to="repeat"),
    Option(
        "vs_baseline", "--vs-baseline", bool, False, "Also time the baseline, interleaved.", BUDGET, to="vs_baseline"
    ),
    Option("as_json", "--json", bool, False, "Print the results as JSON on stdout.", BUDGET),
    DEVICE,
    DTYPE,
    THREADS,
    Option(
        "max_tokens",
        "--max-tokens",
        int,
        DEFAULT_MAX_TOKENS,
        "Max new tokens per request (a request's own max_tokens caps it further).",
        WORKLOAD,
        to="max_tokens",
    ),
    SKIP_TOO_LONG,
    ALLOW_TOKENIZER_MISMATCH,
)
"""`bench`'s options in `--help`'s order: its own and those it shares with `optimize` (`options.SHARED`)."""


@app.command()
@handle_errors
@declared(OPTIONS)
def bench(**options: Any) -> None:
    """Time one variant over a workload, one request at a time, and print TTFT/TPOT/e2e percentiles,
    tokens/s, acceptance and losslessness (and the speedup over the baseline with --vs-baseline)."""

    from runinfra_opt.bench import BenchConfig, make_variant, run_bench
    from runinfra_opt.engine.registry import engine_options
    from runinfra_opt.report.bench import bench_notes, bench_table

    variant = make_variant(
        options["method"],
        lookahead=options["lookahead"],
        draft=options["draft"],
        ngram_max=options["ngram_max"],
        ngram_min=options["ngram_min"],
        exit_layer=options["exit_layer"],
    )
    engine = options["engine"]
    config = BenchConfig(
        variant=variant,
        engine_options=engine_options(
            engine, {option.name: options[option.name] for option in OPTIONS if option.to == ENGINE_OPTIONS}
        ),
        **{str(option.to): options[option.name] for option in OPTIONS if option.to not in (None, ENGINE_OPTIONS)},
    )
    with progress_bar(transient=True) as bar:
        task = bar.add_task("loading", total=None)

        def on_progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        result = run_bench(config, progress=on_progress)
    if options["as_json"]:
        typer.echo(json.dumps({**result.to_dict(), "notes": bench_notes(result)}, indent=2))
        return
    out = Console(highlight=False)
    out.print(bench_table(result))
    for line in bench_notes(result):
        out.print(line, markup=False)
