"""How well the predictor did on a run: per-variant error and, within each method family, how well it ranked.

Pure functions of `RunResults` (for `benchmarks/predictor_accuracy.py` and tests). An exhaustive run times every
variant, so it checks the predictor on all of them; a predictive run only on the confirmed few. Ranking quality is
Kendall's tau-b (`scipy.stats.kendalltau`, which handles ties: variants that behave identically are predicted
equal) between predicted and measured tokens/s over the variants of one method: 1.0 is the measured order, 0 no
better than chance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runinfra_opt import stats
from runinfra_opt.methods import Variant
from runinfra_opt.results import Interval, RunResults, VariantResult


def _measured_variants(results: RunResults) -> list[VariantResult]:
    return [
        vr
        for vr in results.variants
        if vr.measured is not None and vr.predicted is not None and vr.measured.tokens_per_s > 0
    ]


def prediction_errors(results: RunResults) -> list[dict[str, Any]]:
    """Every variant both predicted and measured: predicted and measured tokens/s and |predicted/measured - 1|;
    for a variant timed beside the baseline, also its paired figure (`paired_tokens_per_s`, `paired_abs_error`)."""
    baseline = results.variant("baseline")
    base_rows = baseline.measured_requests if baseline is not None else []
    rows = []
    for vr in _measured_variants(results):
        assert vr.predicted is not None
        assert vr.measured is not None
        ratio = vr.predicted.tokens_per_s / vr.measured.tokens_per_s
        row: dict[str, Any] = {
            "variant": vr.name,
            "method": Variant.from_dict(vr.variant).method,
            "predicted_tokens_per_s": round(vr.predicted.tokens_per_s, 2),
            "measured_tokens_per_s": round(vr.measured.tokens_per_s, 2),
            "abs_error": round(abs(ratio - 1.0), 4),
        }
        if any(r.trial is not None for r in vr.measured_requests) and base_rows:
            # timed beside the baseline: also against its paired ratio at the baseline's own speed, the speed the
            # predictions are calibrated at (`stats.comparable_tokens_per_s`)
            paired = stats.comparable_tokens_per_s(vr.measured_requests, base_rows)
            row["paired_tokens_per_s"] = round(paired, 2)
            row["paired_abs_error"] = round(abs(vr.predicted.tokens_per_s / paired - 1.0), 4) if paired > 0 else None
        rows.append(row)
    return rows


def level_prediction_errors(results: RunResults) -> list[dict[str, Any]]:
    """Every variant both predicted and measured under load (a serving engine): per level, predicted and
    measured output tokens/s and |predicted/measured - 1| (the prediction after `repredict`: calibrated on the
    baseline's own run at that level)."""
    rows = []
    for vr in results.variants:
        measured = {lr.level: lr.metrics.output_tokens_per_s for lr in vr.load}
        for predicted in vr.load_predicted:
            got, want = predicted.metrics.output_tokens_per_s, measured.get(predicted.level)
            if got is None or want is None or want.value <= 0:
                continue
            rows.append(
                {
                    "variant": vr.name,
                    "level": predicted.level,
                    "predicted_tokens_per_s": round(got.value, 2),
                    "measured_tokens_per_s": round(want.value, 2),
                    "abs_error": round(abs(got.value / want.value - 1.0), 4),
                }
            )
    return rows


def kendall_tau(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Kendall's tau-b between two orders (None with fewer than 2 items or a constant side)."""
    if len(predicted) < 2:
        return None
    from scipy.stats import kendalltau

    tau = float(kendalltau(predicted, measured).statistic)
    return None if math.isnan(tau) else tau


@dataclass(frozen=True)
class FamilyRanking:
    method: str
    variants: int
    tau: float | None
    """Kendall's tau-b of the final predictions (overheads fitted to the confirmation's baseline) vs measured."""
    tau_ranking: float | None
    """The same for the predictions that ranked the candidates before confirmation (None when not recorded)."""
    predicted_best: str
    measured_best: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "variants": self.variants,
            "kendall_tau": None if self.tau is None else round(self.tau, 3),
            "kendall_tau_ranking": None if self.tau_ranking is None else round(self.tau_ranking, 3),
            "predicted_best": self.predicted_best,
            "measured_best": self.measured_best,
        }


def family_rankings(results: RunResults) -> list[FamilyRanking]:
    """Per method (prompt lookup, early exit, each draft model's method), over its variants both predicted and
    measured: the rank correlation between predicted and measured tokens/s, and the best of each."""
    ranking = results.profile.get("ranking_predicted_tokens_per_s", {})
    by_method: dict[str, list[VariantResult]] = {}
    for vr in _measured_variants(results):
        variant = Variant.from_dict(vr.variant)
        if variant.is_speculative:
            by_method.setdefault(variant.method, []).append(vr)
    out = []
    for method, group in sorted(by_method.items()):
        measured = [vr.measured.tokens_per_s for vr in group if vr.measured is not None]
        predicted = [vr.predicted.tokens_per_s for vr in group if vr.predicted is not None]
        ranked = [ranking.get(vr.name) for vr in group]
        tau_ranking = (
            kendall_tau([float(x) for x in ranked if x is not None], measured)
            if all(x is not None for x in ranked)
            else None
        )
        out.append(
            FamilyRanking(
                method=method,
                variants=len(group),
                tau=kendall_tau(predicted, measured),
                tau_ranking=tau_ranking,
                predicted_best=group[max(range(len(group)), key=lambda i: predicted[i])].name,
                measured_best=group[max(range(len(group)), key=lambda i: measured[i])].name,
            )
        )
    return out


def interval_entry(interval: Interval | None) -> dict[str, float] | None:
    if interval is None:
        return None
    return {"value": round(interval.value, 4), "low": round(interval.low, 4), "high": round(interval.high, 4)}


def decision_entry(results: RunResults, wall_s: float) -> dict[str, Any]:
    assert results.decision is not None
    return {
        "winner": results.decision.winner,
        "gain": interval_entry(results.decision.gain),
        "reason": results.decision.reason,
        "certainty": results.certainty.summary if results.certainty else None,
        "added_repeats": len(results.plan.added) if results.plan else 0,
        "remeasured_repeats": list(results.plan.remeasured) if results.plan else [],
        "wall_s": round(wall_s, 1),
        "timings_s": {k: round(v, 1) for k, v in results.timings_s.items()},
        "run_dir": str(Path(results.config.get("run_dir") or "")),
        "notes": [n.text for n in results.notes],
    }


def highest_level(results: RunResults) -> str | None:
    if results.load is None or not results.load.levels:
        return None
    concurrency = [name for name in results.load.levels if name.startswith("concurrency:")]
    return max(concurrency, key=lambda n: int(n.split(":")[1])) if concurrency else results.load.levels[-1]


def launch_order_drift(results: RunResults) -> dict[str, Any] | None:
    """Each launched variant's measured over predicted batch-1 throughput, in the order the servers were launched.
    The predictions rest on the step costs and calibration of the baseline timed at the run's start (each variant's
    speculative terms are fitted on the others, all times mixed), so a trend along the launches is the machine's
    speed changing during the run (or a predictor bias that follows the grid's order: n, then k, rises along it):
    Kendall's tau against the launch index, and the medians of the two halves."""
    order, ratios = [], []
    for launch in results.launches:
        vr = results.variant(str(launch.get("variant")))
        if vr is None or vr.name == "baseline" or vr.measured is None or vr.predicted is None:
            continue
        if vr.measured.tokens_per_s and vr.predicted.tokens_per_s:
            order.append(vr.name)
            ratios.append(vr.measured.tokens_per_s / vr.predicted.tokens_per_s)
    if len(ratios) < 4:
        return None
    half = len(ratios) // 2
    tau = kendall_tau(list(range(len(ratios))), ratios)
    return {
        "launch_order": order,
        "measured_over_predicted": [round(r, 3) for r in ratios],
        "kendall_tau": None if tau is None else round(tau, 3),
        "first_half_median": round(statistics.median(ratios[:half]), 3),
        "second_half_median": round(statistics.median(ratios[half:]), 3),
    }


def paired_tokens_per_s(results: RunResults, name: str) -> float | None:
    """`name`'s batch-1 tokens/s as the decision ranks it: for a variant timed beside the baseline, its paired
    ratio times the baseline's own tokens/s (`stats.comparable_tokens_per_s`); None when it was not paired."""
    vr, base = results.variant(name), results.variant("baseline")
    if vr is None or base is None or not vr.measured_requests:
        return None
    if name == "baseline":
        return stats.tokens_per_s(stats.own_repeats(base.measured_requests))
    if all(r.trial is None for r in vr.measured_requests):
        return None
    return stats.comparable_tokens_per_s(vr.measured_requests, base.measured_requests)


def _spec_overhead(results: RunResults) -> dict[str, Any] | None:
    serving = results.cost_model.serving
    return serving.spec_overhead.model_dump() if serving is not None and serving.spec_overhead else None


def serving_entry(
    predictive: RunResults, exhaustive: RunResults, predictive_s: float, exhaustive_s: float
) -> dict[str, Any]:
    """One workload's accuracy figures for a vLLM predictive run and an exhaustive run of the same requests: each
    run's decision, the confirmed variants' prediction errors at batch 1 and at the highest load level, the
    exhaustive run's errors, rankings and drift, and the predictive winner measured inside the exhaustive run."""
    assert predictive.decision is not None
    assert exhaustive.decision is not None
    highest = highest_level(exhaustive)
    p_levels, e_levels = level_prediction_errors(predictive), level_prediction_errors(exhaustive)
    confirmed = {v.name for v in predictive.variants if v.confirmed and v.name != "baseline"}
    batch1 = [r for r in prediction_errors(predictive) if r["variant"] in confirmed]
    at_highest = [r for r in p_levels if r["variant"] in confirmed and r["level"] == highest]
    p_winner, e_winner = predictive.decision.winner, exhaustive.decision.winner
    inside: dict[str, Any] = {}
    for kind, level in (("batch1", None), ("highest_level", highest)):
        def tps(name: str, level: str | None = level) -> float | None:
            vr = exhaustive.variant(name)
            if vr is None:
                return None
            if level is None:
                return vr.measured.tokens_per_s if vr.measured else None
            found = [lr.metrics.output_tokens_per_s for lr in vr.load if lr.level == level]
            return found[0].value if found and found[0] is not None else None

        mine, best = tps(p_winner), tps(e_winner)
        inside[kind] = {
            "level": level,
            "predictive_winner_tokens_per_s": mine,
            "exhaustive_winner_tokens_per_s": best,
            "ratio": round(mine / best, 4) if mine and best else None,
        }
        if level is None:  # timed beside the baseline: the two picks' paired figures at the baseline's speed
            paired = paired_tokens_per_s(exhaustive, p_winner), paired_tokens_per_s(exhaustive, e_winner)
            if paired[0] and paired[1]:
                inside[kind]["paired_ratio"] = round(paired[0] / paired[1], 4)
    e_all = [r["abs_error"] for r in prediction_errors(exhaustive) if r["variant"] != "baseline"]
    e_high = [r["abs_error"] for r in e_levels if r["level"] == highest and r["variant"] != "baseline"]
    return {
        "highest_level": highest,
        "predictive": {
            **decision_entry(predictive, predictive_s),
            "servers": [launch.get("variant") for launch in predictive.launches],
            "confirmed_batch1_errors": batch1,
            "confirmed_highest_level_errors": at_highest,
            "confirmed_level_errors": [r for r in p_levels if r["variant"] in confirmed],
            "max_batch1_error": max((r["abs_error"] for r in batch1), default=None),
            "max_batch1_paired_error": max(
                (r["paired_abs_error"] for r in batch1 if r.get("paired_abs_error") is not None), default=None
            ),
            "max_highest_level_error": max((r["abs_error"] for r in at_highest), default=None),
            "spec_overhead": _spec_overhead(predictive),
        },
        "exhaustive": {
            **decision_entry(exhaustive, exhaustive_s),
            "servers": len(exhaustive.launches),
            "all_batch1_errors": prediction_errors(exhaustive),
            "all_level_errors": e_levels,
            "batch1_within_10pct": f"{sum(e <= 0.10 for e in e_all)}/{len(e_all)}",
            "highest_level_within_15pct": f"{sum(e <= 0.15 for e in e_high)}/{len(e_high)}",
            "family_rankings": [f.to_dict() for f in family_rankings(exhaustive)],
            "spec_overhead": _spec_overhead(exhaustive),
            "drift": launch_order_drift(exhaustive),
        },
        "same_winner": p_winner == e_winner,
        "predictive_winner_inside_exhaustive": inside,
        "wall_time_ratio": round(predictive_s / exhaustive_s, 3) if exhaustive_s else None,
    }
