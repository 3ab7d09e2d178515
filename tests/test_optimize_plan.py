"""Pure parts of `optimize`: the typed config, the search space, the budget plan, run directories."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import Variant
from runinfra_opt.methods.early_exit import default_exit_layers
from runinfra_opt.objective import Objective, parse_priority
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.options import parse_int_list, parse_methods
from runinfra_opt.optimize.plan import plan_requests, replan_confirmation, stratified_sample
from runinfra_opt.optimize.rundir import point_latest, resumed_run_dir
from runinfra_opt.optimize.space import SpaceSettings, build_space
from runinfra_opt.workload.model import Request


def test_priorities_and_aliases() -> None:
    assert parse_priority("throughput") == "throughput"
    assert parse_priority("first-token-latency") == "ttft"
    assert parse_priority("TTFT") == "ttft"
    with pytest.raises(UserInputError, match="available: throughput, ttft, first-token-latency"):
        parse_priority("speed")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--priority", "speed"], "--priority speed: unknown priority; available: throughput, ttft"),
        (["--percentile", "p42"], "--percentile p42: expected one of p50, p90, p95, p99"),
        (["--min-speedup", "0"], "--min-speedup 0.0: must be > 0"),
    ],
)
def test_a_bad_objective_option_exits_2_naming_it(
    runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["optimize", "--methods", "ngram", "--runs-dir", str(tmp_path / "runs"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "runs").exists()


def test_objective_parses_aliases_once() -> None:
    objective = Objective.parse(" First-Token-Latency ", "p90", max_ttft_ms=250.0)
    assert objective == Objective(priority="ttft", percentile="p90", max_ttft_ms=250.0)
    assert objective.measure.words == "TTFT"
    assert objective.figure == "TTFT p90"
    assert objective.text == "ttft (p90)"
    assert Objective().text == "throughput"
    assert Objective.from_dict({"priority": "ttft", "percentile": 95}).percentile == "p95"


def test_list_options_parse_repeated_and_comma_separated() -> None:
    assert parse_int_list("--lookahead", ["2,4", "8", "4"]) == (2, 4, 8)
    assert parse_int_list("--lookahead", []) is None
    with pytest.raises(UserInputError, match="--lookahead x: expected an integer"):
        parse_int_list("--lookahead", ["x"])
    assert parse_methods(["ngram,early-exit"]) == ("ngram", "early_exit")
    with pytest.raises(UserInputError, match="unknown method"):
        parse_methods(["medusa"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"confirm": 0}, "--confirm 0"),
        ({"repeats": 0}, "--repeats 0"),
        ({"max_ttft_ms": 0.0}, "--max-ttft-ms"),
        ({"max_ttft_regression": -0.1}, "--max-ttft-regression"),
        ({"budget_minutes": 0.0}, "--budget-minutes"),
        ({"methods": ("draft",)}, "needs at least one --draft"),
        ({"percentile": "p42"}, "--percentile p42"),
    ],
)
def test_config_rejects_bad_values(changes: dict[str, object], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        OptimizeConfig.from_dict(changes)


def test_config_round_trips_through_results_dict() -> None:
    objective = Objective(priority="ttft", max_ttft_ms=250.0)
    config = OptimizeConfig(objective=objective, drafts=("a", "b"), lookaheads=(2, 4), confirm=2)
    assert OptimizeConfig.from_dict(config.to_dict() | {"plan": {"x": 1}}) == config


def test_config_stores_the_objective_as_flat_keys_and_reads_old_runs() -> None:
    """results.json keeps the keys it always had, so `--resume` and `report` read runs written before the
    objective was one value; a nested `objective` mapping reads too."""
    config = OptimizeConfig(objective=Objective(priority="ttft", percentile="p90", min_speedup=1.1))
    data = config.to_dict()
    assert "objective" not in data
    assert {k: data[k] for k in ("priority", "percentile", "max_ttft_ms", "min_speedup", "require_speedup")} == {
        "priority": "ttft",
        "percentile": "p90",
        "max_ttft_ms": None,
        "min_speedup": 1.1,
        "require_speedup": False,
    }
    old = {"priority": "ttft", "percentile": "p90", "max_ttft_regression": 0.1, "engine": "transformers", "gone": 1}
    read = OptimizeConfig.from_dict(old)
    assert read.objective == Objective(priority="ttft", percentile="p90", max_ttft_regression=0.1)
    nested = OptimizeConfig.from_dict({"objective": {"priority": "first-token-latency", "min_speedup": 1.2}})
    assert nested.objective == Objective(priority="ttft", min_speedup=1.2)


def test_default_space_matches_issue() -> None:
    space = build_space(SpaceSettings(drafts=("d1", "d2")), num_layers=30)
    names = [v.name for v in space]
    assert names[0] == "baseline"
    assert sum(v.method == "ngram" for v in space) == 9 * 3
    assert {v.lookahead for v in space if v.method == "ngram"} == {1, 2, 3, 4, 5, 6, 8, 10, 12}
    assert {v.exit_layer for v in space if v.method == "early_exit"} == {8, 15, 22}
    assert {v.lookahead for v in space if v.method == "early_exit"} == {1, 2, 4, 6, 8}
    for draft in ("d1", "d2"):
        assert {v.lookahead for v in space if v.draft == draft} == {1, 2, 3, 4, 5, 6, 8, 10, 12, 16}
    assert len(space) == 1 + 27 + 15 + 20
    assert len(set(names)) == len(names)


def test_space_narrowed_and_widened() -> None:
    space = build_space(SpaceSettings(methods=("ngram",), lookaheads=(3, 20), ngram_max=(4,)), num_layers=4)
    assert [v.name for v in space] == ["baseline", "ngram-n4-k3", "ngram-n4-k20"]
    assert default_exit_layers(4) == (1, 2, 3)
    with pytest.raises(UserInputError, match="use 1..3"):
        build_space(SpaceSettings(exit_layers=(4,)), num_layers=4)
    with pytest.raises(UserInputError, match="distinct directory names"):
        build_space(SpaceSettings(methods=("draft",), drafts=("a/x", "b/x")), num_layers=4)
    assert Variant("draft", lookahead=2, draft="a/x") in build_space(SpaceSettings(drafts=("a/x",)), num_layers=4)


def _requests(counts: dict[str, int]) -> list[Request]:
    out = []
    for category, n in counts.items():
        out += [Request(id=f"{category}-{i}", line=len(out) + 1, category=category, prompt="x") for i in range(n)]
    return out


def test_stratified_sample_keeps_every_category_and_file_order() -> None:
    requests = _requests({"chat": 10, "code": 5, "json": 1})
    picked = stratified_sample(requests, 6, seed=0)
    assert len(picked) == 6
    cats = [r.category for r in picked]
    assert set(cats) == {"chat", "code", "json"}
    assert cats.count("chat") > cats.count("code") >= 1
    assert picked == [r for r in requests if r in picked]  # file order
    assert stratified_sample(requests, 6, seed=0) == picked  # deterministic
    assert len(stratified_sample(requests, 2, seed=1)) == 2
    assert stratified_sample(requests, 100, seed=0) == requests


def test_plan_fits_budget_and_says_what_was_subsampled() -> None:
    requests = _requests({"chat": 12, "code": 12})
    # 10 s per request; per request the plan costs 1.1 (baseline + profiling) + repeats x (1 + 3 x 0.8).
    plan = plan_requests(requests, lambda r: 10.0, budget_s=400.0, confirm=3, repeats=2, seed=0)
    assert plan.repeats == 2
    assert plan.estimate_s <= 400.0
    assert 1 <= len(plan.request_ids) < len(requests)
    assert plan.subsampled is not None
    assert "chat" in plan.subsampled
    assert "code" in plan.subsampled
    assert "budget" in plan.subsampled
    bigger = plan_requests(requests, lambda r: 10.0, budget_s=4000.0, confirm=3, repeats=2, seed=0)
    assert len(bigger.request_ids) > len(plan.request_ids)
    everything = plan_requests(requests, lambda r: 0.01, budget_s=4000.0, confirm=3, repeats=None, seed=0)
    assert everything.subsampled is None
    assert everything.repeats == 3
    capped = plan_requests(requests, lambda r: 0.01, budget_s=4000.0, confirm=3, repeats=None, seed=0, max_requests=4)
    assert len(capped.request_ids) == 4
    assert capped.subsampled is not None
    assert "cap of 4" in capped.subsampled
    tiny = plan_requests(requests, lambda r: 1000.0, budget_s=1.0, confirm=3, repeats=2, seed=0)
    assert len(tiny.request_ids) == 1  # never zero


def test_replan_confirmation_drops_candidates_before_single_repeats() -> None:
    assert replan_confirmation(remaining_s=1000, baseline_s=10, candidate_s=[8, 8, 8], repeats=3) == (3, 3)
    # 2 x (10 + 24) = 68 fits; 3 x 34 = 102 does not.
    assert replan_confirmation(remaining_s=70, baseline_s=10, candidate_s=[8, 8, 8], repeats=3) == (2, 3)
    # 2 x (10 + 16) = 52 fits before 1 x 34.
    assert replan_confirmation(remaining_s=55, baseline_s=10, candidate_s=[8, 8, 8], repeats=3) == (2, 2)
    assert replan_confirmation(remaining_s=1, baseline_s=10, candidate_s=[8, 8, 8], repeats=3) == (1, 1)


def test_latest_link_and_resume_resolution(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first, second = runs / "20260101T000000Z-aaaaaa", runs / "20260101T000100Z-bbbbbb"
    for run in (first, second):
        run.mkdir(parents=True)
        (run / "results.json").write_text("{}")
    point_latest(runs, first)
    point_latest(runs, second)
    assert resumed_run_dir("latest", runs) == second.resolve()
    assert resumed_run_dir(first.name, runs) == first.resolve()
    assert resumed_run_dir(str(first / "results.json"), runs) == first
    with pytest.raises(UserInputError, match="no run"):
        resumed_run_dir("nothing", runs)
