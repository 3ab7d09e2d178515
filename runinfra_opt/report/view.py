"""What a report shows, derived from a `RunResults` alone: one row per variant, the decision, the context.

Every renderer (terminal table, markdown, HTML, CSV) builds on these plain values so they agree with each
other. Conventions shared by all of them: tokens/s and speedups come from measured figures when the variant
was timed end to end; a value prefixed with `~` is predicted (by the cost model), not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import Variant, get_method, parse_variant_name
from runinfra_opt.objective import Objective
from runinfra_opt.results import Interval, RunResults, Summary, VariantResult

Status = Literal["winner", "baseline", "confirmed", "predicted only", "ruled out", "disqualified"]
_STATUS_ORDER: dict[str, int] = {
    "winner": 0,
    "baseline": 1,
    "confirmed": 2,
    "predicted only": 3,
    "ruled out": 4,
    "disqualified": 5,
}
PREDICTED_MARK = "~"


@dataclass(frozen=True)
class VariantRow:
    """One variant as a report shows it."""

    name: str
    method: str
    family: str
    """The variant without its lookahead: `ngram (max match 2)`, `draft tiny`, `early exit L8`, `baseline`."""
    lookahead: int
    status: Status
    status_text: str
    """The status in words, with the constraint or the reason where there is one."""
    confirmed: bool
    predicted_tokens_per_s: float | None
    measured_tokens_per_s: float | None
    measured_tokens_per_s_interval: Interval | None
    speedup: Interval | None
    """Measured speedup over the baseline (with its 95% interval), else the predicted one."""
    speedup_measured: bool
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_measured: bool
    acceptance_rate: float | None
    mean_accepted_per_pass: float | None
    lossless: bool | None
    near_ties_only: bool
    """Not lossless only at numerical near-ties (shown as `ties`, not disqualifying)."""
    prediction_error: float | None
    """predicted / measured tokens/s - 1, for variants with both."""
    disqualified: str | None
    ruled_out: tuple[str, ...]


def variant_of(result: VariantResult) -> Variant | None:
    """The Variant a result describes (from its stored dict, else from its name); None when neither parses."""
    try:
        return Variant.from_dict(result.variant) if result.variant else parse_variant_name(result.name)
    except (UserInputError, KeyError, TypeError, ValueError):
        # A report must render whatever a (possibly older) run wrote: fall back to the name, then to nothing.
        try:
            return parse_variant_name(result.name)
        except UserInputError:
            return None


def family_of(result: VariantResult) -> str:
    variant = variant_of(result)
    if variant is None:
        return result.name
    return get_method(variant.method).family(variant)


def _ms(summary: Summary | None, key: str) -> float | None:
    if summary is None or key not in summary.ttft_s:
        return None
    return summary.ttft_s[key] * 1000.0


def variant_row(results: RunResults, result: VariantResult) -> VariantRow:
    winner = results.decision.winner if results.decision else None
    variant = variant_of(result)
    method = variant.method if variant else "unknown"
    status: Status
    if result.name == winner:
        status, status_text = "winner", "winner"
    elif result.disqualified:
        status, status_text = "disqualified", f"disqualified: {result.disqualified}"
    elif result.failed:
        status, status_text = "ruled out", result.failed
    elif result.ruled_out:
        status, status_text = "ruled out", "ruled out: " + "; ".join(result.ruled_out)
    elif method == "baseline":
        status, status_text = "baseline", "baseline"
    elif result.confirmed or result.measured is not None:
        status, status_text = "confirmed", "confirmed"
    else:
        status, status_text = "predicted only", "predicted only"

    measured, predicted = result.measured, result.predicted
    shown = measured or predicted
    speedup: Interval | None = None
    speedup_measured = False
    if measured is not None and measured.speedup is not None:
        speedup, speedup_measured = measured.speedup, True
    elif predicted is not None and predicted.speedup is not None:
        speedup = predicted.speedup
    elif method == "baseline":
        # The baseline's speedup over itself is 1 by definition (runs may leave it unset).
        speedup, speedup_measured = Interval(value=1.0, low=1.0, high=1.0), measured is not None
    error = None
    if measured is not None and predicted is not None and measured.tokens_per_s > 0:
        error = predicted.tokens_per_s / measured.tokens_per_s - 1.0
    lossless = measured.lossless if measured is not None and measured.lossless is not None else None
    if lossless is None and result.disqualified is None and predicted is not None:
        lossless = predicted.lossless
    return VariantRow(
        name=result.name,
        method=method,
        family=family_of(result),
        lookahead=variant.lookahead if variant else 0,
        status=status,
        status_text=status_text,
        confirmed=result.confirmed or measured is not None,
        predicted_tokens_per_s=predicted.tokens_per_s if predicted else None,
        measured_tokens_per_s=measured.tokens_per_s if measured else None,
        measured_tokens_per_s_interval=measured.tokens_per_s_interval if measured else None,
        speedup=speedup,
        speedup_measured=speedup_measured,
        ttft_p50_ms=_ms(shown, "p50"),
        ttft_p95_ms=_ms(shown, "p95"),
        ttft_measured=measured is not None,
        acceptance_rate=shown.acceptance_rate if shown else None,
        mean_accepted_per_pass=shown.mean_accepted_per_pass if shown else None,
        lossless=False if result.disqualified and lossless is None else lossless,
        near_ties_only=bool(measured is not None and measured.near_ties_only and not result.disqualified),
        prediction_error=error,
        disqualified=result.disqualified,
        ruled_out=tuple(result.ruled_out),
    )


def variant_rows(results: RunResults) -> list[VariantRow]:
    """Every variant, winner first, then the baseline, confirmed (fastest first), predicted only, ruled out,
    disqualified."""
    rows = [variant_row(results, v) for v in results.variants]

    def key(row: VariantRow) -> tuple[int, float, str]:
        tps = row.measured_tokens_per_s if row.measured_tokens_per_s is not None else row.predicted_tokens_per_s
        return (_STATUS_ORDER[row.status], -(tps or 0.0), row.name)

    return sorted(rows, key=key)


def percentile_key(results: RunResults) -> str:
    """The TTFT percentile the run decided on (`p95` unless its config says otherwise)."""
    value = str(results.config.get("percentile") or "p95")
    return value if value.startswith("p") else f"p{value}"


def objective_of(results: RunResults) -> Objective:
    """The run's objective as its config stored it, with the priority its decision used; a stored value this
    version does not accept reads as the default objective (a report never fails on it)."""
    data = dict(results.config)
    if results.decision is not None:
        data["priority"] = results.decision.priority
    try:
        return Objective.from_dict(data)
    except UserInputError:
        return Objective()


def headline(results: RunResults) -> str:
    """The decision in one line (the reason, in the run's own words, is `results.decision.reason`)."""
    decision = results.decision
    if decision is None:
        if results.status == "no_feasible":
            return "No feasible variant: not even the baseline satisfies the constraints (see why below)."
        if results.status == "failed":
            return f"No decision: the run failed after phase {results.phase} (see the notes)."
        if results.stopped is not None:
            return f"No decision: {results.stopped.describe(results)}"
        if results.status == "running" and results.owner:
            return (
                f"No decision yet: still running (pid {results.owner.get('pid')} on host {results.owner.get('host')}, "
                f"last phase finished: {results.phase})."
            )
        return f"No decision yet: run status {results.status} (last phase finished: {results.phase})."
    if not decision.speculation:
        return f"Winner: {decision.winner} (no speculation)."
    parts = [f"Winner: {decision.winner}"]
    if decision.gain is not None:
        parts.append(f"{fmt_speedup(decision.gain)} throughput over the baseline")
    text = ", ".join(parts)
    if decision.ttft_change is not None:
        text += f"; TTFT {percentile_key(results)} {fmt_change(decision.ttft_change)}"
    return text + "."


def constraints_line(results: RunResults) -> str:
    """Priority, strategy and constraints as the run's config states them."""
    config = results.config
    parts = []
    priority = (results.decision.priority if results.decision else None) or config.get("priority")
    if priority:
        parts.append(f"priority {objective_of(results).text}")
    if config.get("strategy"):
        parts.append(f"strategy {config['strategy']}")
    labels = {
        "min_speedup": ("min speedup", lambda v: f"{float(v):.2f}x"),
        "max_ttft_ms": ("max TTFT", lambda v: f"{float(v):g} ms"),
        "max_ttft_regression": ("max TTFT regression", lambda v: f"{float(v):.0%}"),
    }
    for key, (label, fmt) in labels.items():
        value = config.get(key)
        if value is not None:
            try:
                parts.append(f"{label} {fmt(value)}")
            except (TypeError, ValueError):
                parts.append(f"{label} {value}")
    return "; ".join(parts)


def short_fingerprint(fingerprint: str) -> str:
    """The first 12 hex digits of a fingerprint, without its `sha256:` style prefix."""
    return fingerprint.rpartition(":")[2][:12]


_ENV_KEYS = ("device", "dtype", "threads", "cpu", "gpu", "python", "torch", "transformers", "runinfra_opt")


def environment_line(results: RunResults) -> str:
    """Run id, time, target, workload and the environment's main scalars, in one line."""
    parts = [f"run {results.run_id}", results.created_at]
    if results.target is not None:
        target = results.target.name
        if results.target.dtype or results.target.device:
            target += " (" + ", ".join(x for x in (results.target.dtype, results.target.device) if x) + ")"
        parts.append(f"target {target}")
    if results.workload is not None:
        w = results.workload
        parts.append(f"workload {w.name} [{short_fingerprint(w.fingerprint)}] {w.used_requests}/{w.requests} requests")
    env = results.environment
    keys = [k for k in _ENV_KEYS if k in env] + sorted(k for k in env if k not in _ENV_KEYS)
    for key in keys:
        value = env[key]
        if isinstance(value, str | int | float | bool) and value != "":
            parts.append(f"{key} {value}")
    return "; ".join(parts)


def subsample_line(results: RunResults) -> str | None:
    if results.workload is not None and results.workload.subsampled:
        return f"Subsampled: {results.workload.subsampled}"
    return None


def queue_rows(results: RunResults) -> list[tuple[str, float | None, float | None, float, float]]:
    """(variant, TTFT p50 ms, TTFT p95 ms, mean wait ms, utilisation) of the simulated FIFO queue."""
    if results.decision is None:
        return []
    rows = []
    for q in results.decision.queue:
        p50 = q.ttft_s.get("p50")
        p95 = q.ttft_s.get("p95")
        rows.append(
            (
                q.variant,
                p50 * 1000 if p50 is not None else None,
                p95 * 1000 if p95 is not None else None,
                q.mean_wait_s * 1000,
                q.utilisation,
            )
        )
    return rows


# Formatting shared by the text renderers ----------------------------------------------------------------


def fmt_num(value: float | None, spec: str = ".1f", *, predicted: bool = False) -> str:
    if value is None:
        return "-"
    return (PREDICTED_MARK if predicted else "") + format(value, spec)


def fmt_speedup(interval: Interval | None, *, predicted: bool = False) -> str:
    if interval is None:
        return "-"
    mark = PREDICTED_MARK if predicted else ""
    if predicted or interval.low == interval.high:
        return f"{mark}{interval.value:.2f}x"
    return f"{interval.value:.2f}x [{interval.low:.2f},{interval.high:.2f}]"


def fmt_change(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def fmt_pct(value: float | None, *, predicted: bool = False) -> str:
    return "-" if value is None else f"{PREDICTED_MARK if predicted else ''}{value:.0%}"


def fmt_ttft(row: VariantRow) -> str:
    if row.ttft_p50_ms is None and row.ttft_p95_ms is None:
        return "-"
    mark = "" if row.ttft_measured else PREDICTED_MARK
    return f"{mark}{fmt_ms(row.ttft_p50_ms)}/{fmt_ms(row.ttft_p95_ms)}"


def fmt_ms(value: float | None) -> str:
    """Milliseconds: whole numbers, with one decimal under 10 ms (tiny models, fast GPUs)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


TIES_TEXT = "ties"
TIES_LEGEND = "lossless ties = identical to the baseline's output but at numerical near-ties (--tie-tolerance)."


def fmt_lossless(value: bool | None, near_ties_only: bool = False) -> str:
    if value is False and near_ties_only:
        return TIES_TEXT
    return "-" if value is None else ("yes" if value else "NO")
