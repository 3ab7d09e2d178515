"""How well the predictor did on a run: per-variant error and, within each method family, how well it ranked.

Pure functions of `RunResults` (for `benchmarks/predictor_accuracy.py` and tests). An exhaustive run times every
variant, so it checks the predictor on all of them; a predictive run only on the confirmed few. Ranking quality is
Kendall's tau-b (`scipy.stats.kendalltau`, which handles ties: variants that behave identically are predicted
equal) between predicted and measured tokens/s over the variants of one method: 1.0 is the measured order, 0 no
better than chance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runinfra_opt import stats
from runinfra_opt.methods import Variant
from runinfra_opt.results import RunResults, VariantResult


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
