"""The lines under `optimize`'s end-of-run table (report/summary.py) that answer what a first run asks:
which variant is best for each category, where the draft models stand against the other methods (n-gram
prompt lookup, early exit), and where the run's time went. Pure functions of the results (None when the run
has nothing to say on a point)."""

from __future__ import annotations

from runinfra_opt.engine.protocol import DRAFT_ALONE
from runinfra_opt.methods import get_method, method_names
from runinfra_opt.report import view
from runinfra_opt.results import RunResults

TIMED_PHASES = ("setup", "cost", "baseline", "profile", "predict", "confirm", "decide")
"""The phases `optimize` times (results.timings_s), in the order they run."""


def category_line(results: RunResults) -> str | None:
    """`Best per category (measured): chat baseline (8 req), code ngram-n3-k8 1.62x (8 req), ...`."""
    if results.decision is None or not results.decision.per_category:
        return None
    parts = []
    for c in results.decision.per_category:
        gain = "" if c.best == "baseline" or c.speedup is None else f" {c.speedup:.2f}x"
        parts.append(f"{c.category} {c.best}{gain} ({c.requests} req)")
    return "Best per category (measured, point estimates): " + ", ".join(parts)


def _best(rows: list[view.VariantRow]) -> view.VariantRow | None:
    """The best row: a measured speedup before a predicted one, then the higher speedup."""
    rows = [r for r in rows if r.speedup is not None]
    if not rows:
        return None
    return max(rows, key=lambda r: (r.speedup_measured, r.speedup.value if r.speedup else 0.0))


def _describe(row: view.VariantRow) -> str:
    how = "measured" if row.speedup_measured else "predicted"
    accept = "" if row.acceptance_rate is None else f", {row.acceptance_rate:.0%} of drafted tokens accepted"
    return f"{row.name} {how} {view.fmt_speedup(row.speedup)}{accept}"


def _kind(row: view.VariantRow) -> str | None:
    """`draft` for a method that drafts with a draft model, the method's name for the other speculative
    methods, None for the baseline (or a method this version does not know)."""
    if row.method not in method_names() or not get_method(row.method).speculative:
        return None
    return "draft" if get_method(row.method).needs_draft_model else row.method


def drafts_line(results: RunResults) -> str | None:
    """`Drafts vs other methods: best draft X predicted 0.55x, ...; best ngram Y measured 1.40x [...]; best
    early_exit Z ...`; None when the run had no draft model."""
    rows = [view.variant_row(results, v) for v in results.variants if not v.disqualified]
    draft = _best([r for r in rows if _kind(r) == "draft"])
    if draft is None:
        return None
    text = f"Drafts vs other methods: best draft {_describe(draft)}"
    for kind in sorted({k for r in rows if (k := _kind(r)) not in {None, "draft"}}, key=lambda m: get_method(m).rank):
        best = _best([r for r in rows if _kind(r) == kind])
        if best is not None:
            text += f"; best {kind} {_describe(best)}"
    return text


def timings_line(results: RunResults) -> str | None:
    """`Time: setup 9 s, cost 41 s, ..., total 6.9 min` from results.timings_s."""
    timings = results.timings_s
    phases = [p for p in TIMED_PHASES if p in timings] + sorted(
        p for p in timings if p not in TIMED_PHASES and p != "total"
    )
    if not phases:
        return None
    parts = [f"{p} {timings[p]:.0f} s" for p in phases]
    total = timings.get("total", sum(timings[p] for p in phases))
    return f"Time: {', '.join(parts)}; total {total / 60:.1f} min"


def launches_line(results: RunResults) -> str | None:
    """How many servers a serving-engine run launched and what for, against the variants it decided among."""
    launches = results.launches
    if not launches:
        return None
    names = [str(launch.get("variant", "")) for launch in launches]
    schedules = sum(1 for name in names if "-sched_" in name)
    drafts = sum(1 for name in names if name.startswith(f"{DRAFT_ALONE}:"))
    candidates = sum(1 for name in names if name != "baseline") - schedules - drafts
    predicted = sum(1 for v in results.variants if v.predicted is not None and v.name != "baseline")
    parts = [f"{names.count('baseline')} baseline", f"{candidates} candidate(s)"]
    if schedules:
        parts.append(f"{schedules} k schedule")
    if drafts:
        parts.append(f"{drafts} draft alone")
    of = f"; {predicted} speculative variant(s) predicted from the baseline's server" if predicted else ""
    plan = results.plan
    if plan is not None and plan.confirm_slots is not None and plan.confirm_stopped:
        used = [n for n in plan.confirm or [] if (vr := results.variant(n)) and vr.predicted and n != "baseline"]
        of += f"; {plan.confirm_slots - len(used)} candidate slot(s) left unused: no other variant was in reach"
    return f"Servers: {len(launches)} launched ({', '.join(parts)}) for {len(results.variants)} variants{of}."
