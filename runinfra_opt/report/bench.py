"""The `bench` command's output: its summary table and the lines printed under it.

The renderers read a bench result through `BenchReport`, the part of `runinfra_opt.bench.BenchResult` they
need, since features (bench, report) do not import each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.records import NO_PASS_SAVED, RequestRecord, saved_a_pass
from runinfra_opt.results import Interval, Summary

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table


class BenchAsked(Protocol):
    """What the bench run was asked to do (`BenchConfig`)."""

    @property
    def variant(self) -> Variant: ...
    @property
    def repeat(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...


class BenchReport(Protocol):
    """What a bench run measured (`BenchResult`), as far as its output shows it."""

    @property
    def config(self) -> BenchAsked: ...
    @property
    def variant(self) -> str: ...
    @property
    def workload(self) -> dict[str, Any]: ...
    @property
    def summaries(self) -> dict[str, Summary]: ...
    @property
    def records(self) -> dict[str, list[RequestRecord]]: ...
    @property
    def speedup(self) -> Interval | None: ...
    @property
    def skipped(self) -> list[str]: ...
    @property
    def seen_by_draft(self) -> list[str]: ...
    @property
    def lossless(self) -> bool | None: ...
    @property
    def mismatches(self) -> list[dict[str, Any]]: ...


def _ms(values: dict[str, float], key: str) -> str:
    return f"{values[key] * 1000:.1f}" if key in values else "-"


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def bench_table(result: BenchReport) -> Table:
    """The summary table: one column per variant, one row per figure."""
    from rich.table import Table

    names = list(result.summaries)
    table = Table(title=f"bench: {result.variant} on {result.workload['name']}", title_justify="left")
    table.add_column("figure")
    for name in names:
        table.add_column(name, justify="right")
    summaries = [result.summaries[n] for n in names]
    for label, metric in (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("e2e", "e2e_s")):
        for p in ("p50", "p90", "p99"):
            table.add_row(f"{label} {p} (ms)", *[_ms(getattr(s, metric), p) for s in summaries])
    table.add_row("output tokens/s", *[f"{s.tokens_per_s:.2f}" for s in summaries])
    table.add_row("output tokens", *[str(s.output_tokens) for s in summaries])
    table.add_row("target passes", *[str(s.target_passes) for s in summaries])
    table.add_row("accepted per target pass", *[_fmt(s.mean_accepted_per_pass, "{:.2f}") for s in summaries])
    table.add_row("acceptance rate", *[_fmt(s.acceptance_rate, "{:.1%}") for s in summaries])
    table.add_row(
        "lossless",
        *[("-" if s.lossless is None else "yes" if s.lossless else "NO") for s in summaries],
    )
    if result.speedup is not None:
        sp = result.speedup
        cells = ["-" if n == BASELINE.name else f"{sp.value:.2f}x [{sp.low:.2f}, {sp.high:.2f}]" for n in names]
        table.add_row("speedup vs baseline (95% CI)", *cells)
    return table


def bench_notes(result: BenchReport) -> list[str]:
    """Lines printed under the table: skipped requests, mismatches, untested losslessness, a speculative variant
    that saved no target pass."""
    notes: list[str] = []
    used = result.workload["used_requests"]
    notes.append(f"{used} request(s) x {result.config.repeat} repeat(s), max {result.config.max_tokens} new tokens")
    if result.skipped:
        notes.append(f"skipped {len(result.skipped)} request(s) too long for the target's context")
    if result.seen_by_draft:
        notes.append(
            f"left out {len(result.seen_by_draft)} request(s) the draft was distilled on: a draft is measured only "
            "on traffic it has not seen"
        )
    for m in result.mismatches:
        notes.append(f"output differs from the baseline: request {m['request_id']} at token {m['first_mismatch']}")
    if result.lossless is None and result.config.variant.is_speculative:
        notes.append("lossless: not checked (no greedy request)")
    measured = result.records.get(result.variant)
    if result.config.variant.is_speculative and measured and not saved_a_pass(measured):
        notes.append(f"{result.variant}: {NO_PASS_SAVED}")
    return notes
