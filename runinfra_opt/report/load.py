"""The per-load section of a run's report (`optimize --engine vllm --load ...`): what each variant measured at
each load level, the winner per level, where speculation stops paying (crossovers) and the k schedule.

Pure functions of `RunResults.load` and the variants' `load` lists. Every renderer (terminal table, markdown,
HTML, CSV, `optimize`'s end-of-run summary) builds on `load_rows`, so they agree. A run without `load` (the
in-process engine, or no `--load`) has no section: every function here returns nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runinfra_opt.report import view
from runinfra_opt.report.markdown import md_escape, md_table
from runinfra_opt.results import Interval, LevelResult, RunResults, VariantResult

TITLE = "Under load (measured on the serving engine)"
LEGEND = (
    "Output tokens/s over each level's measured window (warm-up and drain excluded), with its 95% bootstrap "
    "interval; vs baseline: the variant's tokens/s over the baseline's at the same level, paired, with its 95% "
    "interval; accept: accepted / drafted tokens (the server's counters); differ: greedy outputs that differ "
    "from the baseline's batch-1 output (batching can flip a numerical near-tie)."
)
GOODPUT_LEGEND = "goodput: share of the measured requests that succeeded within every SLO, with its 95% interval."


@dataclass(frozen=True)
class LoadRow:
    """One variant at one load level, as a report shows it."""

    level: str
    description: str
    variant: str
    baseline: bool
    winner: bool
    """The level's decision picked this variant."""
    tokens_per_s: Interval | None
    vs_baseline: Interval | None
    """1.00x for the baseline itself."""
    requests_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tpot_p50_ms: float | None
    goodput: Interval | None
    acceptance_rate: float | None
    mismatched: int | None
    """None: not checked under load (results files from engines that get no token ids under load)."""
    failed: int
    requests: int
    result: LevelResult


def concurrency_of(level: str) -> int | None:
    """N for a `concurrency:N` level, None for the open-loop ones (`replay`, `rate:R`)."""
    model, _, value = level.partition(":")
    return int(value) if model == "concurrency" and value.isdigit() else None


def _is_baseline(result: VariantResult) -> bool:
    variant = view.variant_of(result)
    return variant.method == "baseline" if variant is not None else result.name == "baseline"


def measured_variants(results: RunResults) -> list[VariantResult]:
    """The variants measured under load: the baseline first, then in the order the run lists them."""
    loaded = [v for v in results.variants if v.load]
    return sorted(loaded, key=lambda v: not _is_baseline(v))


def levels(results: RunResults) -> list[str]:
    """The load levels in the run's order, then any level a variant measured that the summary does not list."""
    if results.load is None:
        return []
    ordered = list(results.load.levels)
    for result in results.variants:
        for level in result.load:
            if level.level not in ordered:
                ordered.append(level.level)
    return ordered


def winners(results: RunResults) -> dict[str, str]:
    """Level -> the winner the run decided there."""
    return {d.level: d.winner for d in results.load.decisions} if results.load else {}


def _ms(percentiles: dict[str, float], key: str) -> float | None:
    return percentiles[key] * 1000 if key in percentiles else None


def load_rows(results: RunResults) -> list[LoadRow]:
    """Per level (in order), one row per variant measured there (the baseline first)."""
    if results.load is None:
        return []
    won = winners(results)
    rows = []
    for level in levels(results):
        for result in measured_variants(results):
            measured = next((r for r in result.load if r.level == level), None)
            if measured is None:
                continue
            m = measured.metrics
            baseline = _is_baseline(result)
            ratio = measured.vs_baseline
            if ratio is None and baseline:
                ratio = Interval(value=1.0, low=1.0, high=1.0)  # the baseline against itself, by definition
            rows.append(LoadRow(
                level=level,
                description=m.description,
                variant=result.name,
                baseline=baseline,
                winner=won.get(level) == result.name,
                tokens_per_s=m.output_tokens_per_s,
                vs_baseline=ratio,
                requests_per_s=m.requests_per_s,
                ttft_p50_ms=_ms(m.ttft_s, "p50"),
                ttft_p95_ms=_ms(m.ttft_s, "p95"),
                tpot_p50_ms=_ms(m.tpot_s, "p50"),
                goodput=m.goodput,
                acceptance_rate=measured.acceptance_rate,
                mismatched=measured.mismatched,
                failed=m.failed,
                requests=m.requests,
                result=measured,
            ))
    return rows


def has_goodput(results: RunResults) -> bool:
    """Whether SLOs were given (then every renderer shows goodput)."""
    load = results.load
    if load is None:
        return False
    given = load.slo_ttft_ms is not None or load.slo_tpot_ms is not None
    return given or any(r.goodput is not None for r in load_rows(results))


def slo_text(results: RunResults) -> str | None:
    """`TTFT <= 500 ms, TPOT <= 50 ms`, from the summary or (older files) from the metrics."""
    load = results.load
    if load is None:
        return None
    ttft, tpot = load.slo_ttft_ms, load.slo_tpot_ms
    if ttft is None and tpot is None:
        metrics = next((r.result.metrics for r in load_rows(results)), None)
        if metrics is not None:
            ttft, tpot = metrics.slo_ttft_ms, metrics.slo_tpot_ms
    parts = [f"{name} <= {value:g} ms" for name, value in (("TTFT", ttft), ("TPOT", tpot)) if value is not None]
    return ", ".join(parts) or None


# Cells and lines shared by the text renderers ----------------------------------------------------------------


def fmt_interval(interval: Interval | None) -> str:
    """`34.7 [33.5,35.9]`; whole numbers from 100 (`160 [156,165]`); the point alone when the interval is
    degenerate."""
    if interval is None:
        return "-"
    spec = ".1f" if abs(interval.value) < 100 else ".0f"
    if interval.low == interval.high:
        return format(interval.value, spec)
    return f"{interval.value:{spec}} [{interval.low:{spec}},{interval.high:{spec}}]"


def fmt_share(interval: Interval | None) -> str:
    """`92% [85,97]`."""
    if interval is None:
        return "-"
    if interval.low == interval.high:
        return f"{interval.value:.0%}"
    return f"{interval.value:.0%} [{interval.low * 100:.0f},{interval.high * 100:.0f}]"


COLUMNS = ("level", "variant", "out tok/s [95% CI]", "vs baseline [95% CI]", "TTFT p50/p95 ms", "TPOT p50 ms",
           "goodput [95% CI]", "accept", "status")
TERMINAL_HEADERS = ("level", "variant", "out tok/s\n[95% CI]", "vs baseline\n[95% CI]", "TTFT ms\np50/p95",
                    "TPOT\np50 ms", "goodput\n[95% CI]", "accept", "status")
NUMERIC = frozenset(COLUMNS[2:-1])
DECISION_COLUMNS = ("level", "winner", "ranked on", "gain [95% CI]", "why")


def columns(results: RunResults, headers: tuple[str, ...] = COLUMNS) -> list[str]:
    """The section's columns; goodput only when SLOs were given."""
    goodput = has_goodput(results)
    return [c for i, c in enumerate(headers) if goodput or i != 6]


def status(row: LoadRow) -> str:
    parts = ["winner" if row.winner else ("baseline" if row.baseline else "")]
    if row.failed:
        parts.append(f"{row.failed} failed")
    if row.mismatched:
        parts.append(f"{row.mismatched} differ")
    return "; ".join(p for p in parts if p)


def row_cells(row: LoadRow, *, goodput: bool) -> list[str]:
    ttft = "-" if row.ttft_p50_ms is None and row.ttft_p95_ms is None else (
        f"{view.fmt_ms(row.ttft_p50_ms)}/{view.fmt_ms(row.ttft_p95_ms)}")
    cells = [
        row.level,
        row.variant,
        fmt_interval(row.tokens_per_s),
        view.fmt_speedup(row.vs_baseline),
        ttft,
        view.fmt_ms(row.tpot_p50_ms),
        fmt_share(row.goodput),
        view.fmt_pct(row.acceptance_rate),
        status(row),
    ]
    if not goodput:
        del cells[6]
    return cells


def table_cells(results: RunResults) -> list[list[str]]:
    goodput = has_goodput(results)
    return [row_cells(row, goodput=goodput) for row in load_rows(results)]


def decision_cells(results: RunResults) -> list[list[str]]:
    if results.load is None:
        return []
    return [[d.level, d.winner, d.figure, view.fmt_speedup(d.gain), d.reason] for d in results.load.decisions]


def intro_line(results: RunResults) -> str | None:
    """`Load: replay+concurrency:1,4,16, 48 requests per level; replay time x0.5; SLOs ...; the manifest ...`."""
    load = results.load
    if load is None:
        return None
    parts = [f"Load: {load.spec}" + (f", {load.requests_per_level} requests per level" if load.requests_per_level
                                     else "")]
    if load.time_scale != 1 and any(level == "replay" for level in load.levels):
        parts.append(f"replay time x{load.time_scale:g}")
    if load.burstiness != 1 and any(level.startswith("rate:") for level in load.levels):
        parts.append(f"rate burstiness {load.burstiness:g}")
    slos = slo_text(results)
    parts.append(f"SLOs: {slos}" if slos else "no SLO given (no goodput)")
    if load.deploy_level:
        parts.append(f"the manifest carries the winner at {load.deploy_level}")
    return "; ".join(parts) + "."


def crossover_lines(results: RunResults) -> list[str]:
    return [c.text for c in results.load.crossovers] if results.load else []


def schedule_line(results: RunResults) -> str | None:
    """The k schedule: written (and what it is), or why not."""
    load = results.load
    if load is None:
        return None
    schedule = load.schedule
    if schedule is None:
        return "k schedule: none built in this run."
    ranges = ", ".join(f"batch {first}-{last}: k={k}" for first, last, k in schedule.schedule)
    if schedule.written:
        why = f": {schedule.reason}" if schedule.reason else "."
        return f"k schedule: written to the manifest ({ranges}; measured as {schedule.variant}){why}"
    if not ranges:
        return f"k schedule: none: {schedule.reason}" if schedule.reason else "k schedule: none built in this run."
    why = (schedule.reason or "").removeprefix("not written: ")
    why = why or ("not measured at every level it covers" if not schedule.verified else "")
    return f"k schedule ({ranges}): not written" + (f": {why}" if why else ".")


def note_lines(results: RunResults) -> list[str]:
    """What the levels' metrics say about themselves (client lateness, short windows), once each, then the
    variants whose greedy outputs differed under load."""
    rows = load_rows(results)
    noted: dict[str, list[str]] = {}
    for row in rows:
        for note in row.result.metrics.notes:
            names = noted.setdefault(note, [])
            if row.variant not in names:
                names.append(row.variant)
    lines = [f"{', '.join(names)}: {note}" for note, names in noted.items()]
    unchecked = [row for row in rows if row.mismatched is None and not row.baseline]
    if unchecked:
        lines.append(f"greedy outputs under load were not compared with the baseline's at {len(unchecked)} of "
                     f"{sum(not r.baseline for r in rows)} variant x level measurements (losslessness is judged at "
                     "batch 1)")
    for row in rows:
        if row.mismatched:
            lines.append(f"{row.variant} at {row.level}: {row.mismatched} greedy output(s) differ from the "
                         "baseline's batch-1 output (losslessness is judged at batch 1)")
    return lines


def summary_lines(results: RunResults) -> list[str]:
    """`optimize`'s end-of-run lines: the winner per level with its gain, the crossovers, the k schedule."""
    load = results.load
    if load is None:
        return []
    parts = []
    for d in load.decisions:
        gain = f" {view.fmt_speedup(d.gain)}" if d.gain is not None and not _baseline_name(results, d.winner) else ""
        parts.append(f"{d.level} {d.winner}{gain}")
    lines = ["Under load, winner per level (output tokens/s vs the baseline's): " + "; ".join(parts)] if parts else []
    lines += [f"Crossover: {text}" for text in crossover_lines(results)]
    lines += [f"More passes: {text}" for text in load.passes if text not in load.budget_ran_out]
    lines += [f"--budget-minutes ran out before a level was clear: {text}" for text in load.budget_ran_out]
    schedule = schedule_line(results)
    if schedule:
        lines.append(schedule[0].upper() + schedule[1:])
    return lines


def _baseline_name(results: RunResults, name: str) -> bool:
    result = results.variant(name)
    return _is_baseline(result) if result is not None else name == "baseline"


# Renderers ------------------------------------------------------------------------------------------------------


def render_section(results: RunResults, console: Console) -> None:
    """The per-load section on a rich console (nothing for a run without load)."""
    if results.load is None:
        return
    console.print(Text(TITLE, style="bold"))
    intro = intro_line(results)
    if intro:
        console.print(Text(intro))
    rows = load_rows(results)
    if not rows:
        console.print(Text("No variant has load results yet."))
    headers, plain = columns(results, TERMINAL_HEADERS)[1:], columns(results)[1:]
    cells = table_cells(results)
    widths = [max((len(line[i]) for line in cells), default=0) for i in range(len(plain) + 1)][1:]
    for level in dict.fromkeys(r.level for r in rows):
        # One table per level (the level as its title): the figures and their intervals fit 100 columns.
        members = [(row, line[1:]) for row, line in zip(rows, cells, strict=True) if row.level == level]
        table = Table(title=f"{level}: {members[0][0].description}", title_justify="left", box=box.SIMPLE_HEAD,
                      padding=0, pad_edge=False, show_edge=False)
        for header, name, width in zip(headers, plain, widths, strict=True):
            if name == "variant":
                table.add_column(header, overflow="fold", min_width=min(width, 24))
            else:  # the same widths in every level's table, so that the columns line up
                table.add_column(header, justify="right" if name in NUMERIC else "left", no_wrap=name in NUMERIC,
                                 min_width=width)
        for row, line in members:
            table.add_row(*line, style="bold green" if row.winner else None)
        console.print(table)
    if rows:
        console.print(Text(LEGEND + (" " + GOODPUT_LEGEND if has_goodput(results) else ""), style="dim"))
    if results.load.decisions:
        console.print(Text("Winner per load level", style="bold"))
    for d in results.load.decisions:
        shown = d.gain is not None and not _baseline_name(results, d.winner)
        gain = f", {view.fmt_speedup(d.gain)} the baseline's tokens/s" if shown else ""
        console.print(Text(f"- {d.level}: {d.winner} (ranked on {d.figure}{gain}): {d.reason}"))
    for text in crossover_lines(results):
        console.print(Text(f"Crossover: {text}"))
    schedule = schedule_line(results)
    if schedule:
        console.print(Text(schedule[0].upper() + schedule[1:]))
    for note in note_lines(results):
        console.print(Text(f"Note: {note}"))


def markdown_section(results: RunResults) -> list[str]:
    """The per-load section as markdown lines (none for a run without load)."""
    if results.load is None:
        return []
    out = [f"### {TITLE}", ""]
    intro = intro_line(results)
    if intro:
        out += [md_escape(intro), ""]
    cells = table_cells(results)
    for line, row in zip(cells, load_rows(results), strict=True):
        if row.winner:
            line[1] = f"**{line[1]}**"
    if cells:
        out += md_table(columns(results), cells, NUMERIC)
        out += ["", f"_{LEGEND}" + (f" {GOODPUT_LEGEND}" if has_goodput(results) else "") + "_", ""]
    else:
        out += ["No variant has load results yet.", ""]
    decisions = decision_cells(results)
    if decisions:
        out += ["#### Winner per load level", ""]
        out += md_table(DECISION_COLUMNS, decisions, frozenset({"gain [95% CI]"})) + [""]
    lines = [f"Crossover: {text}" for text in crossover_lines(results)]
    schedule = schedule_line(results)
    if schedule:
        lines.append(schedule[0].upper() + schedule[1:])
    lines += [f"Note: {note}" for note in note_lines(results)]
    if lines:
        out += [f"- {md_escape(line)}" for line in lines] + [""]
    return out


# CSV --------------------------------------------------------------------------------------------------------


def _percentile_columns(prefix: str, values: dict[str, float] | None, keys: tuple[str, ...]) -> dict[str, Any]:
    return {f"{prefix}_{k}_ms": (values[k] * 1000 if values and k in values else None) for k in keys}


def _interval_columns(prefix: str, interval: Interval | None) -> dict[str, Any]:
    return {
        prefix: interval.value if interval else None,
        f"{prefix}_low": interval.low if interval else None,
        f"{prefix}_high": interval.high if interval else None,
    }


_ALL = ("p50", "p90", "p95", "p99")


def _load_record(row: LoadRow | None) -> dict[str, Any]:
    r = row.result if row else None
    m = r.metrics if r else None
    record: dict[str, Any] = {
        "level": row.level if row else None,
        "concurrency": concurrency_of(row.level) if row else None,
        "level_description": row.description if row else None,
        "variant": row.variant if row else None,
        "is_winner": row.winner if row else None,
    }
    record.update(_interval_columns("output_tokens_per_s", m.output_tokens_per_s if m else None))
    record.update(_interval_columns("vs_baseline", row.vs_baseline if row else None))
    record["requests_per_s"] = m.requests_per_s if m else None
    record.update(_percentile_columns("ttft", m.ttft_s if m else None, _ALL))
    record.update(_percentile_columns("tpot", m.tpot_s if m else None, _ALL))
    record.update(_percentile_columns("itl", m.itl_s if m else None, ("p50", "p99")))
    record.update(_percentile_columns("e2e", m.e2e_s if m else None, ("p50", "p95")))
    record.update(_interval_columns("goodput", m.goodput if m else None))
    record.update({
        "goodput_requests_per_s": m.goodput_requests_per_s if m else None,
        "slo_ttft_ms": m.slo_ttft_ms if m else None,
        "slo_tpot_ms": m.slo_tpot_ms if m else None,
        "drafted_tokens": r.drafted_tokens if r else None,
        "accepted_tokens": r.accepted_tokens if r else None,
        "acceptance_rate": r.acceptance_rate if r else None,
        "mismatched": r.mismatched if r else None,
        "runs": m.runs if m else None,
        "requests": m.requests if m else None,
        "succeeded": m.succeeded if m else None,
        "failed": m.failed if m else None,
    })
    record.update(_percentile_columns("send_lag", m.send_lag_s if m else None, ("p50", "p99")))
    record.update({
        "late_requests": m.late_requests if m else None,
        "peak_in_flight": m.peak_in_flight if m else None,
        "records": r.records if r else None,
    })
    return record


LOAD_CSV_COLUMNS = list(_load_record(None))
_INTEGER_COLUMNS = ("concurrency", "drafted_tokens", "accepted_tokens", "mismatched", "runs", "requests",
                    "succeeded", "failed", "late_requests", "peak_in_flight")


def load_frame(results: RunResults) -> Any:
    """One row per variant x load level (levels in the run's order, the baseline first within each); empty (the
    header only) for a run without load."""
    import pandas as pd

    frame = pd.DataFrame.from_records([_load_record(row) for row in load_rows(results)], columns=LOAD_CSV_COLUMNS)
    return frame.astype(dict.fromkeys(_INTEGER_COLUMNS, "Int64") | {"is_winner": "boolean"})
