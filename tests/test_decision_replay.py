"""The run's decision replayed over recorded run directories (tests/fixtures/runs/, see the README there): the one
decision (`optimize.decision.decide`) over each run's stored results gets the decision that run stored, at batch 1,
at each load level, on capacity and for a k schedule, except where the stored decision broke the documented rule
(`CORRECTED`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runinfra_opt.objective import Objective
from runinfra_opt.optimize.decision import decide
from runinfra_opt.optimize.kschedule import verify
from runinfra_opt.results import Decision, RunResults, load_results

RUNS = Path(__file__).parent / "fixtures" / "runs"
NAMES = sorted(path.name for path in RUNS.iterdir() if (path / "results.json").is_file())

CORRECTED: dict[str, dict[str, Any]] = {
    # `--priority capacity` with a recorded load and a budget of one rate per server: every server kept up at the
    # one rate it was offered, so capacity decides nothing; the run then kept the recorded load's winner (the
    # baseline: every variant streams the offered load there), which the rule says never decides a fallback. The
    # fallback is throughput at the most loaded closed-loop level, as for `--priority throughput`.
    "capacity-undecided": {"winner": "vllm_ngram-m1-n3-k2", "speculation": True},
}


def _stored(name: str) -> tuple[RunResults, Decision]:
    results = load_results(RUNS / name / "results.json")
    assert results.decision is not None
    return results, results.decision


def _replay(results: RunResults) -> Decision:
    objective = Objective.from_dict(results.config)
    return decide(results, objective, seed=int(results.config.get("seed", 0)))


def _scopes(results: RunResults) -> dict[str, Any]:
    """What each scope stored beside the run's decision."""
    return {
        "levels": [d.model_dump() for d in results.load.decisions] if results.load else None,
        "crossovers": [c.model_dump() for c in results.load.crossovers] if results.load else None,
        "capacity": (results.capacity.winner, results.capacity.reason) if results.capacity else None,
        "ruled_out": {vr.name: vr.ruled_out for vr in results.variants},
        "disqualified": {vr.name: vr.disqualified for vr in results.variants},
    }


@pytest.mark.parametrize("name", NAMES)
def test_the_decision_replays_to_what_the_run_stored(name: str) -> None:
    results, stored = _stored(name)
    scopes = _scopes(results)
    replayed = _replay(results)
    assert _scopes(results) == scopes  # every scope's own view as stored
    fields = set(Decision.model_fields) - {"queue"}  # the queue is a simulation from the workload's arrivals
    expected = stored.model_dump(include=fields)
    got = replayed.model_dump(include=fields)
    corrected = CORRECTED.get(name)
    if corrected is None:
        assert got == expected
        return
    assert {key: got[key] for key in corrected} == corrected
    assert {key: expected[key] for key in corrected} != corrected  # the run stored something else


def test_the_recorded_runs_cover_every_scope() -> None:
    """Batch 1 alone, load levels, capacity (decided and not), a k schedule, a disqualified winner."""
    kinds = set()
    assert len(NAMES) >= 5
    for name in NAMES:
        results, decision = _stored(name)
        if results.load is None and results.capacity is None:
            kinds.add("batch 1")
        if results.load is not None and results.load.decisions:
            kinds.add("load levels")
        if results.capacity is not None:
            kinds.add("capacity decided" if results.capacity.winner else "capacity undecided")
        if results.load is not None and results.load.schedule is not None and results.load.schedule.written:
            kinds.add("k schedule")
        if decision.disqualified:
            kinds.add("disqualified")
    assert kinds == {
        "batch 1", "load levels", "capacity decided", "capacity undecided", "k schedule", "disqualified"
    }  # fmt: skip


def test_a_k_schedule_check_replays_to_what_the_run_stored() -> None:
    results, _ = _stored("k-schedule")
    assert results.load is not None
    schedule = results.load.schedule
    assert schedule is not None
    assert verify(results, schedule) == schedule


def test_a_fallback_never_decides_at_the_recorded_load() -> None:
    """The corrected run: capacity decides nothing under `--priority capacity`, and the decision is throughput at
    the most loaded closed-loop level, with the recorded load's own decision quoted, not taken."""
    results, _ = _stored("capacity-undecided")
    decision = _replay(results)
    assert results.load is not None
    (at_2,) = [d for d in results.load.decisions if d.level == "concurrency:2"]
    (replay,) = [d for d in results.load.decisions if d.level == "replay"]
    assert replay.winner == "baseline"
    assert (decision.winner, decision.gain) == (at_2.winner, at_2.gain)
    assert decision.reason.startswith("Capacity does not decide (--priority capacity; ")
    assert "by throughput at concurrency:2, the most loaded level measured: " in decision.reason
    assert "(The recorded load, which a fallback never decides by: At the recorded load (replay)" in decision.reason


@pytest.mark.parametrize(("name", "answered"), [("capacity", True), ("capacity-undecided", False)])
def test_the_report_and_the_manifest_agree_on_a_capacity_answer(name: str, answered: bool, tmp_path: Path) -> None:
    """A capacity that decides nothing gives no server count in the report and no capacity section in the manifest
    (the report once showed a server count the manifest did not carry); a decided one gives both."""
    from runinfra_opt.manifest import build_manifest
    from runinfra_opt.report.capacity import markdown_section

    results, _ = _stored(name)
    results.decision = _replay(results)
    assert results.capacity is not None
    assert results.capacity.answered == answered
    manifest = build_manifest(results)
    page = "\n".join(markdown_section(results))
    rows = [line.split("|") for line in page.splitlines() if line.startswith("| ") and "variant" not in line]
    servers = [cells[3].strip().strip("*") for cells in rows if len(cells) > 3 and not set(cells[1]) <= {"-", " "}]
    assert servers
    if answered:
        assert str(manifest["capacity"]["servers"]) in servers  # the winner's count, in both
        assert "No capacity answer" not in page
    else:
        assert "capacity" not in manifest
        assert servers == [""] * len(servers)
        assert "No capacity answer in this run" in page
