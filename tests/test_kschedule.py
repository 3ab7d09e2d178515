"""The k schedule (vLLM's `num_speculative_tokens_per_batch_size`): schedule variants (names, validation, batch-1
simulation, vLLM arguments) and `optimize.kschedule` (the choice rule per load level, the proposed ranges, the
verification that writes a schedule only when it measured better than every fixed k). Results are built in
code: no server."""

from __future__ import annotations

import json
import re

import pytest

from runinfra_opt.engine.vllm.args import ServeSettings, config_file_mapping
from runinfra_opt.errors import UserInputError
from runinfra_opt.manifest import build_manifest, validate_manifest, vllm_config_text
from runinfra_opt.methods import BASELINE, Variant, get_method, parse_variant_name
from runinfra_opt.methods.base import SimInput
from runinfra_opt.methods.k_schedule import KRange, k_at, parse_schedule, schedule_of, with_schedule
from runinfra_opt.methods.vllm_ngram import make
from runinfra_opt.optimize.kschedule import Candidate, choices_per_level, choose_k, propose, schedule_ranges, verify
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import Interval, KSchedule, LevelMetrics, LevelResult, RunResults, VariantResult
from tests.test_manifest import _results
from tests.test_manifest_vllm import _vllm_reads

K2, K4, K8 = (make(k, 1, 3) for k in (2, 4, 8))
LEVELS = ("concurrency:1", "concurrency:4", "concurrency:16")
BASE_TOKENS = {"concurrency:1": 30.0, "concurrency:4": 100.0, "concurrency:16": 140.0}
SCHEDULE = with_schedule(K2, parse_schedule("1-2:8,3-8:4,9-1024:2"))


def _level(level: str, ratio: float | None, *, half_width: float = 0.02, failed: int = 0) -> LevelResult:
    """A level measured at `ratio` x the baseline's tokens/s (None: the baseline itself), with a paired interval
    of +-`half_width`."""
    tokens = BASE_TOKENS[level] * (ratio or 1.0)
    metrics = LevelMetrics(
        level=level, description="closed loop", runs=2, requests=32, succeeded=32 - failed, failed=failed,
        windows=[], output_tokens_per_s=Interval(value=tokens, low=tokens * 0.97, high=tokens * 1.03),
        requests_per_s=1.0, ttft_s={}, tpot_s={}, itl_s={}, e2e_s={}, send_lag_s={}, late_requests=0,
        peak_in_flight=int(level.split(":")[1]),
    )  # fmt: skip
    vs = None if ratio is None else Interval(value=ratio, low=ratio - half_width, high=ratio + half_width)
    return LevelResult(level=level, metrics=metrics, vs_baseline=vs)


def _result(variant: Variant, ratios: dict[str, float | None]) -> VariantResult:
    load = [_level(level, ratio) for level, ratio in ratios.items()]
    return VariantResult(name=variant.name, variant=variant.to_dict(), load=load)


def _run(*variants: VariantResult) -> RunResults:
    baseline = _result(BASELINE, dict.fromkeys(LEVELS))
    return RunResults(run_id="r", created_at="2026-12-01T00:00:00Z", variants=[baseline, *variants])


def _fixed_k_run() -> RunResults:
    """k 8 pays most at concurrency 1, k 4 at 4, k 2 at 16 (as speculation's gain shrinks with the batch)."""
    return _run(
        _result(K2, {"concurrency:1": 1.20, "concurrency:4": 1.05, "concurrency:16": 1.10}),
        _result(K4, {"concurrency:1": 1.35, "concurrency:4": 1.15, "concurrency:16": 0.95}),
        _result(K8, {"concurrency:1": 1.50, "concurrency:4": 1.08, "concurrency:16": 0.85}),
    )


# ---- schedule variants -----------------------------------------------------------------------------------------


def test_schedule_variant_name_round_trips_and_is_a_file_name() -> None:
    assert SCHEDULE.name == "vllm_ngram-m1-n3-sched_1-2k8_3-8k4_9-1024k2"
    assert SCHEDULE.lookahead == 8
    assert parse_variant_name(SCHEDULE.name) == SCHEDULE
    assert Variant.from_dict(SCHEDULE.to_dict()) == SCHEDULE
    assert re.sub(r"[^A-Za-z0-9_.-]+", "_", SCHEDULE.name) == SCHEDULE.name  # the engine's log file name
    assert parse_variant_name(K4.name) == K4
    assert schedule_of(K4) is None
    assert SCHEDULE != K8
    method = get_method("vllm_ngram")
    assert method.family(SCHEDULE) == "vllm_ngram (match 1-3, k schedule)"  # not plotted as a fixed k 8
    assert method.family(K8) == "vllm_ngram (match 1-3)"
    assert SCHEDULE.name != K8.name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2-8:8,9-64:2", "the first range must start at batch size 1, not 2"),
        ("1-8:8,6-64:2", "range 6-64 overlaps or comes before 1-8"),
        ("1-8:8,9-64:8", "ranges 1-8 and 9-64 both have k 8: merge them"),
        ("1-8:8", "one range is a fixed k"),
        ("1-8:8,9-4:2", "range 9-4 ends before it starts"),
        ("1-8:8;9-64:2", r"'1-8:8;9-64:2' is not FIRST-LAST:K"),
    ],
)
def test_a_bad_schedule_is_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(UserInputError, match=message) as error:
        with_schedule(K2, parse_schedule(text))
    assert "\n" not in str(error.value)


def test_schedule_k_must_fit_the_lookahead() -> None:
    with pytest.raises(UserInputError, match="k 8 of range 1-2 is not between 0 and the lookahead 4"):
        Variant("vllm_ngram", lookahead=4, ngram_max=3, options=(("min", 1), ("schedule", "1-2:8,3-8:4")))
    with pytest.raises(UserInputError, match="the largest k is 4, but the variant's lookahead is 8"):
        Variant("vllm_ngram", lookahead=8, ngram_max=3, options=(("min", 1), ("schedule", "1-2:4,3-8:2")))


def test_k_at_follows_vllms_lookup() -> None:
    ranges = (KRange(1, 4, 3), KRange(8, 16, 1), KRange(17, 32, 0))
    assert [k_at(ranges, b) for b in (1, 4, 5, 7, 8, 16, 17, 500)] == [3, 3, 3, 3, 1, 1, 0, 0]


def test_schedule_simulates_its_batch_one_k() -> None:
    method = get_method("vllm_ngram")
    sim = SimInput(prompt_ids=[5, 6, 7, 8, 9, 5, 6], output_ids=[7, 8, 9, 5, 6, 7, 8, 9, 3], eos_token_ids=[2],
                   max_length=100)  # fmt: skip
    assert method.simulate(SCHEDULE, sim) == method.simulate(K8, sim)
    assert method.simulate(SCHEDULE, sim) != method.simulate(K2, sim)  # not vacuous: k matters on this request
    off_at_one = with_schedule(K2, parse_schedule("1-1:0,2-1024:4"))
    assert method.simulate(off_at_one, sim).target_passes == len(sim.output_ids)


def test_vllm_arguments_carry_the_schedule() -> None:
    config = ServeSettings(model="/cache/smol").server_config(SCHEDULE)
    args = config.serve_args()
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {
        "method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "num_speculative_tokens_per_batch_size": [[1, 2, 8], [3, 8, 4], [9, 1024, 2]],
    }  # fmt: skip
    manifest = build_manifest(_results(SCHEDULE))
    vllm = manifest["serving"]["vllm"]
    assert vllm["speculativeConfig"] == spec
    assert manifest["speculative"]["options"]["schedule"] == "1-2:8,3-8:4,9-1024:2"
    assert validate_manifest(manifest) == []
    vllm["speculativeConfig"]["num_speculative_tokens_per_batch_size"][0][0] = 0
    assert validate_manifest(manifest) != []  # the schema checks the ranges' shape
    vllm["speculativeConfig"] = spec
    text = vllm_config_text(manifest, "m.yaml")  # the `vllm serve --config` export
    assert _vllm_reads(text) == vllm["args"]
    assert config_file_mapping(vllm["args"])["speculative-config"] == spec


# ---- the choice rule -------------------------------------------------------------------------------------------


def test_rule_takes_the_smallest_k_within_one_percent_of_the_best_score() -> None:
    scores = [Candidate("baseline", 0, 1.0, True), Candidate("k2", 2, 1.20, True),
              Candidate("k4", 4, 1.245, True), Candidate("k8", 8, 1.25, True)]  # fmt: skip
    assert choose_k(scores).k == 4  # 1.245 >= 0.99 x 1.25; 1.20 is not
    assert choose_k([*scores[:3], Candidate("k8", 8, 1.30, True)]).k == 8
    # No speculation unless a k's gain is clear: a lower bound of 1.005 ties with the baseline's 1.
    assert choose_k([Candidate("baseline", 0, 1.0, True), Candidate("k4", 4, 1.005, True)]).k == 0


def test_rule_scores_the_lower_bound_not_the_point_estimate() -> None:
    """k 8 has the best point estimate at concurrency 1 but a wide interval: its lower bound loses to k 4's."""
    results = _run(
        _result(K4, {"concurrency:1": 1.30}),
        VariantResult(name=K8.name, variant=K8.to_dict(), load=[_level("concurrency:1", 1.40, half_width=0.25)]),
    )
    (family,) = choices_per_level(results)
    (choice,) = family.choices
    assert choice.chosen.name == K4.name
    assert {c.name: round(c.score, 3) for c in choice.candidates} == {"baseline": 1.0, K4.name: 1.28, K8.name: 1.15}


def test_without_a_paired_ratio_every_candidate_is_scored_unpaired() -> None:
    """Each its own tokens/s interval's lower bound over the baseline's point value, the baseline included."""
    k4 = _result(K4, {"concurrency:1": 1.30})
    k4.load[0].vs_baseline = None
    (family,) = choices_per_level(_run(k4, _result(K8, {"concurrency:1": 1.40})))
    scores = {c.name: round(c.score, 3) for c in family.choices[0].candidates}
    assert scores == {"baseline": 0.97, K4.name: 1.261, K8.name: 1.358}  # 0.97 x the ratio
    assert not family.choices[0].chosen.paired
    assert family.choices[0].chosen.name == K8.name


def test_disqualified_and_failing_variants_are_not_candidates() -> None:
    results = _fixed_k_run()
    k8 = results.variant(K8.name)
    assert k8 is not None
    k8.disqualified = "greedy output differs from the baseline on request r1"
    k4 = results.variant(K4.name)
    assert k4 is not None
    k4.load[0] = _level("concurrency:1", 1.35, failed=2)
    (family,) = choices_per_level(results)
    assert [c.chosen.k for c in family.choices] == [2, 4, 2]


def test_a_variant_that_saved_no_target_pass_is_not_a_candidate() -> None:
    """k 8's drafts were never accepted at batch 1 (every pass one token): its measured gains are noise, it cannot
    win (`decision.eligibility.saved_nothing`), and a schedule built from it could not either."""
    results = _fixed_k_run()
    k8 = results.variant(K8.name)
    assert k8 is not None
    k8.measured_requests = [
        RequestRecord(
            request_id=f"r{i}", category="chat", prompt_tokens=20, output_tokens=16, ttft_s=0.1, e2e_s=1.0,
            target_passes=16,
        )
        for i in range(3)
    ]
    (family,) = choices_per_level(results)
    assert [c.chosen.k for c in family.choices] == [4, 4, 2]
    assert all(K8.name not in {c.name for c in choice.candidates} for choice in family.choices)
    k8.measured_requests[0].target_passes = 15  # one pass produced two tokens: a candidate again
    (family,) = choices_per_level(results)
    assert [c.chosen.k for c in family.choices] == [8, 4, 2]


# ---- proposing -------------------------------------------------------------------------------------------------


def test_choices_that_differ_across_levels_make_a_schedule() -> None:
    proposed = propose(_fixed_k_run())
    assert proposed is not None
    variant, schedule = proposed
    assert variant == SCHEDULE
    assert schedule.variant == variant.name
    assert schedule.schedule == [[1, 2, 8], [3, 8, 4], [9, 1024, 2]]  # boundaries at sqrt(1x4), sqrt(4x16)
    assert schedule.built_from == {"concurrency:1": K8.name, "concurrency:4": K4.name, "concurrency:16": K2.name}
    assert not schedule.verified
    assert not schedule.written


def test_levels_with_the_same_choice_merge_and_k_zero_switches_speculation_off() -> None:
    results = _run(_result(K4, dict(zip(LEVELS, (1.30, 1.20, 0.90), strict=True))))
    ranges = schedule_ranges(choices_per_level(results)[0].choices)
    assert ranges == (KRange(1, 8, 4), KRange(9, 1024, 0))


def test_equal_choices_propose_nothing() -> None:
    results = _run(
        _result(K2, {"concurrency:1": 1.20, "concurrency:4": 1.10, "concurrency:16": 1.05}),
        _result(K4, {"concurrency:1": 1.30, "concurrency:4": 1.20, "concurrency:16": 1.10}),
    )
    assert [c.chosen.k for c in choices_per_level(results)[0].choices] == [4, 4, 4]
    assert propose(results) is None


def test_the_family_best_at_the_lowest_level_is_proposed() -> None:
    wide = [make(k, 2, 4) for k in (2, 8)]
    results = _run(
        _result(K2, {"concurrency:1": 1.20, "concurrency:16": 1.10}),
        _result(K8, {"concurrency:1": 1.50, "concurrency:16": 0.80}),
        _result(wide[0], {"concurrency:1": 1.25, "concurrency:16": 1.10}),
        _result(wide[1], {"concurrency:1": 1.70, "concurrency:16": 0.80}),
    )
    proposed = propose(results)
    assert proposed is not None
    assert proposed[0].name == "vllm_ngram-m2-n4-sched_1-4k8_5-1024k2"


# ---- verifying -------------------------------------------------------------------------------------------------


def _proposed(results: RunResults) -> KSchedule:
    proposed = propose(results)
    assert proposed is not None
    return proposed[1]


def test_a_schedule_better_than_every_fixed_k_is_written() -> None:
    results = _fixed_k_run()
    schedule = _proposed(results)
    results.variants.append(_result(SCHEDULE, dict(zip(LEVELS, (1.50, 1.16, 1.11), strict=True))))
    checked = verify(results, schedule)
    assert checked.verified, checked.reason
    assert checked.written
    assert checked.reason.startswith("written: measured at 3 level(s)")


def test_a_schedule_worse_than_a_fixed_k_at_a_covered_level_is_not_written() -> None:
    """Better on the whole (geometric mean) but 5% below k 2 at concurrency 16, where it should draft k 2."""
    results = _fixed_k_run()
    schedule = _proposed(results)
    results.variants.append(_result(SCHEDULE, dict(zip(LEVELS, (1.50, 1.16, 1.045), strict=True))))
    checked = verify(results, schedule)
    assert not checked.verified
    assert not checked.written
    assert "at concurrency:16 it measured 0.950x the fixed k 2 (vllm_ngram-m1-n3-k2)" in checked.reason, checked.reason


def test_a_schedule_no_better_than_its_parts_is_not_written() -> None:
    """Level by level as good as the best fixed k, but within 1% of k 8 overall: a tie goes to the fixed k."""
    results = _run(
        _result(K2, {"concurrency:1": 1.20, "concurrency:4": 1.10, "concurrency:16": 1.01}),
        _result(K8, {"concurrency:1": 1.50, "concurrency:4": 1.20, "concurrency:16": 1.00}),
    )
    schedule = KSchedule(
        variant=SCHEDULE.name, schedule=[[1, 2, 8], [3, 8, 4], [9, 1024, 2]], built_from=dict.fromkeys(LEVELS, "")
    )
    results.variants.append(_result(SCHEDULE, {"concurrency:1": 1.50, "concurrency:4": 1.20, "concurrency:16": 1.01}))
    checked = verify(results, schedule)
    assert not checked.written
    assert "against the fixed k 8 (vllm_ngram-m1-n3-k8) its tokens/s ratio has a geometric mean of 1.003" in (
        checked.reason
    )


def test_a_schedule_not_measured_everywhere_or_not_lossless_is_not_written() -> None:
    results = _fixed_k_run()
    schedule = _proposed(results)
    assert verify(results, schedule).reason == f"not written: {SCHEDULE.name} was not measured under load"
    measured = _result(SCHEDULE, {"concurrency:1": 1.50, "concurrency:4": 1.16})
    results.variants.append(measured)
    checked = verify(results, schedule)
    assert not checked.written
    assert "not measured at concurrency:16" in checked.reason
    measured.load.append(_level("concurrency:16", 1.11, failed=1))
    assert "at concurrency:16 1 of 32 requests failed" in verify(results, schedule).reason
    measured.load[-1] = _level("concurrency:16", 1.11)
    assert verify(results, schedule).written
    measured.disqualified = "greedy output differs from the baseline on request r3"
    checked = verify(results, schedule)
    assert not checked.written
    assert "request r3" in checked.reason
