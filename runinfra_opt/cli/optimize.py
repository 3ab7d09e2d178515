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
from runinfra_opt.cli.options import declared
from runinfra_opt.cli.settings import SETTINGS_OPTIONS, effective_settings, naming_the_file, settings_yaml
from runinfra_opt.errors import GateFailedError
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.options import OPTIONS
from runinfra_opt.optimize.rundir import latest_left_note, moves_latest

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
@declared((*OPTIONS, *SETTINGS_OPTIONS), context=True)
def optimize(ctx: typer.Context, **options: Any) -> None:
    """Find the fastest lossless speculative-decoding setup for a workload: profile once, predict every
    variant, time the best few against the baseline, decide on measured figures, write the manifest.

    Exit codes: 0 manifest written; 2 bad input;
    3 no variant (not even the baseline) satisfies the constraints;
    4 with --require-speedup when the baseline wins."""

    from runinfra_opt.optimize.pipeline import run_optimize

    values, origins = effective_settings(ctx, options["config_file"])
    settings = settings_yaml(ctx.command, values)
    with naming_the_file(ctx.command, origins):
        config = OptimizeConfig.from_options(values, on_note=lambda text: err_console.print(text, markup=False))
        if options["print_config"]:  # checked as a run would check them, then printed
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
