"""`runinfra-opt draft distill`: train a small draft model for a target from its own outputs on a workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from runinfra_opt.cli.app import CommandGroup, app, err_console, handle_errors, quiet_transformers

draft_app = typer.Typer(
    cls=CommandGroup, help="Make draft models for speculative decoding.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(draft_app, name="draft")


@draft_app.command("distill")
@handle_errors
def distill_command(
    target: str = typer.Option("default", "--target", help="default, a model directory, a .gguf file or a hub id."),
    workload: str = typer.Option("mixed", "--workload", help="Bundled workload name or a workload file."),
    out: Path = typer.Option(..., "--out", help="Directory for the draft (a transformers checkpoint)."),
    layers: int = typer.Option(2, "--layers", help="Decoder layers of the draft."),
    hidden: int = typer.Option(
        288, "--hidden", help="Hidden width: a multiple of the target's heads (--init layers) or of 64 (embedding)."
    ),
    minutes: float = typer.Option(5.0, "--minutes", help="Training time budget in minutes."),
    seed: int = typer.Option(0, "--seed", help="Seed: same seed and settings give the same weights."),
    holdout: float = typer.Option(0.25, "--holdout", help="Fraction of each category held out for evaluation."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda[:N]."),
    dtype: str = typer.Option("auto", "--dtype", help="The target's dtype: auto, float32, bfloat16 or float16."),
    train_dtype: str = typer.Option(
        "auto", "--train-dtype", help="Training compute: auto (bfloat16 autocast where supported), float32, bfloat16."
    ),
    max_tokens: int = typer.Option(
        96, "--max-tokens", help="Max continuation tokens per request (a request's own max_tokens caps it further)."
    ),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop after N training steps."),
    lookahead: int = typer.Option(4, "--lookahead", help="Lookahead of the held-out acceptance report."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads for torch (default: torch's)."),
    init: str = typer.Option(
        "layers",
        "--init",
        help="layers: the target's layers projected to the draft's width; embedding: embeddings only; or a model "
        "directory to start from (an earlier draft or a small Llama with the target's vocabulary; --layers and "
        "--hidden then come from it).",
    ),
    force: bool = typer.Option(False, "--force", help="Train again even if --out holds a draft of these settings."),
    as_json: bool = typer.Option(False, "--json", help="Print distill.json on stdout."),
) -> None:
    """Distil a draft: the target's greedy continuations of the workload's prompts (cached) and its top-k
    logits train a narrow Llama that shares the target's tokenizer; held-out acceptance is reported before
    and after. Rerun with the same arguments to resume an interrupted run; a finished one is not redone."""
    from runinfra_opt.distill.config import DistillConfig
    from runinfra_opt.distill.pipeline import distill

    config = DistillConfig(
        target=target,
        workload=workload,
        out=out,
        layers=layers,
        hidden=hidden,
        minutes=minutes,
        seed=seed,
        holdout=holdout,
        device=device,
        dtype=dtype,
        train_dtype=train_dtype,
        max_tokens=max_tokens,
        max_steps=max_steps,
        lookahead=lookahead,
        threads=threads,
        init=init,
    )
    config.validate()
    with _RichProgress() as progress:
        report = distill(config, progress, force=force)
    if as_json:
        typer.echo(json.dumps(report.summary, indent=2))
        return
    _render(report.summary, report.out, report.skipped)


class _RichProgress:
    """Progress bars on stderr: one per data stage, and training with its loss and time left."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        quiet_transformers()
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> _RichProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)

    def _task(self, name: str, total: float | None) -> Any:
        if name not in self._tasks:
            self._tasks[name] = self._bar.add_task(name, total=total, info="")
        return self._tasks[name]

    def stage(self, name: str, done: int, total: int) -> None:
        self._bar.update(self._task(name, total), completed=done, total=total)

    def train_step(self, step: int, loss: float, elapsed_s: float, budget_s: float, max_steps: int | None) -> None:
        # Progress is measured in training seconds (the budget), or in steps when --max-steps binds first.
        task = self._task("training", 100)
        fraction = elapsed_s / budget_s
        if max_steps is not None:
            fraction = max(fraction, step / max_steps)
        left = max(0.0, budget_s - elapsed_s)
        info = f"step {step}  loss {loss:.3f}  {left / 60:.1f} min budget left"
        self._bar.update(task, completed=min(100.0, 100.0 * fraction), info=info)

    def message(self, text: str) -> None:
        self._bar.console.print(text, markup=False, highlight=False)


def _fmt(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _render(summary: dict[str, Any], out: Path, skipped: bool) -> None:
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    if skipped:
        console.print(f"{out}: up to date (distill.json matches these settings; --force to train again)")
    before, after = summary.get("heldout_before", {}), summary.get("heldout_after", {})
    cost = summary.get("cost", {})
    training = summary.get("training", {})
    k = after.get("lookahead", summary.get("settings", {}).get("lookahead"))
    table = Table(title=f"held-out requests, greedy, lookahead {k}", title_justify="left")
    columns = ["category", "requests", "acc/pass\nbefore", "acc/pass\nafter", "tok/pass\nafter"]
    columns.append("agreement")
    for column in columns:
        table.add_column(column, justify="left" if column == "category" else "right")
    rows = [("all", before, after)] + [
        (name, before.get("per_category", {}).get(name, {}), stats)
        for name, stats in sorted(after.get("per_category", {}).items())
    ]
    for name, b, a in rows:
        table.add_row(
            name,
            str(a.get("requests", 0)),
            _fmt(b.get("accepted_per_pass")),
            _fmt(a.get("accepted_per_pass")),
            _fmt(a.get("tokens_per_pass")),
            _fmt(a.get("agreement")),
        )
    console.print(table)
    console.print(
        "acc/pass: draft tokens the target accepted per verification pass; tok/pass adds the target's own token "
        "(1.0 = no gain); agreement: share of positions where the draft's greedy token is the target's"
    )
    console.print(
        f"draft: {summary.get('draft', {}).get('layers')} layers x {summary.get('draft', {}).get('hidden')} wide, "
        f"cost ratio c = {_fmt(cost.get('c'), 3)} ({_fmt(cost.get('draft_ms'))} ms vs "
        f"{_fmt(cost.get('target_ms'))} ms a decode step); trained {training.get('steps')} steps in "
        f"{_fmt(training.get('seconds'), 0)} s (final loss {_fmt(training.get('final_loss'), 3)})"
    )
    console.print(f"{'kept' if skipped else 'saved'}: {out} (use it as --draft {out})")
