"""Comparing two runs: what changed, per-variant changes beyond noise, and the CI regression gate.

Rules (documented in docs/report.md):
- Runs with different results schema versions are not compared (UserInputError, exit 2).
- Runs on different workloads (different fingerprints) are not compared unless the caller allows it:
  throughput on other traffic says nothing about a regression.
- A different model, device or software version is what a comparison is for: it is shown, not refused.
- "Beyond noise" means the two 95% intervals do not overlap. Where a figure has no interval (TTFT
  percentiles, or a run without intervals), the point estimates are compared and the output says so.
- The gate fails (exit 4) when the new run's chosen configuration is worse than the old run's chosen
  configuration, or the old winner is worse in the new run than in the old, beyond noise and by more than
  `max_regression` (a fraction). "Worse" follows the new run's priority: lower tokens/s for throughput, higher
  TTFT at the run's percentile for ttft.
- Runs measured under load (`--load`) are also compared per load level (report/load_compare.py); shown, not gated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runinfra_opt.errors import UserInputError
from runinfra_opt.report import load_compare, view
from runinfra_opt.report.load_compare import LoadComparison
from runinfra_opt.report.text import md_table
from runinfra_opt.results import Interval, RunResults, Summary


@dataclass(frozen=True)
class ContextChange:
    """One piece of context (workload, model, device, winner, ...) in both runs."""

    field: str
    old: str
    new: str

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass(frozen=True)
class VariantDelta:
    """A variant measured in both runs."""

    name: str
    old_tokens_per_s: float
    new_tokens_per_s: float
    throughput_change: float
    """new / old - 1."""
    beyond_noise: bool | None
    """The two tokens/s 95% intervals do not overlap (None: an interval is missing)."""
    old_ttft_p50_ms: float | None
    new_ttft_p50_ms: float | None
    old_ttft_p95_ms: float | None
    new_ttft_p95_ms: float | None
    ttft_p95_change: float | None


@dataclass(frozen=True)
class GateCheck:
    """One regression check of the gate."""

    check: str
    """`chosen configuration` or `old winner`."""
    old_variant: str
    new_variant: str
    metric: str
    old_value: float
    new_value: float
    regression: float
    """How much worse the new value is, as a fraction (negative: better)."""
    beyond_noise: bool | None
    failed: bool
    detail: str


@dataclass(frozen=True)
class Comparison:
    old_label: str
    new_label: str
    old_run: str
    new_run: str
    max_regression: float
    context: list[ContextChange]
    variants: list[VariantDelta]
    only_old: list[str]
    only_new: list[str]
    checks: list[GateCheck]
    warnings: list[str] = field(default_factory=list)
    load: LoadComparison | None = None
    """Per load level, when both runs were measured under load."""

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.checks)

    @property
    def failures(self) -> list[str]:
        return [c.detail for c in self.checks if c.failed]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["failed"] = self.failed
        for item, change in zip(data["context"], self.context, strict=True):
            item["changed"] = change.changed
        if self.load is not None:
            for item, winners in zip(data["load"]["winners"], self.load.winners, strict=True):
                item["changed"] = winners.changed
        return data


def _overlap(a: Interval | None, b: Interval | None) -> bool | None:
    if a is None or b is None:
        return None
    return a.low <= b.high and b.low <= a.high


def _ms(summary: Summary, key: str) -> float | None:
    return summary.ttft_s[key] * 1000 if key in summary.ttft_s else None


def _device(results: RunResults) -> str:
    return str((results.target.device if results.target else None) or results.environment.get("device") or "?")


def _context(old: RunResults, new: RunResults) -> list[ContextChange]:
    def pick(results: RunResults) -> dict[str, str]:
        w, t, d = results.workload, results.target, results.decision
        return {
            "workload": w.name if w else "?",
            "workload fingerprint": view.short_fingerprint(w.fingerprint) if w else "?",
            "requests used": str(w.used_requests) if w else "?",
            "target model": t.name if t else "?",
            "target file": (t.file_sha256 or "?")[:12] if t else "?",
            "dtype": str((t.dtype if t else None) or results.environment.get("dtype") or "?"),
            "device": _device(results),
            "priority": d.priority if d else str(results.config.get("priority", "?")),
            "winner": d.winner if d else "(no decision)",
            "gain": view.fmt_speedup(d.gain) if d and d.gain else "-",
            "runinfra-opt": results.tool_version or "?",
            "torch": str(results.environment.get("torch", "?")),
            "transformers": str(results.environment.get("transformers", "?")),
        }

    a, b = pick(old), pick(new)
    return [ContextChange(key, a[key], b[key]) for key in a]


def _metric(results: RunResults) -> tuple[str, bool]:
    """(metric, higher is better) for the run's priority."""
    objective = view.objective_of(results)
    if objective.measure.higher_is_better:
        return "tokens/s", True
    return f"TTFT {objective.percentile}", False


def _value(summary: Summary, metric: str) -> tuple[float, Interval | None]:
    if metric == "tokens/s":
        return summary.tokens_per_s, summary.tokens_per_s_interval
    key = metric.split()[-1]
    if key not in summary.ttft_s:
        raise KeyError(key)
    return summary.ttft_s[key] * 1000, None


def _check(
    check: str, metric: str, higher_better: bool, old_name: str, old: Summary, new_name: str, new: Summary,
    max_regression: float,
) -> GateCheck:
    old_value, old_iv = _value(old, metric)
    new_value, new_iv = _value(new, metric)
    if old_value <= 0:
        regression = 0.0
    elif higher_better:
        regression = 1 - new_value / old_value
    else:
        regression = new_value / old_value - 1
    overlap = _overlap(old_iv, new_iv)
    beyond_noise = None if overlap is None else not overlap
    failed = regression > max_regression and beyond_noise is not False
    unit = "tok/s" if metric == "tokens/s" else "ms"
    names = old_name if old_name == new_name else f"{old_name} -> {new_name}"
    worse = "slower" if higher_better else "higher"
    direction = f"{regression:.1%} {worse}" if regression > 0 else f"{-regression:.1%} better"
    noise = {True: "beyond noise", False: "within noise (95% intervals overlap)",
             None: "no interval: point estimates compared"}[beyond_noise]
    verdict = f"more than the allowed {max_regression:.1%}" if failed else "ok"
    detail = (f"{check} {names}: {metric} {old_value:.1f} -> {new_value:.1f} {unit}, {direction}, "
              f"{noise}; {verdict}")
    return GateCheck(check, old_name, new_name, metric, old_value, new_value, regression, beyond_noise, failed,
                     detail)


def compare(
    old: RunResults,
    new: RunResults,
    *,
    max_regression: float = 0.05,
    old_label: str = "OLD",
    new_label: str = "NEW",
    allow_workload_change: bool = False,
) -> Comparison:
    """Compare two runs and evaluate the regression gate. Incompatible runs raise UserInputError naming which."""
    if max_regression < 0:
        raise UserInputError(f"--max-regression must be >= 0 (a fraction, e.g. 0.05), got {max_regression}")
    if old.schema_version != new.schema_version:
        raise UserInputError(
            f"{old_label} has results schema version {old.schema_version} and {new_label} has "
            f"{new.schema_version}: re-run one of them with the same runinfra-opt version to compare"
        )
    for label, results in ((old_label, old), (new_label, new)):
        if results.decision is None:
            raise UserInputError(
                f"{label}: run {results.run_id} has no decision (status {results.status}, last phase finished: "
                f"{results.phase}); only finished runs can be compared"
            )
    assert old.decision is not None
    assert new.decision is not None
    warnings = []
    if old.workload and new.workload and old.workload.fingerprint != new.workload.fingerprint:
        message = (
            f"the runs used different workloads ({old_label} {old.workload.name} "
            f"[{view.short_fingerprint(old.workload.fingerprint)}], {new_label} {new.workload.name} "
            f"[{view.short_fingerprint(new.workload.fingerprint)}]): their throughput is not comparable"
        )
        if not allow_workload_change:
            raise UserInputError(message + "; pass --allow-workload-change to compare anyway")
        warnings.append(message)

    deltas = []
    old_measured = {v.name: v.measured for v in old.variants if v.measured is not None}
    new_measured = {v.name: v.measured for v in new.variants if v.measured is not None}
    for row in view.variant_rows(new):
        name = row.name
        if name not in old_measured or name not in new_measured:
            continue
        a, b = old_measured[name], new_measured[name]
        assert a is not None
        assert b is not None
        overlap = _overlap(a.tokens_per_s_interval, b.tokens_per_s_interval)
        old_p95, new_p95 = _ms(a, "p95"), _ms(b, "p95")
        deltas.append(VariantDelta(
            name=name,
            old_tokens_per_s=a.tokens_per_s,
            new_tokens_per_s=b.tokens_per_s,
            throughput_change=b.tokens_per_s / a.tokens_per_s - 1 if a.tokens_per_s else 0.0,
            beyond_noise=None if overlap is None else not overlap,
            old_ttft_p50_ms=_ms(a, "p50"),
            new_ttft_p50_ms=_ms(b, "p50"),
            old_ttft_p95_ms=old_p95,
            new_ttft_p95_ms=new_p95,
            ttft_p95_change=new_p95 / old_p95 - 1 if old_p95 and new_p95 is not None else None,
        ))

    metric, higher_better = _metric(new)
    checks = []
    old_winner, new_winner = old.decision.winner, new.decision.winner
    old_chosen, new_chosen = old_measured.get(old_winner), new_measured.get(new_winner)
    for label, name, summary in ((old_label, old_winner, old_chosen), (new_label, new_winner, new_chosen)):
        if summary is None:
            raise UserInputError(f"{label}: the winner {name} has no measured figures; cannot compare")
    assert old_chosen is not None
    assert new_chosen is not None
    try:
        checks.append(_check("chosen configuration", metric, higher_better, old_winner, old_chosen, new_winner,
                             new_chosen, max_regression))
        if old_winner != new_winner:
            again = new_measured.get(old_winner)
            if again is None:
                warnings.append(f"the old winner {old_winner} was not timed in the {new_label} run: its own "
                                "regression cannot be checked")
            else:
                checks.append(_check("old winner", metric, higher_better, old_winner, old_chosen, old_winner,
                                     again, max_regression))
    except KeyError as exc:
        raise UserInputError(f"a winner has no TTFT {exc.args[0]} figure; cannot compare on {metric}") from None
    if one_sided := load_compare.one_sided(old, new, old_label, new_label):
        warnings.append(one_sided)

    return Comparison(
        old_label=old_label,
        new_label=new_label,
        old_run=old.run_id,
        new_run=new.run_id,
        max_regression=max_regression,
        context=_context(old, new),
        variants=deltas,
        only_old=sorted(set(old_measured) - set(new_measured)),
        only_new=sorted(set(new_measured) - set(old_measured)),
        checks=checks,
        warnings=warnings,
        load=load_compare.compare_load(old, new),
    )


# Rendering -------------------------------------------------------------------------------------------------

CONTEXT_COLUMNS = ("", "old", "new", "changed")
DELTA_COLUMNS = ("variant", "old tok/s", "new tok/s", "change", "beyond noise", "old TTFT p50/p95 ms",
                 "new TTFT p50/p95 ms", "TTFT p95 change")
_DELTA_NUMERIC = frozenset(DELTA_COLUMNS[1:])
_DELTA_TERMINAL = ("variant", "old\ntok/s", "new\ntok/s", "change", "beyond\nnoise", "old TTFT\np50/p95 ms",
                   "new TTFT\np50/p95 ms", "TTFT p95\nchange")


def _noise(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "n/a"}[value]


def _ttft(p50: float | None, p95: float | None) -> str:
    return f"{view.fmt_ms(p50)}/{view.fmt_ms(p95)}"


def _delta_cells(comparison: Comparison) -> list[list[str]]:
    return [
        [d.name, f"{d.old_tokens_per_s:.1f}", f"{d.new_tokens_per_s:.1f}", view.fmt_change(d.throughput_change),
         _noise(d.beyond_noise), _ttft(d.old_ttft_p50_ms, d.old_ttft_p95_ms),
         _ttft(d.new_ttft_p50_ms, d.new_ttft_p95_ms), view.fmt_change(d.ttft_p95_change)]
        for d in comparison.variants
    ]


def _context_cells(comparison: Comparison) -> list[list[str]]:
    return [[c.field, c.old, c.new, "CHANGED" if c.changed else ""] for c in comparison.context]


def compare_verdict(comparison: Comparison) -> str:
    if comparison.failed:
        return f"Gate FAILED (max regression {comparison.max_regression:.1%}): " + "; ".join(comparison.failures)
    return f"Gate passed (max regression {comparison.max_regression:.1%})."


def _tail_lines(comparison: Comparison) -> list[str]:
    lines = [f"Check: {c.detail}" for c in comparison.checks]
    if comparison.only_old:
        lines.append(f"Measured only in {comparison.old_label}: {', '.join(comparison.only_old)}")
    if comparison.only_new:
        lines.append(f"Measured only in {comparison.new_label}: {', '.join(comparison.only_new)}")
    lines += [f"Warning: {w}" for w in comparison.warnings]
    return lines


def render_comparison_table(comparison: Comparison, console: Console) -> None:
    console.print(Text(f"runinfra-opt compare: {comparison.old_label} run {comparison.old_run} -> "
                       f"{comparison.new_label} run {comparison.new_run}", style="bold"))
    console.print(Text(compare_verdict(comparison), style="bold red" if comparison.failed else "bold green"))
    for title, columns, cells in (("What changed", CONTEXT_COLUMNS, _context_cells(comparison)),
                                  ("Variants measured in both runs", _DELTA_TERMINAL, _delta_cells(comparison))):
        if not cells:
            continue
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for i, column in enumerate(columns):
            if i == 0:
                table.add_column(column, overflow="fold", min_width=12)
            else:
                table.add_column(column, justify="left" if column in ("changed", "old", "new") else "right")
        for row in cells:
            table.add_row(*row, style="bold" if row[-1] == "CHANGED" else None)
        console.print(table)
    if comparison.load is not None:
        load_compare.render_table(comparison.load, console, comparison.old_label, comparison.new_label)
    for line in _tail_lines(comparison):
        console.print(Text(line))


def render_comparison_markdown(comparison: Comparison) -> str:
    icon = "FAILED" if comparison.failed else "passed"
    out = [f"## runinfra-opt compare: gate {icon}", "",
           f"{comparison.old_label} run `{comparison.old_run}` -> {comparison.new_label} run `{comparison.new_run}`",
           "", compare_verdict(comparison), "", "### What changed", ""]
    out += md_table(CONTEXT_COLUMNS, _context_cells(comparison), frozenset()) + [""]
    if comparison.variants:
        out += ["### Variants measured in both runs", ""]
        out += md_table(DELTA_COLUMNS, _delta_cells(comparison), _DELTA_NUMERIC)
        out += ["", "_Beyond noise: the two runs' 95% intervals of tokens/s do not overlap._", ""]
    if comparison.load is not None:
        out += load_compare.render_markdown(comparison.load, comparison.old_label, comparison.new_label)
    out += [f"- {line}" for line in _tail_lines(comparison)] + [""]
    return "\n".join(out)
