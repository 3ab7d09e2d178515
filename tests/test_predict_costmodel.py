"""Cost model: fitting measured samples, predicting requests from simulated passes, calibration."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.methods.ngram import simulate_ngram
from runinfra_opt.methods.simulation import expected_sampled, simulate_baseline, simulate_draft
from runinfra_opt.predict.batch1 import (
    Observation,
    calibrate_overheads,
    calibrate_round_overhead,
    ideal_speedup,
    predict_request,
)
from runinfra_opt.predict.costmodel import CostModel, fit_cost_model


@dataclass(frozen=True)
class Sample:
    role: str
    kind: str
    tokens: int
    context: int
    seconds: float


# A non-monotonic target table (like the measured CPU one: k=3 slower than k=4), a context slope of 1e-5 s/token.
TARGET_T = {1: 0.060, 2: 0.099, 3: 0.125, 4: 0.095, 5: 0.096, 9: 0.110}
SLOPE = 1e-5


def _samples() -> list[Sample]:
    out = []
    for k, t in TARGET_T.items():
        for context in (64, 256):
            out.append(Sample("target", "forward", k, context, t + SLOPE * (context - 64)))
    out += [Sample("target", "prefill", n, 0, s) for n, s in ((16, 0.05), (64, 0.15), (256, 0.45))]
    out += [Sample("draft:tiny", "forward", k, 64, 0.01 * k) for k in (1, 2, 4)]
    out += [Sample("draft:tiny", "prefill", n, 0, s) for n, s in ((16, 0.02), (256, 0.10))]
    return out


def test_fit_keeps_the_measured_table_and_slope() -> None:
    cost = fit_cost_model(_samples())
    target = cost.target
    for k, t in TARGET_T.items():
        assert target.forward(k) == pytest.approx(t)
    assert target.forward(3) > target.forward(4), "the table is not forced to be monotonic"
    assert target.context_slope_s == pytest.approx(SLOPE)
    assert target.forward(1, 1064) == pytest.approx(0.060 + SLOPE * 1000)
    # between measured k: linear; beyond: extended with the last segment
    assert target.forward(7) == pytest.approx(0.096 + (0.110 - 0.096) * 2 / 4)
    # prefill: piecewise linear between measured lengths, extrapolated beyond
    assert target.prefill(64) == pytest.approx(0.15)
    assert target.prefill(160) == pytest.approx(0.30)
    assert target.prefill(512) == pytest.approx(0.45 + 0.30 / 192 * 256)


def test_negative_context_slope_is_clamped() -> None:
    samples = [Sample("target", "forward", 1, 64, 0.06), Sample("target", "forward", 1, 256, 0.05)]
    cost = fit_cost_model(samples)
    assert cost.target.context_slope_s == 0.0


def test_fit_requires_a_target() -> None:
    with pytest.raises(ValueError, match="target"):
        fit_cost_model([Sample("draft:x", "forward", 1, 0, 0.01)])


def test_round_trips_through_json() -> None:
    cost = fit_cost_model(_samples())
    cost.request_overhead_s = 0.003
    cost.round_overhead_s["draft"] = 0.004
    again = CostModel.from_dict(json.loads(json.dumps(cost.to_dict())))
    assert again == cost


def test_baseline_prediction_is_prefill_plus_one_token_steps() -> None:
    cost = fit_cost_model(_samples())
    cost.request_overhead_s, cost.step_overhead_s = 0.002, 0.001
    ttft, e2e = predict_request(simulate_baseline(5), 64, cost, BASELINE)
    assert ttft == pytest.approx(0.002 + 0.15)
    expected_decode = sum(0.060 + SLOPE * i + 0.001 for i in range(1, 5))
    assert e2e == pytest.approx(ttft + expected_decode)


def test_a_negative_request_overhead_never_predicts_a_free_request() -> None:
    # Calibrated on long prompts, the request overhead can be more negative than a short prompt's prefill:
    # a one-token answer must still cost at least 20% of its own prefill (a zero would make tokens/s infinite).
    cost = fit_cost_model(_samples())
    cost.request_overhead_s = -0.3
    ttft, e2e = predict_request(simulate_baseline(1), 16, cost, BASELINE)
    assert ttft == pytest.approx(0.2 * 0.05)
    assert e2e == ttft


def test_draft_prediction_counts_draft_steps_and_chunks() -> None:
    cost = fit_cost_model(_samples())
    variant = Variant("draft", lookahead=2, draft="tiny")
    sim = simulate_draft([True, True, True, True, True, True], 2, prompt_len=16, max_length=100, draft_eos=[False] * 6)
    assert sim.chunks == [3, 3]
    ttft, e2e = predict_request(sim, 16, cost, variant)
    # round 0: draft prefill(16) + 1 more draft step, then target prefill over 16 + 2 tokens
    draft = cost.role("draft:tiny")
    assert ttft == pytest.approx(0.02 + draft.forward(1) + cost.target.prefill(18))
    # round 1 at context 19: target T(3) + draft steps (2 tokens, then 1)
    assert e2e - ttft == pytest.approx(cost.target.forward(3, 19) + draft.forward(2) + draft.forward(1))


def test_ngram_and_expected_predictions_have_no_draft_cost() -> None:
    cost = fit_cost_model(_samples())
    variant = Variant("ngram", lookahead=4, ngram_max=2)
    sim = simulate_ngram([5, 6, 7, 5, 6], [7, 5, 6, 7, 9, 9, 9], 4, 2, {2}, 100)
    assert sim.chunks == [4, 5, 1, 2]
    ttft, e2e = predict_request(sim, 5, cost, variant)
    assert ttft == pytest.approx(cost.target.prefill(5 + 3))
    t = cost.target
    assert e2e - ttft == pytest.approx(t.forward(5, 9) + t.forward(1, 10) + t.forward(2, 11))
    exp = expected_sampled([0.5] * 10, 2, prompt_len=16, max_length=100)
    ttft_s, e2e_s = predict_request(exp, 16, cost, Variant("draft", lookahead=2, draft="tiny"))
    assert 0 < ttft_s < e2e_s


def test_unknown_draft_role_is_a_clear_error() -> None:
    cost = fit_cost_model(_samples())
    with pytest.raises(KeyError, match="draft:other"):
        predict_request(simulate_baseline(3), 16, cost, Variant("draft", lookahead=2, draft="other"))


def test_calibration_recovers_overheads_at_one_prompt_length() -> None:
    truth = fit_cost_model(_samples())
    truth.request_overhead_s, truth.step_overhead_s = 0.004, 0.0015
    observations = []
    for n in (10, 30, 5):
        ttft, e2e = predict_request(simulate_baseline(n), 64, truth, BASELINE)
        observations.append(Observation(64, n, ttft, e2e))
    fitted = calibrate_overheads(fit_cost_model(_samples()), observations)
    assert fitted.request_overhead_s == pytest.approx(0.004)
    assert fitted.step_overhead_s == pytest.approx(0.0015)
    assert fitted.target.prefill_line is None
    # a prefill table that over-estimates gives a negative correction, not a clamp at 0
    faster = [Observation(64, o.output_tokens, o.ttft_s - 0.1, o.e2e_s - 0.1) for o in observations]
    assert calibrate_overheads(fit_cost_model(_samples()), faster).request_overhead_s == pytest.approx(-0.096)


def test_calibration_fits_ttft_line_robustly_over_prompt_lengths() -> None:
    cost = fit_cost_model(_samples())
    # TTFT = 10 ms + 2 ms/token, one request disturbed by +1 s: the robust line ignores it.
    prompts = [20, 50, 100, 200, 400, 800]
    observations = [Observation(p, 1, 0.010 + 0.002 * p + (1.0 if p == 400 else 0.0), 0.0) for p in prompts]
    fitted = calibrate_overheads(cost, observations)
    assert fitted.request_overhead_s == 0.0
    assert fitted.target.prefill_line == pytest.approx((0.010, 0.002))
    ttft, _ = predict_request(simulate_baseline(1), 1000, fitted, BASELINE)
    assert ttft == pytest.approx(0.010 + 0.002 * 1000)
    # the draft's table is untouched; the target's round-0 prefill covers prompt + candidates
    sim = simulate_draft([True, True], 2, prompt_len=1000, max_length=2000, draft_eos=[False, False])
    ttft, _ = predict_request(sim, 1000, fitted, Variant("draft", lookahead=2, draft="tiny"))
    draft = fitted.role("draft:tiny")
    assert ttft == pytest.approx(draft.prefill(1000) + draft.forward(1) + 0.010 + 0.002 * 1002)
    assert CostModel.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted


def test_round_overhead_calibration() -> None:
    truth = fit_cost_model(_samples())
    variant = Variant("draft", lookahead=2, draft="tiny")
    truth.round_overhead_s["draft"] = 0.003
    sim = simulate_draft([True, False] * 8, 2, prompt_len=30, max_length=100)
    ttft, e2e = predict_request(sim, 30, truth, variant)
    rounded = calibrate_round_overhead(fit_cost_model(_samples()), "draft", [(sim, 30, variant, ttft, e2e)])
    assert rounded.round_overhead_s["draft"] == pytest.approx(0.003)


def test_round_calibration_separates_the_cost_per_round_from_the_cost_per_drafted_token() -> None:
    """Runs at lookaheads 1, 4 and 8 of one method: a true cost of 2 ms a round plus 0.8 ms per drafted token is
    recovered as two terms, and the variants in between are then predicted exactly; one median overhead (what
    calibrating at one lookahead gives) over-charges the rounds that draft little and under-charges the others."""
    truth = fit_cost_model(_samples())
    truth.round_overhead_s["ngram"] = 0.002
    truth.drafted_token_overhead_s["ngram"] = 0.0008
    prompt, output = [5, 6, 7, 8, 5, 6, 7, 8, 9], [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 1, 5, 6, 7, 8, 9, 3, 4]
    runs, sims = [], {}
    for k in (1, 2, 4, 8):
        variant = Variant("ngram", lookahead=k, ngram_max=2)
        sim = simulate_ngram(prompt, output, k, 2, {2}, len(prompt) + len(output))
        sims[k] = (variant, sim)
        if k != 2:
            runs.append((sim, len(prompt), variant, *predict_request(sim, len(prompt), truth, variant)))
    assert len({round(sim.drafted / sim.target_passes, 2) for _, sim in sims.values()}) == 4
    fitted = calibrate_round_overhead(fit_cost_model(_samples()), "ngram", runs)
    assert fitted.round_overhead_s["ngram"] == pytest.approx(0.002)
    assert fitted.drafted_token_overhead_s["ngram"] == pytest.approx(0.0008)
    variant, sim = sims[2]  # held out
    assert predict_request(sim, len(prompt), fitted, variant) == pytest.approx(
        predict_request(sim, len(prompt), truth, variant)
    )
    # A slow prefill (a first token 0.2 s late, as a long prompt's TTFT varies from run to run) moves nothing:
    # only the rounds after the first token are fitted.
    late = [(s, n, v, t + 0.2, e + 0.2) if v.lookahead == 8 else (s, n, v, t, e) for s, n, v, t, e in runs]
    again = calibrate_round_overhead(fit_cost_model(_samples()), "ngram", late)
    assert again.round_overhead_s["ngram"] == pytest.approx(0.002)
    assert again.drafted_token_overhead_s["ngram"] == pytest.approx(0.0008)
    # At one lookahead (no spread in drafted tokens a pass) only one term is fitted, and it is what that
    # lookahead's rounds cost on average: exact there, wrong elsewhere.
    one = calibrate_round_overhead(fit_cost_model(_samples()), "ngram", [r for r in runs if r[2].lookahead == 4])
    assert "ngram" not in one.drafted_token_overhead_s
    k1, k8 = sims[1], sims[8]
    e2e = {k: predict_request(s, len(prompt), one, v)[1] for k, (v, s) in ((1, k1), (8, k8))}
    assert e2e[1] > predict_request(k1[1], len(prompt), truth, k1[0])[1]
    assert e2e[8] < predict_request(k8[1], len(prompt), truth, k8[0])[1]
    assert CostModel.from_dict(json.loads(json.dumps(fitted.to_dict()))) == fitted


def test_a_negative_cost_per_drafted_token_never_makes_a_round_cost_less_than_nothing() -> None:
    cost = fit_cost_model(_samples())
    cost.drafted_token_overhead_s["ngram"] = -1.0  # absurd: would take 8 s off a k=8 round
    variant = Variant("ngram", lookahead=8, ngram_max=2)
    prompt, output = [5, 6, 7, 8, 9] * 3, [5, 6, 7, 8, 9] * 4
    sim = simulate_ngram(prompt, output, 8, 2, {2}, len(prompt) + len(output))
    ttft, e2e = predict_request(sim, len(prompt), cost, variant)
    assert e2e >= ttft >= 0.2 * cost.target.prefill(len(prompt)) - 1e-9


def test_ideal_speedup_formula() -> None:
    assert ideal_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert ideal_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    assert ideal_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    with pytest.raises(ValueError, match="acceptance"):
        ideal_speedup(1.5, 2, 0.1)


def test_calibration_against_a_much_too_slow_table_never_predicts_zero_time() -> None:
    # The table was measured while the machine was 4x busier than during the baseline: the additive
    # correction is bounded (80% of a step, 80% of the prefill), so predicted times stay positive.
    truth = fit_cost_model(_samples())
    observations = []
    for n in (10, 30):
        ttft, e2e = predict_request(simulate_baseline(n), 64, truth, BASELINE)
        observations.append(Observation(64, n, ttft / 10, ttft / 10 + (e2e - ttft) / 10))
    fitted = calibrate_overheads(truth, observations)
    one_step = truth.target.forward(1, 64)
    assert fitted.step_overhead_s < -0.5 * one_step
    ttft, e2e = predict_request(simulate_baseline(30), 64, fitted, BASELINE)
    assert ttft >= 0.2 * truth.target.prefill(64) - 1e-9
    assert e2e - ttft >= 29 * 0.15 * one_step
