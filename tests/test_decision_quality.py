"""Decision quality (issue 17): prompt lookup's measured search cost in the cost model, ranking within a method
family, and the stopping rule of `--repeats auto` (pure logic over synthetic records)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.methods.ngram import ngram_search, simulate_ngram
from runinfra_opt.objective import Objective
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.options import parse_repeats
from runinfra_opt.optimize.phases import extend
from runinfra_opt.optimize.state import RunState, Silent
from runinfra_opt.predict.batch1 import predict_request
from runinfra_opt.predict.costmodel import CostModel, SearchCost, fit_cost_model
from runinfra_opt.records import RequestRecord
from runinfra_opt.report.accuracy import family_rankings, kendall_tau
from runinfra_opt.results import Plan, RunResults, Summary, VariantResult
from runinfra_opt.stats import relative_mad
from runinfra_opt.workload.model import Request

# ---- prompt lookup: the search widths the simulator records ------------------------------------------------


def test_ngram_search_counts_the_sizes_scanned() -> None:
    eos = {2}
    # A 2-gram match: one size scanned.
    assert ngram_search([5, 6, 7, 8, 5, 6], 2, 2, eos, 100) == ([7, 8], 1)
    # No 3-gram, no 2-gram, a 1-gram match: three sizes scanned.
    assert ngram_search([5, 7, 8, 9, 6, 5], 2, 3, eos, 100) == ([7, 8], 3)
    # Nothing anywhere: every size scanned.
    assert ngram_search([1, 3, 4, 9], 2, 3, eos, 100) == ([], 3)
    # One token before max_length: no search at all.
    assert ngram_search([5, 6, 5, 6], 3, 2, eos, 5) == ([], 0)


def test_simulation_records_one_search_width_per_target_pass() -> None:
    sim = simulate_ngram([5, 6, 7, 5, 6], [7, 5, 6, 7, 9, 9, 9], 4, 3, {2}, 100)
    assert len(sim.searched) == sim.target_passes == len(sim.chunks)
    assert all(1 <= w <= 3 for w in sim.searched)


# ---- the cost model's search term --------------------------------------------------------------------------


class _Sample:
    def __init__(self, role: str, kind: str, tokens: int, context: int, seconds: float) -> None:
        self.role, self.kind, self.tokens, self.context, self.seconds = role, kind, tokens, context, seconds


def _samples(per_size_token: float = 1e-6) -> list[_Sample]:
    out = [_Sample("target", "forward", k, 64, 0.05 + 0.005 * k) for k in (1, 2, 3, 5, 9)]
    out += [_Sample("target", "prefill", n, 0, 0.001 * n) for n in (16, 64)]
    for context in (64, 1024):
        for width in (1, 2, 3):
            out.append(_Sample("search:ngram", "scan", width, context, 1e-4 + width * context * per_size_token))
        for count in (1, 4):
            extra = 2e-5 * count
            out.append(_Sample("search:ngram", "extract", count, context, 1e-4 + context * 1e-6 + extra))
    return out


def test_search_cost_is_fitted_and_interpolated_over_width_candidates_and_context() -> None:
    cost = fit_cost_model(_samples())
    search = cost.search["ngram"]
    assert "search:ngram" not in cost.roles
    assert search.scan(2, 1024) == pytest.approx(1e-4 + 2 * 1024e-6)
    assert search.scan(3, 544) == pytest.approx(1e-4 + 3 * 544e-6)  # linear between measured contexts
    # A round that scans 3 sizes and proposes 4 candidates: scan(3) + the candidates' own work.
    assert search.round(3, 4, 64) == pytest.approx(1e-4 + 3 * 64e-6 + 8e-5)
    assert search.round(0, 0, 64) == 0.0
    assert SearchCost.from_dict(search.to_dict()) == search
    assert CostModel.from_dict(cost.to_dict()).search == cost.search


def test_prediction_charges_each_round_its_search_so_wider_ngram_sizes_cost_more() -> None:
    """Two variants with the same passes but different max n-gram size differ only by the search they scan."""
    cost = fit_cost_model(_samples(per_size_token=1e-4))  # an expensive search, to see it clearly
    prompt = list(range(10, 400))  # distinct tokens: no match for any size, every round scans every size
    output = [7, 8, 9, 10, 11, 12]
    n1, n3 = Variant("ngram", lookahead=4, ngram_max=1), Variant("ngram", lookahead=4, ngram_max=3)
    sim1 = simulate_ngram(prompt, output, 4, 1, {2}, 1000)
    sim3 = simulate_ngram(prompt, output, 4, 3, {2}, 1000)
    assert sim1.chunks == sim3.chunks
    assert sim1.searched != sim3.searched
    ttft1, e2e1 = predict_request(sim1, len(prompt), cost, n1)
    ttft3, e2e3 = predict_request(sim3, len(prompt), cost, n3)
    search = cost.search["ngram"]
    expected = sum(
        search.round(w3, 0, len(prompt) + i) - search.round(w1, 0, len(prompt) + i)
        for i, (w1, w3) in enumerate(zip(sim1.searched, sim3.searched, strict=True))
    )
    assert e2e3 - e2e1 == pytest.approx(expected)
    assert ttft3 - ttft1 == pytest.approx(search.round(3, 0, len(prompt)) - search.round(1, 0, len(prompt)))
    # Without a search table, the two are predicted equal (what the model could not tell apart before).
    plain = CostModel(roles=cost.roles)
    assert predict_request(sim1, len(prompt), plain, n1) == predict_request(sim3, len(prompt), plain, n3)


def test_round_overhead_calibration_keeps_the_search_table() -> None:
    from runinfra_opt.predict.batch1 import Observation, calibrate_overheads, calibrate_round_overhead

    cost = fit_cost_model(_samples())
    calibrated = calibrate_overheads(cost, [Observation(20, 10, 0.03, 0.6), Observation(40, 10, 0.05, 0.7)])
    variant = Variant("ngram", lookahead=4, ngram_max=2)
    sim = simulate_ngram([5, 6, 7, 5, 6], [7, 5, 6, 7, 9, 9, 9], 4, 2, {2}, 100)
    again = calibrate_round_overhead(calibrated, "ngram", [(sim, 5, variant, 0.1, 1.0)])
    assert again.search == cost.search


def test_prompt_lookup_search_cases_scan_without_match_and_extract_the_asked_candidates() -> None:
    """The timed searches do what their samples claim: `scan` proposes nothing (every size scanned), `extract`
    proposes exactly c candidates, none an EOS, with a small vocabulary too (ids repeat)."""
    from runinfra_opt.engine.hf.cost import measure_prompt_lookup_search, prompt_lookup_search_cases

    cases = prompt_lookup_search_cases(40, max_size=3, eos_token_ids=[2], contexts=(16, 300), candidates=(1, 4))
    assert {(kind, tokens, context) for kind, tokens, context, _, _ in cases} == {
        *(("scan", w, c) for w in (1, 2, 3) for c in (16, 300)),
        *(("extract", n, c) for n in (1, 4) for c in (16, 300)),
    }
    for kind, tokens, context, generator, ids in cases:
        out, _ = generator.get_candidates(ids)
        proposed = out[0, context:].tolist()
        assert len(proposed) == (0 if kind == "scan" else tokens), (kind, tokens, context)
        assert 2 not in proposed
    samples = measure_prompt_lookup_search(
        40, max_size=2, eos_token_ids=[2], contexts=(16,), candidates=(1,), repeats=2
    )
    assert [(s.kind, s.tokens, s.role) for s in samples] == [
        ("scan", 1, "search:ngram"),
        ("scan", 2, "search:ngram"),
        ("extract", 1, "search:ngram"),
    ]
    assert all(s.seconds > 0 for s in samples)


# ---- ranking within a family -------------------------------------------------------------------------------


def _vr(name: str, variant: Variant, predicted: float, measured: float) -> VariantResult:
    return VariantResult(
        name=name,
        variant=variant.to_dict(),
        predicted=Summary(tokens_per_s=predicted),
        measured=Summary(tokens_per_s=measured),
        confirmed=True,
    )


def test_kendall_tau_per_method_family() -> None:
    results = RunResults(run_id="t", created_at="2026-12-01T00:00:00Z")
    ngram = [Variant("ngram", lookahead=k, ngram_max=2) for k in (1, 2, 4, 8)]
    early = [Variant("early_exit", lookahead=k, exit_layer=2) for k in (1, 2, 4)]
    results.variants = [_vr(v.name, v, p, m) for v, p, m in zip(ngram, (10, 20, 30, 40), (11, 19, 33, 38), strict=True)]
    results.variants += [_vr(v.name, v, p, m) for v, p, m in zip(early, (10, 20, 30), (30, 20, 10), strict=True)]
    results.variants.append(_vr("baseline", BASELINE, 15, 15))
    by_method = {f.method: f for f in family_rankings(results)}
    assert set(by_method) == {"ngram", "early_exit"}  # the baseline is no family
    assert by_method["ngram"].tau == pytest.approx(1.0)
    assert by_method["early_exit"].tau == pytest.approx(-1.0)
    assert by_method["early_exit"].predicted_best == early[2].name
    assert by_method["early_exit"].measured_best == early[0].name
    assert kendall_tau([1.0], [2.0]) is None


# ---- --repeats auto: the stopping rule ---------------------------------------------------------------------


def test_parse_repeats() -> None:
    assert parse_repeats("auto") is None
    assert parse_repeats("3") == 3
    with pytest.raises(UserInputError, match="--repeats 0: must be >= 1"):
        parse_repeats("0")
    with pytest.raises(UserInputError, match="expected auto or a whole number"):
        parse_repeats("many")


def test_relative_mad() -> None:
    assert relative_mad([10.0, 10.0, 10.0]) == 0.0
    assert relative_mad([15.0, 17.0, 12.0]) == pytest.approx(2.0 / 15.0)
    assert relative_mad([]) is None


LEADER = Variant("ngram", lookahead=4, ngram_max=2)
RUNNER = Variant("ngram", lookahead=2, ngram_max=2)
REQUESTS = 8


def _records(seconds: list[float], repeats: int = 2) -> list[RequestRecord]:
    """REQUESTS x repeats records of 50 tokens; request i in repeat r takes seconds[(i + r) % len(seconds)]."""
    return [
        RequestRecord(
            request_id=f"r{i}",
            category="c",
            repeat=r,
            prompt_tokens=10,
            output_tokens=50,
            ttft_s=0.1,
            e2e_s=seconds[(i + r) % len(seconds)],
            target_passes=10,
            lossless=True,
        )
        for r in range(repeats)
        for i in range(REQUESTS)
    ]


def _state(
    tmp_path: Path, leader: list[float], runner: list[float], *, min_speedup: float = 1.05, priority: str = "throughput"
) -> RunState:
    results = RunResults(
        run_id="t",
        created_at="2026-12-01T00:00:00Z",
        plan=Plan(
            request_ids=[f"r{i}" for i in range(REQUESTS)],
            repeats=2,
            estimate_s=0,
            budget_s=0,
            max_tokens=50,
            confirm=[BASELINE.name, LEADER.name, RUNNER.name],
        ),
    )
    config = OptimizeConfig(objective=Objective(min_speedup=min_speedup))
    # set after the checks: `--priority capacity` needs a serving engine, which `assess` never reads
    object.__setattr__(config, "objective", Objective.parse(priority, min_speedup=min_speedup))
    state = RunState(config=config, run_dir=tmp_path, results=results, reporter=Silent())
    state.space = [BASELINE, LEADER, RUNNER]
    state.requests = [Request(id=f"r{i}", line=i + 1, prompt="x") for i in range(REQUESTS)]
    for variant, seconds in ((BASELINE, [5.0]), (LEADER, leader), (RUNNER, runner)):
        state.variant_result(variant).measured_requests = _records(seconds)
    return state


def test_a_clear_winner_needs_no_more_repeats(tmp_path: Path) -> None:
    certainty, more = extend.assess(_state(tmp_path, leader=[2.5, 2.6], runner=[4.0, 4.1]))
    assert certainty.clear
    assert more == []
    assert certainty.leader == LEADER.name
    assert certainty.runner_up == RUNNER.name
    assert certainty.vs_baseline is not None
    assert certainty.vs_baseline.low > 1.05
    assert certainty.summary.startswith("clear: ")
    assert "lies above the 1.05 threshold" in certainty.summary


def test_a_gain_straddling_min_speedup_asks_for_repeats_of_the_baseline_and_the_leader(tmp_path: Path) -> None:
    # Per-request ratios 1.16 and 0.96: about 1.05x overall, the interval straddles --min-speedup 1.05.
    certainty, more = extend.assess(_state(tmp_path, leader=[4.3, 5.2], runner=[6.0, 6.1]))
    assert not certainty.clear
    assert certainty.vs_baseline is not None
    assert certainty.vs_baseline.low < 1.05 < certainty.vs_baseline.high
    assert "straddles the 1.05 threshold" in certainty.summary
    assert [v.name for v in more] == [BASELINE.name, LEADER.name]  # the runner-up cannot pay: not timed again
    # The same measurements are clear against a threshold far above them.
    certainty, more = extend.assess(_state(tmp_path, leader=[4.3, 5.2], runner=[6.0, 6.1], min_speedup=1.5))
    assert certainty.clear
    assert "lies below the 1.50 threshold" in certainty.summary
    assert more == []


@pytest.mark.parametrize("priority", ["throughput", "capacity"])
def test_how_sure_names_the_figure_it_judged(tmp_path: Path, priority: str) -> None:
    """Under `--priority capacity` the certainty still judges the batch-1 throughput ratio, and says so (it once
    labelled that ratio "capacity")."""
    certainty, _ = extend.assess(_state(tmp_path, leader=[2.5, 2.6], runner=[4.0, 4.1], priority=priority))
    assert f"{LEADER.name} vs the baseline (throughput at batch 1) " in certainty.summary
    assert "capacity" not in certainty.summary


def test_an_unclear_order_of_two_paying_candidates_times_both_again(tmp_path: Path) -> None:
    certainty, more = extend.assess(_state(tmp_path, leader=[2.2, 2.9], runner=[2.9, 2.25]))
    assert not certainty.clear
    assert "straddles 1.00" in certainty.summary
    assert {v.name for v in more} == {BASELINE.name, LEADER.name, RUNNER.name}


def test_equivalent_candidates_are_clear_enough(tmp_path: Path) -> None:
    certainty, more = extend.assess(_state(tmp_path, leader=[2.50, 2.51], runner=[2.51, 2.52]))
    assert certainty.clear
    assert "within 2% either way" in certainty.summary
    assert more == []


def test_the_leader_is_the_variant_the_decision_picks_from_a_tie(tmp_path: Path) -> None:
    """Within 1% of the fastest the simpler variant wins the decision (`select`); the certainty speaks of it, with
    the faster one as its runner-up, not of the fastest."""
    state = _state(tmp_path, leader=[2.50], runner=[2.52])  # k 4 0.8% faster than k 2: a tie, k 2 wins
    certainty, _ = extend.assess(state)
    assert certainty.leader == RUNNER.name
    assert certainty.runner_up == LEADER.name
    assert certainty.summary.startswith(f"clear: {RUNNER.name} vs the baseline")
    # 2% apart is no tie: the fastest leads
    certainty, _ = extend.assess(_state(tmp_path, leader=[2.45], runner=[2.50]))
    assert certainty.leader == LEADER.name


def test_a_lossy_candidate_is_never_the_leader(tmp_path: Path) -> None:
    state = _state(tmp_path, leader=[2.0], runner=[4.0])
    for record in state.variant_result(LEADER).measured_requests[:1]:
        record.lossless = False
    certainty, _ = extend.assess(state)
    assert certainty.leader == RUNNER.name


def test_reports_say_how_sure_the_decision_is() -> None:
    from runinfra_opt.report import render_markdown
    from runinfra_opt.results import Certainty
    from tests.report_fixtures import build_results

    results = build_results()
    assert "How sure:" not in render_markdown(results)
    results.certainty = Certainty(clear=False, summary="unclear: x vs the baseline straddles the 1.05 threshold.")
    assert "How sure: unclear: x vs the baseline straddles the 1.05 threshold." in render_markdown(results)


def test_an_engine_that_cannot_interleave_gets_the_certainty_without_added_repeats(tmp_path: Path) -> None:
    class ServerPerVariant:
        name = "fake"
        interleaves = False

        def generate(self, *args: object, **kwargs: object) -> RequestRecord:
            raise AssertionError("no repeat may be added")

    state = _state(tmp_path, leader=[4.3, 5.2], runner=[6.0, 6.1])  # unclear: repeats would be added if possible
    state.engine = ServerPerVariant()  # type: ignore[assignment]
    extend.run(state)
    assert state.results.certainty is not None
    assert not state.results.certainty.clear
    assert "No repeats added: the fake engine times variant by variant" in state.results.certainty.summary
    assert state.plan.added == []


def test_calibration_times_each_method_at_its_smallest_middle_and_largest_lookahead() -> None:
    """The round terms are fitted from runs at several lookaheads (the cost per drafted token needs a spread),
    each with the representative's other settings (max n-gram size 2 here), not the first variant found at that
    lookahead (n1)."""
    from runinfra_opt.optimize.phases.profile import _calibration_variants

    space = [Variant("baseline"), *(Variant("ngram", lookahead=k, ngram_max=1) for k in (1, 8))]
    space += [Variant("ngram", lookahead=k, ngram_max=2) for k in (1, 2, 4, 8)]
    space += [Variant("early_exit", lookahead=k, exit_layer=3) for k in (2, 3)]
    names = [v.name for v in _calibration_variants(space)]
    assert names == ["ngram-n2-k4", "ngram-n2-k1", "ngram-n2-k8", "early_exit-l3-k3", "early_exit-l3-k2"]
    # one lookahead in the space: one variant, as before
    assert [v.name for v in _calibration_variants([Variant("ngram", lookahead=2, ngram_max=2)])] == ["ngram-n2-k2"]
