"""`runinfra-opt optimize`: find the best speculative configuration for a workload and write the manifest.

Thin: collect the option values (with `--config FILE` under them, `cli.settings`), build an `OptimizeConfig`
(`OptimizeConfig.from_options`), call `run_optimize`, render the summary (stderr progress bars, a table and the
decision in one sentence on stdout, or the decision as JSON with `--json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from runinfra_opt.cli.app import app, err_console, handle_errors, progress_bar
from runinfra_opt.cli.options import (
    BUDGET,
    CLUSTER,
    DECISION,
    ENGINE,
    LOAD,
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
from runinfra_opt.cli.settings import effective_settings, naming_the_file, settings_yaml
from runinfra_opt.drafts import DEFAULT_DRAFTS_DIR
from runinfra_opt.engine.registry import DEFAULT_ENGINE
from runinfra_opt.errors import GateFailedError
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.objective import DEFAULT_MIN_SPEEDUP
from runinfra_opt.optimize.config import (
    DEFAULT_BUDGET_MINUTES,
    DEFAULT_CONFIRM,
    DEFAULT_MAX_RETRIES,
    DEFAULT_RUNS_ROOT,
    DEFAULT_SLO_ATTAINMENT,
    OptimizeConfig,
)
from runinfra_opt.optimize.rundir import latest_left_note, moves_latest
from runinfra_opt.results import DEFAULT_MANIFEST

if TYPE_CHECKING:  # pragma: no cover
    from rich.progress import Progress, TaskID

    from runinfra_opt.results import RunResults


class _BarReporter:
    """One rich progress bar per phase, on stderr."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.description = ""

    def phase(self, name: str, total: int | None, description: str) -> None:
        self.end_phase()
        self.description = description
        self.task = self.progress.add_task(description, total=total)

    def advance(self, label: str = "") -> None:
        if self.task is not None:
            text = f"{self.description}: {label}" if label else self.description
            self.progress.update(self.task, advance=1, description=text)

    def end_phase(self) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=self.description)
            self.progress.stop_task(self.task)
            self.task = None

    def note(self, text: str) -> None:
        self.progress.console.print(text, markup=False)


@app.command()
@handle_errors
def optimize(
    ctx: typer.Context,
    workload: str | None = typer.Option(
        None,
        "--workload",
        help="Bundled workload name or a workload file (default: the bundled `mixed`).",
        rich_help_panel=WORKLOAD,
    ),
    workload_format: str | None = typer.Option(
        None, "--format", help="Workload file format (default: by suffix).", rich_help_panel=WORKLOAD
    ),
    max_requests: int | None = typer.Option(
        None, "--max-requests", help="Use at most N requests (after the plan).", rich_help_panel=WORKLOAD
    ),
    max_tokens: int | None = typer.Option(
        None,
        "--max-tokens",
        help="Cap on new tokens per request (default: each request's own max_tokens).",
        rich_help_panel=WORKLOAD,
    ),
    skip_too_long: SkipTooLong = False,
    target: str = typer.Option(
        "default", "--target", help="default, a model directory, a .gguf file or a hub id.", rich_help_panel=SPACE
    ),
    draft: list[str] = typer.Option(
        [],
        "--draft",
        help="A draft model to consider (repeatable), or eagle3:PATH / eagle:PATH for an EAGLE-3 / EAGLE head. "
        "Default: the drafts distilled for the target in --drafts-dir.",
        rich_help_panel=SPACE,
    ),
    drafts_dir: Path = typer.Option(
        DEFAULT_DRAFTS_DIR,
        "--drafts-dir",
        help="Where drafts made by `draft distill` are found when no --draft is given (only those for this target).",
        rich_help_panel=SPACE,
    ),
    methods: list[str] = typer.Option(
        [],
        "--methods",
        help="Methods: ngram, early_exit, draft, vllm_ngram, suffix, eagle, eagle3 (repeatable or comma-separated).",
        rich_help_panel=SPACE,
    ),
    lookahead: list[str] = typer.Option(
        [],
        "--lookahead",
        help="Lookaheads for every method, replacing the defaults (e.g. 2,4,8).",
        rich_help_panel=SPACE,
    ),
    ngram_max: list[str] = typer.Option(
        [], "--ngram-max", help="Prompt lookup max n-gram sizes (default 1,2,3).", rich_help_panel=SPACE
    ),
    exit_layers: list[str] = typer.Option(
        [],
        "--exit-layers",
        help="Early-exit layers (default: L/4, L/2, 3L/4 of the target's L layers).",
        rich_help_panel=SPACE,
    ),
    allow_tokenizer_mismatch: AllowTokenizerMismatch = False,
    engine: EngineName = DEFAULT_ENGINE,
    device: Device = "auto",
    dtype: Dtype = "auto",
    threads: Threads = None,
    vllm_python: VllmPython = None,
    vllm_serve_args: VllmServeArgs = None,
    pair_baseline: bool = typer.Option(
        True,
        "--pair-baseline/--no-pair-baseline",
        help="vllm (CPU): time each candidate beside the baseline, requests alternating between the two servers.",
        rich_help_panel=ENGINE,
    ),
    tie_tolerance: TieTolerance = None,
    remeasure_cost: bool = typer.Option(
        False, "--remeasure-cost", help="Measure forward costs again (no cache).", rich_help_panel=ENGINE
    ),
    load: str = typer.Option(
        "auto",
        "--load",
        help="Load levels each variant is served under (vllm): replay, concurrency:1,4,16, rate:0.5,2 joined with "
        "+; auto: replay (if the workload records arrivals) + a concurrency sweep; none: batch 1 only.",
        rich_help_panel=LOAD,
    ),
    time_scale: float = typer.Option(
        1.0, "--time-scale", help="Replay: multiply the recorded gaps (0.5: 2x as fast).", rich_help_panel=LOAD
    ),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="Rate levels: gamma shape of the gaps (1: Poisson).", rich_help_panel=LOAD
    ),
    slo_ttft_ms: float | None = typer.Option(
        None, "--slo-ttft-ms", help="Under load: the TTFT goodput counts.", rich_help_panel=LOAD
    ),
    slo_tpot_ms: float | None = typer.Option(
        None, "--slo-tpot-ms", help="Under load: the TPOT goodput counts.", rich_help_panel=LOAD
    ),
    slo_attainment: float = typer.Option(
        DEFAULT_SLO_ATTAINMENT,
        "--slo-attainment",
        help="Share of requests that must meet every SLO at a sustained rate (capacity).",
        rich_help_panel=LOAD,
    ),
    capacity_requests: int | None = typer.Option(
        None,
        "--capacity-requests",
        help="Capacity: requests per offered rate, the sample cycled (default: 48, or the planned requests if more).",
        rich_help_panel=LOAD,
    ),
    target_rate: float | None = typer.Option(
        None,
        "--target-rate",
        help="--priority capacity: requests/s to serve (default: the recorded peak rate).",
        rich_help_panel=DECISION,
    ),
    server_cost_per_hour: float | None = typer.Option(
        None,
        "--server-cost-per-hour",
        help="--priority capacity: one server's price per hour (cost per hour and per million tokens).",
        rich_help_panel=DECISION,
    ),
    priority: str = typer.Option(
        "throughput",
        "--priority",
        help="throughput, ttft, first-token-latency (an alias of ttft) or capacity (requests/s per server at the "
        "SLOs; vllm).",
        rich_help_panel=DECISION,
    ),
    percentile: str = typer.Option(
        "p95", "--percentile", help="TTFT percentile for --priority ttft: p50/p90/p95/p99.", rich_help_panel=DECISION
    ),
    max_ttft_ms: float | None = typer.Option(
        None, "--max-ttft-ms", help="Rule out variants whose TTFT exceeds this.", rich_help_panel=DECISION
    ),
    max_ttft_regression: float | None = typer.Option(
        None,
        "--max-ttft-regression",
        help="Rule out variants whose TTFT exceeds the baseline's by this (0.10 = 10%).",
        rich_help_panel=DECISION,
    ),
    min_speedup: float = typer.Option(
        DEFAULT_MIN_SPEEDUP,
        "--min-speedup",
        help="A speculative winner must be at least this much faster.",
        rich_help_panel=DECISION,
    ),
    require_speedup: bool = typer.Option(
        False, "--require-speedup", help="Exit 4 when the baseline wins (for CI gates).", rich_help_panel=DECISION
    ),
    strategy: str = typer.Option(
        "predictive",
        "--strategy",
        help="predictive (profile, predict, confirm the best) or exhaustive (time all).",
        rich_help_panel=DECISION,
    ),
    confirm: int = typer.Option(
        DEFAULT_CONFIRM, "--confirm", help="Predicted-best candidates to time end to end.", rich_help_panel=DECISION
    ),
    repeats: str = typer.Option(
        "auto",
        "--repeats",
        help="Timed repeats per request in confirmation: auto (2 or 3 by budget, more for the leaders until the "
        "decision is clear) or a number.",
        rich_help_panel=DECISION,
    ),
    seed: int = typer.Option(
        0, "--seed", help="Seed for subsampling and bootstrap intervals.", rich_help_panel=DECISION
    ),
    budget_minutes: float = typer.Option(
        DEFAULT_BUDGET_MINUTES,
        "--budget-minutes",
        help="Plan measuring to fit this many minutes (subsamples).",
        rich_help_panel=BUDGET,
    ),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="Run directory (default: .runinfra/runs/<time>-<id>).", rich_help_panel=BUDGET
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="Continue an interrupted run: its directory, run id or `latest`.", rich_help_panel=BUDGET
    ),
    out: Path = typer.Option(
        Path(DEFAULT_MANIFEST), "--out", help="Where to write the manifest.", rich_help_panel=BUDGET
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON on stdout.", rich_help_panel=BUDGET),
    runs_root: Path = typer.Option(
        DEFAULT_RUNS_ROOT, "--runs-dir", help="Where run directories are created.", rich_help_panel=BUDGET
    ),
    config_file: Path | None = typer.Option(
        None,
        "--config",
        help="A YAML file of settings: each option's long name as a key (`max-tokens: 24`); options given on the "
        "command line override it.",
        rich_help_panel=BUDGET,
    ),
    print_config: bool = typer.Option(
        False,
        "--print-config",
        help="Check the effective settings, print them as --config YAML and exit.",
        rich_help_panel=BUDGET,
    ),
    executor: str = typer.Option(
        "local",
        "--executor",
        help="Where confirmation trials run: local (this process) or ray (one task each).",
        rich_help_panel=CLUSTER,
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="Ray cluster to join, e.g. auto or ray://head:10001 (default: start a local one).",
        rich_help_panel=CLUSTER,
    ),
    trial_resources: str | None = typer.Option(
        None,
        "--trial-resources",
        help="Ray resources per trial, e.g. num_cpus=4,num_gpus=1 (default: see docs).",
        rich_help_panel=CLUSTER,
    ),
    max_retries: int = typer.Option(
        DEFAULT_MAX_RETRIES,
        "--max-retries",
        help="Resubmissions of a trial whose worker or node died (ray).",
        rich_help_panel=CLUSTER,
    ),
) -> None:
    """Find the fastest lossless speculative-decoding setup for a workload: profile once, predict every
    variant, time the best few against the baseline, decide on measured figures, write the manifest.

    Exit codes: 0 manifest written; 2 bad input;
    3 no variant (not even the baseline) satisfies the constraints;
    4 with --require-speedup when the baseline wins."""

    from runinfra_opt.optimize.pipeline import run_optimize

    values, origins = effective_settings(ctx, config_file)
    settings = settings_yaml(ctx.command, values)
    with naming_the_file(ctx.command, origins):
        config = OptimizeConfig.from_options(values, on_note=lambda text: err_console.print(text, markup=False))
        if print_config:  # checked as a run would check them, then printed
            typer.echo(settings, nl=False)
            return
        resume_from, chosen_dir, root = values["resume"], values["run_dir"], Path(config.runs_root)
        if chosen_dir is not None and not resume_from and not moves_latest(root, Path(chosen_dir)):
            err_console.print(latest_left_note(root, Path(chosen_dir)), markup=False)
        with progress_bar(transient=False) as bar:
            results = run_optimize(config, resume=resume_from, reporter=_BarReporter(bar), settings=settings)
    _render(results, as_json=bool(values["as_json"]))
    if results.decision is not None and results.decision.exit_code == int(ExitCode.GATE_FAILED):
        raise GateFailedError(f"--require-speedup: the baseline wins ({results.decision.reason})")


def decision_json(results: RunResults) -> dict[str, Any]:
    """The decision as printed by `--json`: winner, reason, gain, the run and manifest locations."""
    decision = results.decision.model_dump() if results.decision else None
    return {
        "run_id": results.run_id,
        "status": results.status,
        "decision": decision,
        "workload": results.workload.model_dump() if results.workload else None,
        "certainty": results.certainty.model_dump() if results.certainty else None,
        "load": _load_json(results),
        "capacity": results.capacity.model_dump() if results.capacity else None,
        "notes": [note.text for note in results.notes],
    }


def _load_json(results: RunResults) -> dict[str, Any] | None:
    """Per load level: every variant's tokens/s, ratio to the baseline and TTFT, and the level's decision."""
    if results.load is None:
        return None
    data = results.load.model_dump()
    data["variants"] = {
        vr.name: {
            lr.level: {
                "output_tokens_per_s": lr.metrics.output_tokens_per_s.model_dump()
                if lr.metrics.output_tokens_per_s
                else None,
                "vs_baseline": lr.vs_baseline.model_dump() if lr.vs_baseline else None,
                "ttft_s": lr.metrics.ttft_s,
                "tpot_s": lr.metrics.tpot_s,
                "goodput": lr.metrics.goodput.model_dump() if lr.metrics.goodput else None,
                "acceptance_rate": lr.acceptance_rate,
            }
            for lr in vr.load
        }
        for vr in results.variants
        if vr.load
    }
    return data


def _render(results: RunResults, *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(decision_json(results), indent=2))
        return
    from runinfra_opt.report.summary import render_summary

    render_summary(results, Console(highlight=False, soft_wrap=True))
