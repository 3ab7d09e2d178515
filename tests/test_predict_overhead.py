"""The speculative step terms (`runinfra_opt.predict.overhead`): the fit recovers known terms from requests that a
server with those terms served (the predictor itself plays that server), keeps both terms >= 0, holds each
variant out of its own fit, and the predictor charges them per sequence a step and per drafted token."""

from __future__ import annotations

import pytest

from runinfra_opt.load import Concurrency, LevelRun, Rate
from runinfra_opt.optimize.serving import pace
from runinfra_opt.predict.figures import speculative_steps
from runinfra_opt.predict.overhead import (
    NONE,
    Sample,
    SpecOverhead,
    by_family,
    fit,
    fit_drafted,
    leave_one_out,
    level_samples,
    warmup_samples,
)
from runinfra_opt.predict.serving import Corrections, RequestPasses, predict_run
from runinfra_opt.predict.steptable import StepCostTable
from runinfra_opt.records import RequestRecord
from runinfra_opt.workload.model import Request

TABLE = StepCostTable(batch_sizes=(1, 2), tokens=(1, 9), seconds=((0.030, 0.034), (0.032, 0.040)), prefill=((1, 0.05),))


def _item(i: int, passes: tuple[tuple[int, int], ...]) -> RequestPasses:
    request = Request(id=f"r{i}", line=i + 1, prompt="p", max_tokens=64)
    return RequestPasses(request, 12, passes)


def _variant(k: int, seed: int) -> list[RequestPasses]:
    """Requests of a lookahead-k n-gram variant: some steps draft k tokens, some find nothing (carry 1)."""
    out = []
    for i in range(6):
        passes = []
        for j in range(10 + i):
            if (i * 7 + j * 3 + seed) % 4 == 0:
                passes.append((1, 1))  # no match: nothing drafted
            else:
                passes.append((k + 1, 1 + (i + j) % (k + 1)))
        out.append(_item(i, tuple(passes)))
    return out


def _samples(name: str, items: list[RequestPasses], truth: SpecOverhead) -> list[Sample]:
    plain = {r.request_id: r.e2e_s for r in predict_run(Concurrency(1), items, TABLE).records}
    served = {r.request_id: r.e2e_s for r in predict_run(Concurrency(1), items, TABLE, overhead=truth).records}
    return [
        Sample(name, served[item.request.id] - plain[item.request.id], 1 + len(item.passes),
               sum(c - 1 for c, _ in item.passes))
        for item in items
    ]  # fmt: skip


def test_predictor_charges_the_terms_per_step_and_per_drafted_token() -> None:
    item = _item(0, ((9, 3), (1, 1), (9, 9)))
    plain = predict_run(Concurrency(1), [item], TABLE).records[0]
    extra = predict_run(Concurrency(1), [item], TABLE, overhead=SpecOverhead(0.002, 0.0005)).records[0]
    # 4 steps (prefill + 3 passes) x 2 ms, and 16 drafted tokens x 0.5 ms
    assert extra.e2e_s - plain.e2e_s == pytest.approx(4 * 0.002 + 16 * 0.0005)
    assert extra.ttft_s - plain.ttft_s == pytest.approx(0.002)  # the proposer runs in the prefill's step too


def test_under_load_the_step_term_is_charged_per_sequence_in_the_step() -> None:
    """Two requests in a closed loop of 2 share their steps: each step carries the proposer's run for both (vLLM's
    n-gram proposer runs per request). Charged once a step, it under-predicted concurrency 4 on real vLLM
    (summarize: 9 of 16 variants within 15%; per sequence, 15 of 16)."""
    items = [_item(0, ((1, 1),) * 5), _item(1, ((1, 1),) * 5)]
    plain = predict_run(Concurrency(2), items, TABLE)
    extra = predict_run(Concurrency(2), items, TABLE, overhead=SpecOverhead(0.002, 0.0))
    # one prefill step for both, then 5 decoding steps of two sequences each: 6 steps x 2 sequences x 2 ms
    assert max(r.done_s for r in extra.records) - max(r.done_s for r in plain.records) == pytest.approx(6 * 2 * 0.002)
    assert SpecOverhead(0.004, 0.002).step_extra_s(6, sequences=3) == pytest.approx(3 * 0.004 + 6 * 0.002)


def test_fit_recovers_known_terms_across_lookaheads() -> None:
    truth = SpecOverhead(0.0015, 0.0007)
    samples = _samples("k2", _variant(2, 0), truth) + _samples("k8", _variant(8, 1), truth)
    got = fit(samples)
    assert got.step_s == pytest.approx(truth.step_s, rel=1e-6)
    assert got.drafted_token_s == pytest.approx(truth.drafted_token_s, rel=1e-6)
    assert got.fitted_on == ("k2", "k8")
    assert got.requests == 12


def test_fit_keeps_terms_non_negative() -> None:
    # residuals that only a negative per-step term would explain: the step term is dropped, drafts refitted
    samples = [Sample("k4", 0.010 - 0.001 * s, s, d) for s, d in ((10, 30), (20, 40), (30, 90), (15, 20))]
    got = fit(samples)
    assert got.step_s >= 0
    assert got.drafted_token_s >= 0
    assert fit([Sample("k4", -0.05, 10, 30)]) == SpecOverhead(0.0, 0.0, ("k4",), 1)
    assert fit([]) == SpecOverhead()


def test_leave_one_out_never_fits_a_variant_on_itself() -> None:
    samples = _samples("k2", _variant(2, 0), SpecOverhead(0.001, 0.0)) + _samples(
        "k8", _variant(8, 1), SpecOverhead(0.004, 0.002)
    )
    held = leave_one_out(samples, ["k2", "k8"])
    assert held["k2"].fitted_on == ("k8",)
    assert held["k8"].fitted_on == ("k2",)
    # each is the other's exact terms: k2 is predicted with k8's and vice versa
    assert held["k2"].step_s == pytest.approx(0.004, rel=1e-6)
    assert held["k2"].drafted_token_s == pytest.approx(0.002, rel=1e-6)
    assert held["k8"].step_s == pytest.approx(0.001, rel=1e-6)
    assert leave_one_out(samples[:6], ["k2"])["k2"] == SpecOverhead()  # nothing else timed: no terms
    with pytest.raises(ValueError, match="cannot be negative"):
        SpecOverhead(-0.001, 0.0)


def test_a_variant_takes_the_terms_of_its_own_method_when_one_was_timed() -> None:
    """Two n-gram lookaheads cost 1 ms a step, two suffix ones 6 ms: a suffix variant is predicted with the other
    suffix variant's terms, never pooled with n-gram's (which would halve its cost); a method with nothing timed
    falls back to every timed variant."""
    cheap, dear = SpecOverhead(0.001, 0.0), SpecOverhead(0.006, 0.0)
    samples = (
        _samples("ngram-k2", _variant(2, 0), cheap) + _samples("ngram-k8", _variant(8, 1), cheap)
        + _samples("suffix-k4", _variant(4, 2), dear) + _samples("suffix-k8", _variant(8, 3), dear)
    )  # fmt: skip
    family = {"ngram-k2": "ngram", "ngram-k8": "ngram", "suffix-k4": "suffix", "suffix-k8": "suffix", "draft": "d"}
    held = leave_one_out(samples, list(family)[:4], family)
    assert held["suffix-k8"].fitted_on == ("suffix-k4",)
    assert held["suffix-k8"].step_s == pytest.approx(0.006, rel=1e-6)
    assert held["ngram-k2"].fitted_on == ("ngram-k8",)
    assert held["ngram-k2"].step_s == pytest.approx(0.001, rel=1e-6)
    pooled = leave_one_out(samples, ["suffix-k8"])["suffix-k8"]  # without families: pooled with n-gram's
    assert pooled.step_s < 0.005
    # a lone variant of its method is predicted from the other methods' variants
    lone = leave_one_out(samples[12:18] + samples[:12], ["suffix-k4"], {**family, "suffix-k8": "other"})
    assert lone["suffix-k4"].fitted_on == ("ngram-k2", "ngram-k8")
    # untimed: its method's timed variants, else all
    assert by_family(samples, "suffix-k2", {**family, "suffix-k2": "suffix"}).fitted_on == ("suffix-k4", "suffix-k8")
    assert by_family(samples, "draft", family).fitted_on == tuple(sorted(family)[1:])


# ------------------------------------------------------------------------------------------ under load
def _loaded(k: int, seed: int, truth: SpecOverhead, step_s: float) -> tuple[list[RequestPasses], LevelRun]:
    """A lookahead-k variant's requests and the run of a server with `truth` and a `step_s` correction at 2 in
    flight (the predictor plays that server: one chunk per sequence per step, as vLLM streams)."""
    items = _variant(k, seed)
    return items, predict_run(Concurrency(2), items, TABLE, corrections=Corrections(step_s=step_s), overhead=truth)


def test_under_load_the_drafted_token_term_is_read_off_other_variants_steps() -> None:
    """At a load level the per-drafted-token term is fitted again on the timed variants' decoding steps there, with
    the per-sequence one held at its batch-1 value: each step's measured time minus the table's and the level's
    step correction is 1 ms a sequence + 0.7 ms a drafted token, so the fit on k 2 and k 4 recovers 0.7 ms."""
    truth, correction = SpecOverhead(0.001, 0.0007), -0.002
    samples = []
    for name, k, seed in (("k2", 2, 1), ("k4", 4, 2)):
        items, run = _loaded(k, seed, truth, correction)
        got = level_samples(name, run, {item.request.id: item.passes for item in items}, TABLE, correction)
        assert [s.steps for s in got] == [2]  # at 2 in flight: enough steps of two sequences, and only those
        samples += got
    assert all(s.residual_s == pytest.approx(0.001 * s.steps + 0.0007 * s.drafted) for s in samples)
    fitted = fit_drafted(samples, truth.step_s)
    assert fitted.drafted_token_s == pytest.approx(0.0007)
    assert (fitted.step_s, fitted.fitted_on, fitted.requests) == (0.001, ("k2", "k4"), len(samples))
    # held at a per-sequence term that is too high, the drafted one absorbs what it can and stays >= 0
    assert fit_drafted(samples, 0.1).drafted_token_s == 0.0
    assert fit_drafted([], 0.001) is NONE


def test_a_warm_up_climbing_through_batch_sizes_pins_both_terms() -> None:
    """A capacity search's warm-up climbs through many batch sizes, few steps at each: grouped by batch size, its
    steps give one sample per group beyond the table and the baseline's correction by batch size, and `fit` recovers
    both terms, the per-sequence one too (here 0.8 ms a sequence + 0.3 ms a drafted token)."""
    truth = SpecOverhead(0.0008, 0.0003)
    correction = Corrections(by_batch=((1.0, 0.0), (8.0, -0.004)))
    items = []
    for i in range(30):
        passes = [(1, 1) if (i + j) % 3 == 0 else (5, 1 + (i * j) % 5) for j in range(60 + i % 7)]
        request = Request(id=f"r{i}", line=i + 1, prompt="p", max_tokens=200)
        items.append(RequestPasses(request, 12, tuple(passes)))
    run = predict_run(Rate(4.0, 1.0, 0), items, TABLE, corrections=correction, overhead=truth)  # up to 20 in flight
    by_id = {item.request.id: item.passes for item in items}
    samples = warmup_samples("k4", run, by_id, TABLE, correction.step_at)
    assert len(samples) >= 5
    assert len({s.steps for s in samples}) == len(samples)  # one sample a group of batch sizes
    assert max(s.steps for s in samples) >= 15
    fitted = fit(samples)  # medians of groups spanning several batch sizes: close, not exact
    assert fitted.step_s == pytest.approx(0.0008, rel=0.15)
    assert fitted.drafted_token_s == pytest.approx(0.0003, rel=0.15)
    assert warmup_samples("k4", run, by_id, TABLE, correction.step_at, min_steps=100_000) == []


def test_a_request_that_left_its_simulated_output_carries_its_mean() -> None:
    """The steps of two requests at 2 in flight: r0 is prefilled alone, r1 with r0's first pass, then both decode
    (steps 3-5) and r1 ends alone. The steps that count follow a step of as many sequences with no prefill between:
    steps 4 and 5, carrying r0's passes 3 and 4 and r1's 2 and 3. A request whose run shows another number of
    chunks than its simulation (greedy output may leave the batch-1 one under load) carries its simulated mean in
    each step; a request with no simulation leaves its steps out."""
    r0, r1 = ((5, 5), (1, 1), (5, 3), (1, 1)), ((3, 3), (3, 1), (1, 1), (3, 3))
    run = predict_run(Concurrency(2), [_item(0, r0), _item(1, r1)], TABLE)
    assert [(b, c) for b, c, _ in speculative_steps(run, {"r0": r0, "r1": r1})] == [(2, 5 + 3), (2, 1 + 1)]
    assert all(seconds > 0 for _, _, seconds in speculative_steps(run, {"r0": r0, "r1": r1}))
    other = ((3, 3), (3, 1), (1, 1), (2, 2), (2, 1))  # same length, one chunk more: not what the run served
    mean = (3 + 3 + 1 + 2 + 2) / 5
    got = [(b, c) for b, c, _ in speculative_steps(run, {"r0": r0, "r1": other})]
    assert got == [(2, pytest.approx(5 + mean)), (2, pytest.approx(1 + mean))]
    assert speculative_steps(run, {"r0": r0}) == []


# ------------------------------------------------------------------------------------------ the machine's pace
def _record(request_id: str, e2e_s: float, trial: str | None) -> RequestRecord:
    return RequestRecord(
        request_id=request_id, category="c", prompt_tokens=4, output_tokens=10, ttft_s=0.1, e2e_s=e2e_s,
        target_passes=10, trial=trial,
    )  # fmt: skip


def test_a_variants_seconds_are_taken_at_the_pace_of_the_baseline_beside_it() -> None:
    """The baseline's own pass (trial None) matched its predictions; beside candidate "a" it ran 30% slower, beside
    "b" 10% faster: a's seconds are divided by 1.3, b's by 0.9; a variant timed beside nothing keeps its own."""
    predicted = {"r1": 1.0, "r2": 2.0}
    baseline = [
        _record("r1", 1.0, None), _record("r2", 2.0, None),
        _record("r1", 1.3, "a"), _record("r2", 2.6, "a"),
        _record("r1", 0.9, "b"), _record("r2", 1.8, "b"),
    ]  # fmt: skip
    assert pace([_record("r1", 0.8, "a")], baseline, predicted) == pytest.approx(1.3)
    assert pace([_record("r2", 1.5, "b")], baseline, predicted) == pytest.approx(0.9)
    assert pace([_record("r1", 0.8, None)], baseline, predicted) == 1.0
    assert pace([_record("r1", 0.8, "c")], baseline, predicted) == 1.0  # no baseline timed in its trial
