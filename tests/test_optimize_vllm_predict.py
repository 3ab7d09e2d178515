"""The serving-engine predictor through the real CLI (`optimize --engine vllm`, strategy predictive) against the
stand-in server's table engine (tests/fake_vllm, FAKE_VLLM_STEP=table: an engine loop whose steps cost a known
function of the tokens they carry, a prefix cache, and vLLM's n-gram rule when a speculative config is given):
the step-cost table is measured on the baseline's server, every variant is predicted at batch 1 and at every load
level, and only the best `--confirm` candidates get a server of their own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.results import RunResults, load_results

COST: dict[str, Any] = {
    "fixed": 0.02, "per_seq": 0.004, "per_token": 0.003, "overhead": 0.01, "admit": 0.002,
    "spec_step": 0.006, "spec_token": 0.002, "bulk_after": 16, "bulk_token": 0.001,
}  # fmt: skip
"""Steps of 20 ms + 4 ms a sequence + 3 ms a token: a verification of k drafts costs 3k ms more than a decoding
step, so a long lookahead pays only where the drafts are accepted. A speculating server's steps cost 6 ms more,
and 2 ms more per drafted token, which the baseline's step-cost table cannot see (as on a real server). A prompt's
tokens past its 16th cost 1 ms each (the step-cost measurement's blockers and prefills stay shortish: 72 ms for
the first, 16-token blocker, which doubles when 8 probes' admission outlasts it on a loaded machine)."""

PROMPTS = [
    "alpha beta gamma delta alpha beta gamma delta alpha beta",  # the stand-in's output cycles its prompt
    "one two three four five six seven eight one two three four",
    "red green blue red green blue red green blue red green",
    "a b c d e f g h a b c d e f g h",
]


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    # 12 distinct prompts (no two share a cached prefix): enough for a measured window at concurrency 2
    rows = [
        {"id": f"r{i}", "category": "copy", "prompt": f"request {i}: {PROMPTS[i % len(PROMPTS)]}"} for i in range(12)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _optimize(
    runner: CliRunner, python: str, target: Path, workload: Path, tmp_path: Path, *extra: str
) -> tuple[Any, RunResults]:
    """`optimize --engine vllm` over the n-gram method (prompt_lookup_max 3) on the stand-in; exit code 0."""
    args = ["optimize", "--engine", "vllm", "--vllm-python", python, "--target", str(target)]
    args += ["--workload", str(workload), "--methods", "vllm_ngram", "--ngram-max", "3", *extra]
    args += ["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "m.yaml")]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result, load_results(tmp_path / "run" / "results.json")


@pytest.mark.quiet
def test_predictive_run_launches_only_the_baseline_and_the_confirmed_candidates(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_STEP", "table")
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps(COST))
    result, results = _optimize(
        runner, fake_vllm, tiny_models[0], workload, tmp_path,
        "--lookahead", "2,4,8", "--confirm", "2", "--load", "concurrency:1,2", "--max-tokens", "16", "--repeats", "2",
    )  # fmt: skip
    assert not {"cost", "predict", "repredict"} & set(results.phases_skipped)
    assert results.cost_model.serving is not None
    assert results.cost_model.in_process is None
    table = results.cost_model.serving.step_costs.table.model_dump()
    # as far as the run can use: at most 2 in flight, verifications of up to 8 drafts
    assert (table["batch_sizes"], table["tokens"]) == ([1, 2], [1, 2, 3, 5, 9])
    # prefills up to the first measured length that holds the two longest prompts together, and no further
    baseline = results.variant("baseline")
    assert baseline is not None
    two_longest = sum(sorted({r.request_id: r.prompt_tokens for r in baseline.measured_requests}.values())[-2:])
    lengths = [n for n, _ in table["prefill"]]
    assert lengths == [n for n in (64, 256, 512, 1024) if n < two_longest] + [
        next(n for n in (64, 256, 512, 1024) if n >= two_longest)
    ], (lengths, two_longest)
    # Predicted: every variant, at batch 1 and at both levels (the baseline too).
    grid = {"baseline", "vllm_ngram-m1-n3-k2", "vllm_ngram-m1-n3-k4", "vllm_ngram-m1-n3-k8"}
    names = {v.name for v in results.variants}
    schedules = names - grid  # a k schedule, when the levels' leaders differ (launched after confirmation)
    assert grid <= names, names
    assert all("-sched_" in name for name in schedules), names
    for vr in results.variants:
        assert vr.predicted is not None, vr.name
        assert [p.level for p in vr.load_predicted] == ["concurrency:1", "concurrency:2"], vr.name
        assert all(p.calibrated for p in vr.load_predicted), vr.name  # after confirmation: fitted to the baseline
    # Launched: the baseline's server (step costs, baseline pass, its levels) and two candidates (--confirm 2).
    launched = [launch["variant"] for launch in results.launches]
    assert launched[0] == "baseline"
    assert len(launched) == 3 + len(schedules), launched
    confirmed = [v for v in results.variants if v.confirmed and v.name in grid - {"baseline"}]
    assert sorted(v.name for v in confirmed) == sorted(set(launched[1:]) - schedules)
    extra = f", {len(schedules)} k schedule" if schedules else ""
    assert f"Servers: {len(launched)} launched (1 baseline, 2 candidate(s){extra}) for {len(names)} variants" in (
        " ".join(result.output.split())
    )
    # The speculative step terms: each timed variant's are fitted on the other timed ones only (held out), the
    # untimed variant's on all of them; they find at least the stand-in's known extra cost (6 ms a step, 2 ms a
    # drafted token: 22 ms a k8 step; its proposer, run in Python every step, adds some more of its own).
    assert results.cost_model.serving is not None
    assert results.cost_model.serving.spec_overhead is not None
    terms = results.cost_model.serving.spec_overhead.model_dump()
    timed = sorted({v.name for v in confirmed} | schedules)
    assert sorted(terms["held_out"]) == timed
    for name in timed:
        assert terms["held_out"][name]["fitted_on"] == [other for other in timed if other != name]
    assert terms["all"]["fitted_on"] == timed
    k8_step_extra = terms["all"]["step_s"] + 8 * terms["all"]["drafted_token_s"]
    assert k8_step_extra >= 0.8 * (0.006 + 8 * 0.002)
    # Under load the per-drafted-token term is fitted again per level on the other timed variants' decoding steps
    # there, the per-sequence one kept from batch 1 (at 2 in flight these short, well-accepted requests show too
    # few steps of two sequences to fit on; at 1, enough).
    assert "concurrency:1" in terms["levels"]
    assert set(terms["levels"]) <= {"concurrency:1", "concurrency:2"}
    for level, by_variant in terms["levels"].items():
        for name in timed:
            at_level = by_variant[name]
            assert at_level["fitted_on"] == [other for other in timed if other != name], (level, name)
            assert at_level["step_s"] == terms["held_out"][name]["step_s"]
    # Each confirmed candidate's prediction (with terms it was not fitted on) against its measurement, at
    # batch 1 and under load.
    for vr in confirmed:
        assert vr.measured is not None
        assert vr.predicted is not None
        assert vr.predicted.tokens_per_s == pytest.approx(vr.measured.tokens_per_s, rel=0.15), vr.name
        measured_levels = {lr.level: lr.metrics.output_tokens_per_s for lr in vr.load}
        for predicted in vr.load_predicted:
            got, want = predicted.metrics.output_tokens_per_s, measured_levels[predicted.level]
            assert got is not None
            assert want is not None
            assert got.value == pytest.approx(want.value, rel=0.2), (vr.name, predicted.level)
    # Unconfirmed variants keep their predictions and no measurement.
    for other in results.variants:
        if not other.confirmed:
            assert other.measured is None
            assert other.load == []


@pytest.mark.quiet
def test_without_prefix_cache_metrics_every_variant_is_timed(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    # The default stand-in has no cache metrics: the step costs cannot be measured, so nothing is predicted
    # and every variant gets a server (the reason is in the notes and in phases_skipped).
    _, results = _optimize(
        runner, fake_vllm, tiny_models[0], workload, tmp_path,
        "--lookahead", "2,4", "--confirm", "1", "--load", "none", "--max-tokens", "8", "--repeats", "1",
    )  # fmt: skip
    assert "step costs could not be measured" in results.phases_skipped["cost"]
    assert [launch["variant"] for launch in results.launches] == [
        "baseline", "vllm_ngram-m1-n3-k2", "vllm_ngram-m1-n3-k4"
    ]  # fmt: skip
    assert any("every variant is timed" in note.text for note in results.notes_of("left_out"))


@pytest.mark.quiet
def test_confirmation_chooses_one_candidate_at_a_time_and_stops_when_none_is_in_reach(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A speculating server's drafted tokens cost 40 ms each here, which the table measured on the baseline's
    # server cannot see: before anything speculative is timed every variant is predicted well ahead of the
    # baseline; once the first candidate has been timed, the speculative terms fitted on it put every other
    # variant more than 10% behind the measured baseline, so no other server is launched (3 slots).
    monkeypatch.setenv("FAKE_VLLM_STEP", "table")
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps(COST | {"spec_token": 0.04}))
    result, results = _optimize(
        runner, fake_vllm, tiny_models[0], workload, tmp_path,
        "--lookahead", "2,4,8", "--confirm", "3", "--load", "none", "--max-tokens", "16", "--repeats", "1",
    )  # fmt: skip
    assert results.plan is not None
    assert results.plan.confirm_slots == 3
    launched = [launch["variant"] for launch in results.launches]
    assert len(launched) == 2, launched
    assert results.plan.confirm == launched
    first = launched[1]
    ranking = results.profile["ranking_predicted_tokens_per_s"]
    assert all(ranking[name] > 1.2 * ranking["baseline"] for name in ranking if name != "baseline"), ranking
    assert first == max((n for n in ranking if n != "baseline"), key=lambda n: ranking[n])  # the first ranking's best
    baseline = results.variant("baseline")
    assert baseline is not None
    assert baseline.measured is not None
    for vr in results.variants:
        if vr.name in launched:
            continue
        assert vr.predicted is not None
        assert vr.measured is None
        assert vr.predicted.tokens_per_s < 0.9 * baseline.measured.tokens_per_s, vr.name  # out of reach, re-fitted
    assert results.plan.confirm_stopped is not None
    assert results.plan.confirm_stopped.startswith("confirmation stopped after 1 candidate(s) of 3")
    assert results.plan.confirm_stopped in [note.text for note in results.notes]
    assert "2 candidate slot(s) left unused" in " ".join(result.output.split())
    assert results.decision is not None
    assert results.decision.winner == "baseline"
