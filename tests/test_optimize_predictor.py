"""The run's predictor, chosen once from the engine's capabilities (`optimize.predictor`): which one, and why a
phase it has no step for is skipped (the end-to-end runs: tests/test_optimize.py, tests/test_optimize_vllm_predict.py,
tests/test_engine_capabilities.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from runinfra_opt.engine.protocol import Capability
from runinfra_opt.optimize.predictor import PREDICTING_PHASES, InProcess, Serving, choose, skipped
from runinfra_opt.results import RunResults

TRANSFORMERS = {Capability.PASS_COUNTS, Capability.PROFILE, Capability.COST_TABLE, Capability.EARLY_EXIT}
VLLM = {Capability.PASS_COUNTS, Capability.SERVE_LOAD, Capability.STEP_COSTS}


def _state(name: str, capabilities: set[Capability], strategy: str = "predictive", resumed: bool = False) -> Any:
    engine = SimpleNamespace(name=name, capabilities=frozenset(capabilities))
    results = RunResults(run_id="r", created_at="now")
    return SimpleNamespace(engine=engine, predictor=None, resumed=resumed, results=results,
                           config=SimpleNamespace(strategy=strategy))  # fmt: skip


@pytest.mark.parametrize(("capabilities", "kind"), [(TRANSFORMERS, InProcess), (VLLM, Serving)])
def test_the_engine_picks_its_predictor_once(capabilities: set[Capability], kind: type) -> None:
    state = _state("e", capabilities)
    choose(state)
    assert isinstance(state.predictor, kind)
    assert not state.results.notes


def test_the_in_process_predictor_runs_every_predicting_phase_and_the_serving_one_checks_no_cost_model() -> None:
    state = _state("transformers", TRANSFORMERS)
    choose(state)
    assert [skipped(state, phase) for phase in PREDICTING_PHASES] == [None] * len(PREDICTING_PHASES)
    state = _state("vllm", VLLM)
    choose(state)
    reasons = {phase: skipped(state, phase) for phase in PREDICTING_PHASES}
    assert reasons == dict.fromkeys(PREDICTING_PHASES) | {
        "check_cost": "the vllm engine has no cost_table, profile capability"
    }


def test_an_engine_that_feeds_no_predictor_skips_every_predicting_phase_with_a_note() -> None:
    state = _state("generate-only", {Capability.PASS_COUNTS})
    choose(state)
    assert state.predictor is None
    assert {skipped(state, phase) for phase in PREDICTING_PHASES} == {
        "the generate-only engine has no cost_table, profile capability"
    }
    assert [note.text for note in state.results.notes] == [
        "the generate-only engine cannot profile drafts or measure a cost table: every variant is timed "
        "(strategy exhaustive) and the cost, profile and predict phases are skipped"
    ]
    for strategy, resumed in (("exhaustive", False), ("predictive", True)):  # asked to time every variant; said
        state = _state("generate-only", {Capability.PASS_COUNTS}, strategy, resumed)
        choose(state)
        assert not state.results.notes
