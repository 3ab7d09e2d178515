"""Selection as pure functions over hand-built results: priorities, constraints, noise, ties, disqualification."""

from __future__ import annotations

import random
from typing import Any

import pytest

from runinfra_opt import stats
from runinfra_opt.errors import NoFeasibleVariantError
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.objective import Objective
from runinfra_opt.optimize.decision import decide
from runinfra_opt.optimize.decision.batch1 import per_category
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import Interval, LevelMetrics, LevelResult, ModelInfo, RunResults, Summary, VariantResult

REQUESTS = 12
REPEATS = 2
NGRAM4 = Variant("ngram", lookahead=4, ngram_max=2)
NGRAM2 = Variant("ngram", lookahead=2, ngram_max=2)
EXIT = Variant("early_exit", lookahead=4, exit_layer=8)
SMALL = Variant("draft", lookahead=4, draft="/m/small")
BIG = Variant("draft", lookahead=4, draft="/m/big")


def _records(
    speed: float,
    ttft_ms: float,
    *,
    noise: float = 0.01,
    seed: int = 1,
    categories: dict[str, float] | None = None,
    lossless: bool | None = True,
    target_passes: int = 30,
) -> list[RequestRecord]:
    """Requests x repeats: 40 output tokens at 20 tokens/s x `speed` (x per-category factor), with noise, in
    `target_passes` passes of the target (fewer than the tokens: drafts were accepted)."""
    rng = random.Random(seed)
    out = []
    for i in range(REQUESTS):
        category = "summarize" if i % 2 == 0 else "chat"
        factor = speed * (categories or {}).get(category, 1.0)
        for repeat in range(REPEATS):
            e2e = 40 / (20 * factor) * (1 + rng.uniform(-noise, noise))
            ttft = ttft_ms / 1000 * (1 + rng.uniform(-noise, noise))
            out.append(
                RequestRecord(
                    request_id=f"r{i}",
                    category=category,
                    repeat=repeat,
                    prompt_tokens=50,
                    output_tokens=40,
                    ttft_s=ttft,
                    e2e_s=e2e,
                    target_passes=target_passes,
                    lossless=None if lossless is None or i else lossless,
                    first_mismatch=None if lossless is not False or i else 7,
                )
            )
    return out


def _variant(variant: Variant, records: list[RequestRecord]) -> VariantResult:
    return VariantResult(name=variant.name, variant=variant.to_dict(), measured_requests=records, confirmed=True)


def _results(*variants: VariantResult, base_ttft_ms: float = 100, base_noise: float = 0.01) -> RunResults:
    base = _variant(BASELINE, _records(1.0, base_ttft_ms, noise=base_noise, seed=0, lossless=None, target_passes=40))
    return RunResults(
        run_id="t",
        created_at="2026-01-01T00:00:00Z",
        variants=[base, *variants],
        drafts=[
            ModelInfo(spec="/m/small", name="small", num_parameters=10_000_000),
            ModelInfo(spec="/m/big", name="big", num_parameters=90_000_000),
        ],
    )


def test_throughput_picks_the_fastest_significant_variant() -> None:
    results = _results(_variant(NGRAM4, _records(1.6, 110, seed=2)), _variant(SMALL, _records(1.3, 130, seed=3)))
    decision = decide(results, Objective(priority="throughput"))
    assert decision.winner == NGRAM4.name
    assert decision.speculation
    assert decision.gain is not None
    assert decision.gain.low > 1.0
    assert decision.gain.value == pytest.approx(1.6, rel=0.03)
    assert decision.ttft_change == pytest.approx(0.10, abs=0.03)
    assert decision.exit_code == 0
    assert "ngram-n2-k4" in decision.reason


def test_gain_within_noise_means_baseline_wins() -> None:
    results = _results(_variant(NGRAM4, _records(1.08, 100, noise=0.6, seed=2)), base_noise=0.6)
    decision = decide(results, Objective(priority="throughput", min_speedup=1.0))
    assert decision.winner == "baseline"
    assert not decision.speculation
    assert decision.reason.startswith("speculation does not pay on this traffic:")
    assert "includes 1.0" in decision.reason


def test_gain_under_min_speedup_is_ruled_out_and_baseline_wins() -> None:
    results = _results(_variant(NGRAM4, _records(1.03, 100, seed=2)))
    decision = decide(results, Objective(priority="throughput", min_speedup=1.05))
    assert decision.winner == "baseline"
    ngram = results.variant(NGRAM4.name)
    assert ngram is not None
    assert len(ngram.ruled_out) == 1
    assert ngram.ruled_out[0].startswith("speedup 1.0")
    assert ngram.ruled_out[0].endswith("< --min-speedup 1.05")
    assert "speculation does not pay" in decision.reason


@pytest.mark.parametrize("priority", ["throughput", "ttft"])
def test_a_variant_that_saved_no_target_pass_never_wins_on_a_measured_gain(priority: str) -> None:
    # 1.3x measured, the interval clear of 1.0, yet every pass produced one token: the machine drifted between
    # the passes (or, at one output token, the prefill's time moved); a speculative variant cannot be faster so
    ghost = _variant(NGRAM4, _records(1.3, 80, seed=2, target_passes=40))
    real = _variant(NGRAM2, _records(1.2, 100, seed=3))
    results = _results(ghost, real)
    decision = decide(results, Objective(priority=priority))
    assert ghost.ruled_out == ["saved no target pass (none produced more than one token): a measured gain is noise"]
    assert decision.winner == NGRAM2.name
    assert real.ruled_out == []
    alone = _results(_variant(NGRAM4, _records(1.3, 80, seed=2, target_passes=40)))
    decision = decide(alone, Objective(priority=priority))
    assert decision.winner == "baseline"
    assert decision.reason.startswith("speculation does not pay on this traffic: ")
    if priority == "throughput":  # not "within noise" or "under --min-speedup"
        assert "ruled out: saved no target pass" in decision.reason
    # one pass that produced two tokens is a pass saved: the gain is judged as usual
    saved = _records(1.3, 100, seed=2, target_passes=40)
    saved[5].target_passes = 39
    assert decide(_results(_variant(NGRAM4, saved)), Objective(priority="throughput")).winner == NGRAM4.name


def test_require_speedup_sets_the_gate_exit_code_when_baseline_wins() -> None:
    results = _results(_variant(NGRAM4, _records(0.9, 100, seed=2)))
    decision = decide(results, Objective(priority="throughput", require_speedup=True))
    assert decision.winner == "baseline"
    assert decision.exit_code == int(ExitCode.GATE_FAILED)
    assert decide(_results(_variant(NGRAM4, _records(1.5, 100))), Objective(require_speedup=True)).exit_code == 0


def test_ties_within_one_percent_go_to_the_simpler_variant() -> None:
    # early exit measured 0.5% faster than n-gram: tied, n-gram is simpler
    results = _results(
        _variant(EXIT, _records(1.5075, 100, noise=0, seed=2)), _variant(NGRAM4, _records(1.5, 100, noise=0, seed=3))
    )
    assert decide(results).winner == NGRAM4.name
    # same method: the smaller lookahead
    results = _results(_variant(NGRAM4, _records(1.505, 100, noise=0)), _variant(NGRAM2, _records(1.5, 100, noise=0)))
    assert decide(results).winner == NGRAM2.name
    # drafts: the smaller one (by parameters from results.drafts)
    results = _results(_variant(BIG, _records(1.505, 100, noise=0)), _variant(SMALL, _records(1.5, 100, noise=0)))
    assert decide(results).winner == SMALL.name
    # beyond 1%: the faster one
    results = _results(_variant(BIG, _records(1.6, 100, noise=0)), _variant(SMALL, _records(1.5, 100, noise=0)))
    assert decide(results).winner == BIG.name


def test_output_mismatch_disqualifies_and_is_listed() -> None:
    results = _results(
        _variant(SMALL, _records(2.0, 100, seed=2, lossless=False)), _variant(NGRAM4, _records(1.4, 100, seed=3))
    )
    decision = decide(results)
    assert decision.winner == NGRAM4.name
    small = results.variant(SMALL.name)
    assert small is not None
    assert small.disqualified is not None
    assert "r0" in small.disqualified
    assert "token 7" in small.disqualified
    assert decision.disqualified == [f"{SMALL.name}: {small.disqualified}"]
    assert SMALL.name in decision.reason


def test_max_ttft_constraint_rules_out_and_says_which() -> None:
    results = _results(_variant(SMALL, _records(2.0, 300, seed=2)), _variant(NGRAM4, _records(1.4, 120, seed=3)))
    decision = decide(results, Objective(max_ttft_ms=200))
    assert decision.winner == NGRAM4.name
    small = results.variant(SMALL.name)
    assert small is not None
    assert len(small.ruled_out) == 1
    assert small.ruled_out[0].startswith("TTFT p95 30")
    assert small.ruled_out[0].endswith("ms > --max-ttft-ms 200")


def test_max_ttft_regression_constraint() -> None:
    results = _results(_variant(SMALL, _records(2.0, 150, seed=2)), _variant(NGRAM4, _records(1.4, 105, seed=3)))
    decision = decide(results, Objective(max_ttft_regression=0.10))
    assert decision.winner == NGRAM4.name
    small = results.variant(SMALL.name)
    assert small is not None
    assert any("--max-ttft-regression 0.1" in r for r in small.ruled_out)
    ngram = results.variant(NGRAM4.name)
    assert ngram is not None
    assert ngram.ruled_out == []


def test_infeasible_baseline_lets_a_feasible_variant_win() -> None:
    results = _results(_variant(NGRAM4, _records(1.5, 80, seed=2)), base_ttft_ms=120)
    decision = decide(results, Objective(max_ttft_ms=100))
    assert decision.winner == NGRAM4.name
    assert "ruled out" in decision.reason


def test_impossible_constraints_raise_no_feasible() -> None:
    results = _results(_variant(NGRAM4, _records(1.5, 110, seed=2)))
    with pytest.raises(NoFeasibleVariantError, match="not even the baseline") as info:
        decide(results, Objective(max_ttft_ms=1))
    assert "baseline: TTFT p95" in str(info.value)
    assert info.value.exit_code == ExitCode.NO_FEASIBLE


def test_ttft_priority_picks_the_lowest_ttft() -> None:
    results = _results(_variant(SMALL, _records(1.2, 60, seed=2)), _variant(NGRAM4, _records(1.6, 95, seed=3)))
    decision = decide(results, Objective(priority="ttft", percentile="p90"))
    assert decision.winner == SMALL.name
    assert decision.priority == "ttft"
    assert "TTFT p90" in decision.reason


def test_ttft_alias_and_throughput_breaks_statistical_ties() -> None:
    # n-gram's TTFT equals the baseline's within noise; it is faster in throughput, so it wins the tie.
    results = _results(_variant(NGRAM4, _records(1.5, 100, noise=0.2, seed=2)), base_noise=0.2)
    decision = decide(results, Objective(priority="first-token-latency"))
    assert decision.priority == "ttft"
    assert decision.winner == NGRAM4.name
    assert "tied with the baseline" in decision.reason


def test_ttft_priority_baseline_wins_when_speculation_slows_first_token() -> None:
    results = _results(_variant(SMALL, _records(1.8, 200, seed=2)))
    decision = decide(results, Objective(priority="ttft"))
    assert decision.winner == "baseline"
    assert decision.reason.startswith("speculation does not pay on this traffic:")


def test_predicted_only_variants_get_predicted_constraint_notes_but_never_win() -> None:
    predicted = VariantResult(
        name=BIG.name,
        variant=BIG.to_dict(),
        predicted=Summary(tokens_per_s=100.0, ttft_s={"p95": 0.5}),
    )
    results = _results(predicted, _variant(NGRAM4, _records(1.4, 100, seed=3)))
    decision = decide(results, Objective(max_ttft_ms=200))
    assert decision.winner == NGRAM4.name
    assert predicted.ruled_out == ["predicted TTFT p95 500 ms > --max-ttft-ms 200"]


def test_per_category_best_and_gain() -> None:
    ngram = _variant(NGRAM4, _records(1.0, 100, seed=2, categories={"summarize": 2.0, "chat": 0.9}))
    results = _results(ngram)
    cats = {c.category: c for c in per_category(results)}
    assert cats["summarize"].best == NGRAM4.name
    assert cats["summarize"].speedup == pytest.approx(2.0, rel=0.03)
    assert cats["summarize"].requests == REQUESTS // 2
    assert cats["chat"].best == "baseline"
    decision = decide(results, Objective(min_speedup=1.05))
    assert {c.category for c in decision.per_category} == {"summarize", "chat"}


def test_summarize_intervals() -> None:
    base = _records(1.0, 100, seed=0)
    fast = _records(1.5, 100, seed=4)
    summary = stats.summarize_with_intervals(fast, base)
    assert summary.speedup is not None
    assert summary.speedup.low < summary.speedup.value < summary.speedup.high
    assert summary.speedup.value == pytest.approx(1.5, rel=0.02)
    assert summary.tokens_per_s_interval is not None
    assert summary.tokens_per_s_interval.low <= summary.tokens_per_s <= summary.tokens_per_s_interval.high
    assert set(summary.ttft_s) == {"p50", "p90", "p95", "p99"}
    ratio = stats.ttft_ratio(fast, base, "p95")
    assert ratio is not None
    assert ratio.low < 1.0 < ratio.high
    cats = stats.summarize_by_category(fast, base)
    assert set(cats) == {"summarize", "chat"}


def test_unknown_priority_and_missing_baseline_are_user_errors() -> None:
    from runinfra_opt.errors import UserInputError

    with pytest.raises(UserInputError, match="unknown priority"):
        decide(_results(), Objective(priority="latency"))
    empty = RunResults(run_id="t", created_at="x", variants=[])
    with pytest.raises(UserInputError, match="no measured baseline"):
        decide(empty)


def test_a_k_schedule_that_was_not_written_never_wins() -> None:
    """Measured fastest at batch 1 (it drafts there what the fixed k 8 drafts, and noise decides), but not
    written (it fell short of a fixed k under load): the decision goes to the best variant that may be written."""
    from runinfra_opt.methods.k_schedule import parse_schedule, with_schedule
    from runinfra_opt.methods.vllm_ngram import make
    from runinfra_opt.results import KSchedule, LoadSummary

    k8 = make(8, 1, 3)
    schedule = with_schedule(k8, parse_schedule("1-2:8,3-1024:2"))
    results = _results(_variant(k8, _records(1.5, 100, seed=2)), _variant(schedule, _records(1.55, 100, seed=3)))
    reason = "not written: at concurrency:4 it measured 0.450x the fixed k 2 (vllm_ngram-m1-n3-k2)"
    results.load = LoadSummary(
        spec="concurrency:1,4",
        levels=["concurrency:1", "concurrency:4"],
        schedule=KSchedule(variant=schedule.name, schedule=[[1, 2, 8], [3, 1024, 2]], built_from={}, reason=reason),
    )
    decision = decide(results, Objective(priority="throughput"))
    assert decision.winner == k8.name
    measured = results.variant(schedule.name)
    assert measured is not None
    assert measured.ruled_out == [f"k schedule {reason}"]
    results.load.schedule.written = True  # the same figures, written: it wins
    assert decide(results, Objective(priority="throughput")).winner == schedule.name


def _beside(records: list[RequestRecord], trial: str) -> list[RequestRecord]:
    return [r.model_copy(update={"trial": trial}) for r in records]


def test_candidates_timed_beside_the_baseline_rank_by_their_paired_ratio() -> None:
    """The machine slows by a quarter between two candidates' trials: NGRAM2 is the faster (1.4x against 1.3x the
    baseline timed beside each), but its raw tokens/s, taken in the slow stretch, is lower. Ranked by the paired
    ratio at the baseline's own speed, it wins; the raw figures would have picked NGRAM4."""
    fast, slow = 1.0, 0.75
    n4 = _beside(_records(1.3 * fast, 100, noise=0, seed=2), NGRAM4.name)
    n2 = _beside(_records(1.4 * slow, 100, noise=0, seed=3), NGRAM2.name)
    assert stats.tokens_per_s(n4) > stats.tokens_per_s(n2)  # raw: NGRAM4 ahead
    results = _results(_variant(NGRAM4, n4), _variant(NGRAM2, n2))
    base = results.variant(BASELINE.name)
    assert base is not None
    own = list(base.measured_requests)
    base.measured_requests += _beside(_records(fast, 100, noise=0, seed=4), NGRAM4.name)
    base.measured_requests += _beside(_records(slow, 100, noise=0, seed=5), NGRAM2.name)
    decision = decide(results)
    assert decision.winner == NGRAM2.name
    assert decision.gain is not None
    assert decision.gain.value == pytest.approx(1.4, rel=1e-6)
    # what it is ranked by: its ratio times the baseline's own repeats (the trial rows left out of that figure)
    assert stats.comparable_tokens_per_s(n2, base.measured_requests) == pytest.approx(1.4 * stats.tokens_per_s(own))
    assert stats.own_repeats(base.measured_requests) == own
    # untagged records (variants interleaved in one process) are ranked by their own tokens/s, as before
    assert stats.comparable_tokens_per_s(own, base.measured_requests) == stats.tokens_per_s(own)


LEVEL = "concurrency:1"


def _at_level_too(result: VariantResult, speed: float, ttft_ms: float) -> VariantResult:
    """The same figures as the batch-1 records (20 tokens/s x `speed`, TTFT `ttft_ms`), measured at `LEVEL`."""
    tokens = 20 * speed
    metrics = LevelMetrics(
        level=LEVEL, description=LEVEL, runs=1, requests=REQUESTS, succeeded=REQUESTS, failed=0, windows=[],
        output_tokens_per_s=Interval(value=tokens, low=tokens * 0.99, high=tokens * 1.01), requests_per_s=1.0,
        ttft_s={"p95": ttft_ms / 1000}, tpot_s={}, itl_s={}, e2e_s={}, send_lag_s={}, late_requests=0,
        peak_in_flight=1,
    )  # fmt: skip
    ratio = None if speed == 1.0 else Interval(value=speed, low=speed - 0.02, high=speed + 0.02)
    result.load = [LevelResult(level=LEVEL, metrics=metrics, vs_baseline=ratio)]
    return result


def _both(figures: dict[Variant, tuple[float, float]]) -> RunResults:
    """Every variant measured at batch 1 and at `LEVEL` with the same (speed, TTFT ms); the baseline (1.0, 100)."""
    variants = [_at_level_too(_variant(v, _records(s, t, noise=0)), s, t) for v, (s, t) in figures.items()]
    results = _results(*variants, base_noise=0)
    base = results.variant("baseline")
    assert base is not None
    _at_level_too(base, 1.0, 100)
    return results


@pytest.mark.parametrize(
    "figures",
    [
        # within 1% across methods and lookaheads: ngram k2, then ngram k4, then early exit; the smaller draft first
        {NGRAM4: (1.505, 100), EXIT: (1.502, 100), NGRAM2: (1.5, 100), BIG: (1.31, 100), SMALL: (1.3, 100)},
        # beyond 1%: by speed alone
        {NGRAM2: (1.2, 100), EXIT: (1.6, 100), SMALL: (1.4, 100)},
    ],
)
def test_batch1_and_a_load_level_rank_the_same_figures_the_same(
    figures: dict[Variant, tuple[float, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch-1 decision and `levels.level_decision` share `Objective.rank`: on the same figures, the same order
    and the same winner."""
    from runinfra_opt.optimize.decision.levels import level_decision

    orders: list[list[str]] = []
    shared = Objective.rank

    def spy(self: Objective, candidates: Any, simplicity: Any) -> Any:
        ranked = shared(self, candidates, simplicity)
        names = [c.result.name for c in ranked]
        orders.append([n for n in names if n != "baseline"])
        return ranked

    monkeypatch.setattr(Objective, "rank", spy)
    results = _both(figures)
    objective = Objective(priority="throughput")
    batch1 = decide(results, objective)
    level = level_decision(results, LEVEL, objective)
    assert level is not None
    assert level.winner == batch1.winner
    expected = [v.name for v in sorted(figures, key=lambda v: -figures[v][0])]
    if figures[NGRAM2] == (1.5, 100):
        expected = [NGRAM2.name, NGRAM4.name, EXIT.name, SMALL.name, BIG.name]
    assert orders[0] == orders[-1] == expected


def test_a_variant_that_saved_no_pass_at_batch1_wins_no_load_level_either() -> None:
    from runinfra_opt.optimize.decision.eligibility import eligible
    from runinfra_opt.optimize.decision.levels import level_decision

    results = _both({NGRAM2: (1.2, 100), SMALL: (1.4, 100)})
    ghost = _at_level_too(_variant(NGRAM4, _records(1.6, 100, noise=0, target_passes=40)), 1.6, 100)
    results.variants.append(ghost)
    objective = Objective(priority="throughput")
    assert decide(results, objective).winner == SMALL.name
    level = level_decision(results, LEVEL, objective)
    assert level is not None
    assert level.winner == SMALL.name  # 1.6x at the level, but nothing it drafted was ever accepted at batch 1
    assert not eligible(results, ghost)
    assert eligible(results, results.variant(SMALL.name))  # type: ignore[arg-type]


def test_batch1_and_a_load_level_agree_on_ttft() -> None:
    results = _both({NGRAM4: (1.3, 60), SMALL: (1.5, 90), EXIT: (1.1, 120)})
    from runinfra_opt.optimize.decision.levels import level_decision

    objective = Objective(priority="ttft")
    level = level_decision(results, LEVEL, objective)
    assert level is not None
    assert decide(results, objective).winner == level.winner == NGRAM4.name
