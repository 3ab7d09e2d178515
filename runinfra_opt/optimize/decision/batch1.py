"""The batch-1 scope: the winner among the variants measured one request at a time, and the per-category view.

Pure functions over `RunResults` and the run's `Objective`; the rule itself (ranking, ties, paying) is
`decision.rule`'s, the eligibility `decision.eligibility`'s. At batch 1:
- `throughput`: maximize output tokens/s over the workload. `ttft` (alias `first-token-latency`): minimize
  TTFT at the chosen percentile; among variants statistically tied with the best TTFT (the paired bootstrap
  95% interval of their TTFT ratio includes 1.0, or they are within 1%), the highest throughput wins.
- Constraints `--max-ttft-ms`, `--max-ttft-regression`, and (for throughput) `--min-speedup` rule a variant
  out; each violation is written to the variant's `ruled_out` in words.
- A variant whose greedy output differs from the baseline's on any request is disqualified and listed.
- A speculative variant none of whose target passes produced more than one token (`saved_nothing`) is
  ruled out: it cannot be faster than the baseline, whatever the noise says.
- Only measured figures decide. A speculative winner must beat the baseline beyond noise: the bootstrap 95%
  interval of its gain excludes 1.0 and the gain (median over repeats) is >= `--min-speedup`; otherwise the
  baseline wins and the reason says "speculation does not pay on this traffic: ...".
- Ties within 1% go to the simpler variant (`objective.rank` with `simplicity_key`): baseline < ngram < early
  exit < draft; then smaller lookahead; then the smaller draft (parameters, from `results.drafts`). Each load
  level's decision (`decision.levels`) and capacity's rank with the same rule and key.
- When no variant, not even the baseline, satisfies the constraints: `NoFeasibleVariantError` (exit 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runinfra_opt import stats
from runinfra_opt.errors import NoFeasibleVariantError, UserInputError
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.objective import TIE, Objective, throughput_of
from runinfra_opt.optimize.decision.eligibility import saved_nothing, unwritten_schedule
from runinfra_opt.optimize.decision.rule import UNITY, Scope, by_throughput, by_ttft, pays, simplicity_key
from runinfra_opt.records import NO_PASS_SAVED, RequestRecord, disqualifying
from runinfra_opt.results import CategoryDecision, Interval, RunResults, VariantResult


@dataclass
class _Candidate:
    result: VariantResult
    variant: Variant
    records: list[RequestRecord]
    tokens_per_s: float
    """Ranked by: `stats.comparable_tokens_per_s` (the baseline: its own repeats' tokens/s)."""
    ttft_s: float
    gain: Interval | None
    """Throughput ratio to the baseline (None for the baseline itself)."""

    @property
    def name(self) -> str:
        return self.result.name


def _variant_of(result: VariantResult) -> Variant:
    return Variant.from_dict(result.variant)


def _simplest(results: RunResults) -> Callable[[_Candidate], tuple[int, int, int, str]]:
    return lambda c: simplicity_key(results, c.variant)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _gain_text(gain: Interval | None) -> str:
    if gain is None:
        return "no paired measurement"
    return f"{gain.value:.2f}x (95% CI {gain.low:.2f}-{gain.high:.2f})"


def _disqualify(result: VariantResult) -> None:
    """Mark a variant whose greedy output differs from the baseline's (measured requests only)."""
    for r in result.measured_requests:
        if r.greedy and disqualifying(r):
            where = f" (first difference at output token {r.first_mismatch})" if r.first_mismatch is not None else ""
            result.disqualified = f"greedy output differs from the baseline on request {r.request_id}{where}"
            return


@dataclass(frozen=True)
class Batch1:
    """The decision at batch 1 (`decide`): one part of the run's `Decision`."""

    winner: str
    reason: str
    gain: Interval | None
    """The winner's throughput ratio to the baseline (`UNITY` for the baseline)."""
    ttft_change: float | None
    per_category: list[CategoryDecision]
    disqualified: list[str]

    @property
    def speculation(self) -> bool:
        return self.winner != BASELINE.name


def decide(results: RunResults, objective: Objective | None = None, *, seed: int = 0) -> Batch1:
    """Choose the winner among the variants measured at batch 1 and say why. Fills each variant's
    `disqualified` and `ruled_out` (measured variants from measured figures; predicted-only variants from
    their predictions, prefixed "predicted"). Raises `NoFeasibleVariantError` when nothing satisfies the
    constraints. `objective` None: the default one (throughput)."""
    objective = objective or Objective()
    percentile = objective.percentile
    baseline_result = results.variant("baseline")
    if baseline_result is None or not baseline_result.measured_requests:
        raise UserInputError("results have no measured baseline: nothing to compare the variants with")
    base_records = baseline_result.measured_requests
    base_ttft = stats.ttft_at(base_records, percentile)
    base = _Candidate(
        baseline_result,
        _variant_of(baseline_result),
        base_records,
        stats.tokens_per_s(stats.own_repeats(base_records)),
        base_ttft,
        None,
    )

    candidates: list[_Candidate] = []
    for result in results.variants:
        result.ruled_out = []
        result.disqualified = None
        variant = _variant_of(result)
        if result.failed:
            continue  # not measured on this engine (the reason is in `failed` and the notes)
        if result.measured_requests:
            _disqualify(result)
            if result is baseline_result:
                cand = base
            else:
                cand = _Candidate(
                    result,
                    variant,
                    result.measured_requests,
                    stats.comparable_tokens_per_s(result.measured_requests, base_records, seed=seed),
                    stats.ttft_at(result.measured_requests, percentile),
                    stats.throughput_ratio(result.measured_requests, base_records, seed=seed),
                )
            result.ruled_out = objective.violations(
                ttft_s=cand.ttft_s,
                base_ttft_s=base_ttft,
                gain=cand.gain.value if cand.gain else None,
                speculative=variant.is_speculative,
            )
            if saved_nothing(result):
                result.ruled_out.append(NO_PASS_SAVED)
            if (schedule := unwritten_schedule(results, result)) is not None:
                result.ruled_out.append(schedule)
            candidates.append(cand)
        elif result.predicted is not None:
            predicted_ttft = result.predicted.ttft_s.get(percentile)
            predicted_gain = result.predicted.speedup.value if result.predicted.speedup else None
            result.ruled_out = objective.violations(
                ttft_s=predicted_ttft,
                base_ttft_s=base_ttft,
                gain=predicted_gain,
                speculative=variant.is_speculative,
                prefix="predicted ",
            )

    feasible = [c for c in candidates if not c.result.disqualified and not c.result.ruled_out]
    if not feasible:
        problems = [f"{c.name}: {c.result.disqualified or '; '.join(c.result.ruled_out)}" for c in candidates]
        raise NoFeasibleVariantError(
            "no variant satisfies the constraints, not even the baseline: " + " | ".join(problems)
        )
    scope = Scope(
        base=base,
        baseline_ok=base in feasible,
        speculative=[c for c in feasible if c is not base],
        order=lambda pool: objective.rank(pool, _simplest(results)),
        gain=lambda c: c.gain,
        threshold=objective.min_speedup,
    )
    if objective.on_ttft:
        winner, reason = _in_words_on_ttft(results, scope, candidates, objective, seed)
    else:
        winner, reason = _in_words_on_throughput(scope, candidates, objective)

    disqualified = [c for c in candidates if c.result.disqualified]
    if disqualified:
        reason += f" Disqualified (output differs from the baseline): {', '.join(c.name for c in disqualified)}."
    return Batch1(
        winner=winner.name,
        reason=reason,
        gain=winner.gain if winner is not base else UNITY,
        ttft_change=(winner.ttft_s / base_ttft - 1) if base_ttft > 0 else None,
        per_category=per_category(results, objective, feasible=feasible),
        disqualified=[f"{c.name}: {c.result.disqualified}" for c in disqualified],
    )


def _no_pay_reason(best: _Candidate | None, candidates: Sequence[_Candidate], objective: Objective) -> str:
    if best is None:
        measured = [c for c in candidates if c.variant.is_speculative]
        if not measured:
            return "speculation does not pay on this traffic: no speculative variant was measured."
        return (
            "speculation does not pay on this traffic: every measured speculative variant was disqualified or "
            "ruled out by a constraint."
        )
    gain = best.gain
    other = [reason for reason in best.result.ruled_out if "--min-speedup" not in reason]  # that one: below
    if other:
        why = f"ruled out: {'; '.join(other)}"
    elif gain is None or gain.low <= 1.0:
        why = "its interval includes 1.0 (within noise)"
    else:
        why = f"under --min-speedup {objective.min_speedup:g}"
    return (
        f"speculation does not pay on this traffic: the fastest speculative variant, {best.name}, "
        f"measured {_gain_text(gain)}, {why}."
    )


def _in_words_on_throughput(
    scope: Scope[_Candidate], candidates: Sequence[_Candidate], objective: Objective
) -> tuple[_Candidate, str]:
    """`rule.by_throughput`, in words."""
    base = scope.base
    outcome = by_throughput(scope)
    winner = outcome.winner
    if outcome.why == "baseline ruled out":
        return winner, (
            f"{winner.name} is the fastest variant that satisfies the constraints "
            f"({winner.tokens_per_s:.1f} tokens/s, {_gain_text(winner.gain)} the baseline, which is ruled out: "
            f"{'; '.join(base.result.ruled_out) or base.result.disqualified})."
        )
    if outcome.why == "pays":
        return winner, (
            f"{winner.name} is {_gain_text(winner.gain)} the baseline's throughput "
            f"({winner.tokens_per_s:.1f} vs {base.tokens_per_s:.1f} tokens/s), {_lossless_text(winner.records)}."
        )
    if outcome.why == "tied with the baseline":
        paying = [c for c in scope.speculative if pays(c.gain, scope.threshold)]
        fastest = max([*paying, base], key=lambda c: c.tokens_per_s)
        return base, (
            f"speculation does not pay on this traffic: the best variant, {fastest.name}, is within "
            f"{TIE:.0%} of the baseline."
        )
    best_measured = max(
        (c for c in candidates if c.variant.is_speculative and not c.result.disqualified),
        key=lambda c: c.tokens_per_s,
        default=None,
    )
    return base, _no_pay_reason(best_measured, candidates, objective)


def _in_words_on_ttft(
    results: RunResults, scope: Scope[_Candidate], candidates: Sequence[_Candidate], objective: Objective, seed: int
) -> tuple[_Candidate, str]:
    """`rule.by_ttft` with batch 1's tie (the paired bootstrap interval of the TTFT ratio includes 1, or within
    `TIE`) and its noise (the interval of the ratio to the baseline below 1, at `--min-speedup`), in words."""
    percentile = objective.percentile
    base = scope.base

    def tied(c: _Candidate, best: _Candidate) -> bool:
        if c.ttft_s <= best.ttft_s * (1 + TIE):
            return True
        ratio = stats.ttft_ratio(c.records, best.records, percentile, seed=seed)
        return ratio is not None and ratio.low <= 1.0 <= ratio.high

    def faster(c: _Candidate) -> bool:
        vs_base = stats.ttft_ratio(c.records, base.records, percentile, seed=seed)
        return vs_base is not None and vs_base.high < 1.0 and 1.0 / vs_base.value >= objective.min_speedup

    outcome = by_ttft(scope, lambda c: c.ttft_s, tied, faster, throughput_of, _simplest(results))
    assert outcome is not None  # every batch-1 candidate has a TTFT
    winner, why = outcome.winner, outcome.why
    if why == "baseline fastest":
        return base, (
            f"the baseline has the lowest TTFT {percentile} ({_ms(base.ttft_s)}); the variants tied with "
            "it are not faster beyond noise."
        )
    if why == "baseline fastest, alone":
        return base, (
            f"speculation does not pay on this traffic: the baseline has the lowest TTFT {percentile} "
            f"({_ms(base.ttft_s)}) and no speculative variant is tied with it."
        )
    if why == "baseline tied, faster":
        return base, (
            f"the baseline is tied with the lowest TTFT {percentile} ({_ms(base.ttft_s)}) and has the highest "
            "throughput among the tied variants."
        )
    if why == "baseline ruled out":
        return winner, (
            f"{winner.name} has the lowest TTFT {percentile} that satisfies the constraints ({_ms(winner.ttft_s)}; "
            f"the baseline is ruled out: {'; '.join(base.result.ruled_out) or base.result.disqualified})."
        )
    if why == "faster first token":
        return winner, (
            f"{winner.name} reaches the first token sooner: TTFT {percentile} {_ms(winner.ttft_s)} vs "
            f"{_ms(base.ttft_s)} for the baseline, at {_gain_text(winner.gain)} its throughput."
        )
    if why == "tied, pays on throughput":
        return winner, (
            f"{winner.name} is tied with the baseline on TTFT {percentile} ({_ms(winner.ttft_s)} vs "
            f"{_ms(base.ttft_s)}) and {_gain_text(winner.gain)} faster in throughput."
        )
    leader = outcome.leader
    return base, (
        f"speculation does not pay on this traffic: {leader.name} measured TTFT {percentile} {_ms(leader.ttft_s)} "
        f"vs {_ms(base.ttft_s)} and {_gain_text(leader.gain)} throughput, not better than the baseline beyond noise."
    )


def per_category(
    results: RunResults,
    objective: Objective | None = None,
    *,
    feasible: Sequence[_Candidate] | None = None,
) -> list[CategoryDecision]:
    """The best measured variant per workload category and its throughput gain there (point ratio), ranked by
    `objective` (`objective.rank`: ties within 1% go to the simpler variant). `feasible` restricts the choice
    (default: measured, not disqualified)."""
    objective = objective or Objective()
    percentile = objective.percentile
    baseline = results.variant("baseline")
    if baseline is None or not baseline.measured_requests:
        return []
    pool = (
        [c.result for c in feasible]
        if feasible is not None
        else [v for v in results.variants if v.measured_requests and not v.disqualified]
    )
    base_groups = stats.by_category(baseline.measured_requests)
    out = []
    for category, base_records in sorted(base_groups.items()):
        base_tps = stats.tokens_per_s(base_records)
        entries = []
        for result in pool:
            records = [r for r in result.measured_requests if r.category == category]
            if not records:
                continue
            entries.append(
                _Candidate(
                    result,
                    _variant_of(result),
                    records,
                    stats.tokens_per_s(records),
                    stats.ttft_at(records, percentile),
                    None,
                )
            )
        if not entries:
            continue
        best = objective.rank(entries, _simplest(results))[0]
        out.append(
            CategoryDecision(
                category=category,
                best=best.name,
                speedup=best.tokens_per_s / base_tps if base_tps > 0 else None,
                requests=len({r.request_id for r in base_records}),
            )
        )
    return out


def _lossless_text(records: Sequence[RequestRecord]) -> str:
    ties = sum(1 for r in records if r.near_tie)
    if not ties:
        return "lossless on every greedy request"
    return (
        f"lossless on every greedy request up to {ties} numerical near-tie(s) (outputs differ only from a position "
        "where the baseline's top two tokens were within the tie tolerance; see the notes)"
    )
