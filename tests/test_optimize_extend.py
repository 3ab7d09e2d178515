"""`optimize --repeats auto` through the CLI on the tiny models: repeats added to the leading candidates are
recorded before they are timed (a resume does not time them again), and a drifting baseline repeat is
re-measured once and reported."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.hf.engine import HFEngine
from runinfra_opt.methods import BASELINE
from runinfra_opt.optimize.phases import extend
from runinfra_opt.results import load_results
from tests.test_optimize import TINY_WORKLOAD, _args


@pytest.fixture
def tiny_workload(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TINY_WORKLOAD), encoding="utf-8")
    return path


def _auto_args(tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path, *extra: str) -> list[str]:
    args = _args(tiny_models, workload, tmp_path, "--methods", "ngram", "--confirm", "1", *extra)
    args[args.index("--repeats") + 1] = "auto"
    return args


def _count_extend_calls(monkeypatch: pytest.MonkeyPatch, *, interrupt_at: int | None = None) -> list[tuple[str, int]]:
    """Record every timed generation made by the extend phase; raise KeyboardInterrupt at the n-th one."""
    calls: list[tuple[str, int]] = []
    inside = {"on": False, "interrupted": False}
    real_fill, real_generate = extend._fill, HFEngine.generate

    def fill(state: Any, warmed: set[str]) -> None:
        inside["on"] = True
        try:
            real_fill(state, warmed)
        finally:
            inside["on"] = False

    def generate(self: HFEngine, request: Any, variant: Any, *, max_tokens: int, repeat: int = 0) -> Any:
        if inside["on"] and max_tokens > 8:  # warm-ups (8 tokens) are not counted
            if interrupt_at is not None and len(calls) + 1 == interrupt_at and not inside["interrupted"]:
                inside["interrupted"] = True  # once: the resume runs through
                raise KeyboardInterrupt
            calls.append((variant.name, repeat))
        return real_generate(self, request, variant, max_tokens=max_tokens, repeat=repeat)

    monkeypatch.setattr(extend, "_fill", fill)
    monkeypatch.setattr(HFEngine, "generate", generate)
    return calls


def test_repeats_auto_adds_repeats_until_clear_and_a_resume_does_not_redo_them(
    runner: CliRunner,
    tiny_models: tuple[Path, Path],
    tiny_workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_assess = extend.assess

    def unclear_until_two_added(state: Any) -> Any:
        certainty, more = real_assess(state)
        if len(state.plan.added) < 2:  # the tiny models' answer is clear or not by chance: force two rounds
            certainty.clear = False
            more = [BASELINE] + [v for v in state.space if v.name == certainty.leader]
        return certainty, more

    monkeypatch.setattr(extend, "assess", unclear_until_two_added)
    monkeypatch.setattr(extend, "MAX_ADDED_REPEATS", 2)
    monkeypatch.setattr(extend, "SPREAD_LIMIT", float("inf"))  # tiny models' ms timings drift: not this test's subject
    calls = _count_extend_calls(monkeypatch, interrupt_at=3)
    run_dir = tmp_path / "run"
    first = runner.invoke(app, _auto_args(tiny_models, tiny_workload, tmp_path, "--run-dir", str(run_dir)))
    assert first.exit_code == 130, first.output
    partial = load_results(run_dir / "results.json")
    assert partial.phase == "confirm"
    assert partial.plan is not None
    assert len(partial.plan.added) == 1  # fixed in the plan before it was timed
    before = list(calls)
    assert len(before) == 2

    calls.clear()
    second = runner.invoke(app, ["optimize", "--resume", str(run_dir), "--out", str(tmp_path / "m.yaml")])
    assert second.exit_code == 0, second.output
    assert "How sure:" in second.stdout
    final = load_results(run_dir / "results.json")
    assert final.status == "complete"
    assert final.plan is not None
    planned = final.plan.repeats
    assert [a.repeat for a in final.plan.added] == [planned, planned + 1]
    assert all(a.variants == ["baseline", "ngram-n2-k2"] for a in final.plan.added)
    for name in ("baseline", "ngram-n2-k2"):
        vr = final.variant(name)
        assert vr is not None
        keys = Counter((r.request_id, r.repeat) for r in vr.measured_requests)
        assert max(keys.values()) == 1  # nothing timed twice
        assert len(keys) == len(TINY_WORKLOAD) * (planned + 2)
    # Every generation of the added repeats happened exactly once across the two invocations.
    assert len(before) + len(calls) == 2 * 2 * len(TINY_WORKLOAD)
    assert Counter(before + calls) == {(name, r): len(TINY_WORKLOAD) for name in ("baseline", "ngram-n2-k2")
                                       for r in (planned, planned + 1)}  # fmt: skip
    assert final.certainty is not None
    assert final.certainty.added_repeats == 2
    assert final.certainty.leader == "ngram-n2-k2"
    winner = final.variant("ngram-n2-k2")
    assert winner is not None
    assert winner.measured is not None
    assert winner.measured.output_tokens == sum(r.output_tokens for r in winner.measured_requests)


def test_a_drifting_baseline_repeat_is_measured_again_once_and_reported(
    runner: CliRunner,
    tiny_models: tuple[Path, Path],
    tiny_workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(extend, "SPREAD_LIMIT", -1.0)  # every spread counts as drift
    monkeypatch.setattr(extend, "MAX_ADDED_REPEATS", 0)
    calls = _count_extend_calls(monkeypatch)
    run_dir = tmp_path / "run"
    result = runner.invoke(app, _auto_args(tiny_models, tiny_workload, tmp_path, "--run-dir", str(run_dir)))
    assert result.exit_code == 0, result.output
    final = load_results(run_dir / "results.json")
    assert final.plan is not None
    assert len(final.plan.remeasured) == 1  # once, even though the spread still counts as drift
    again = final.plan.remeasured[0]
    assert Counter(calls) == {("baseline", again): len(TINY_WORKLOAD), ("ngram-n2-k2", again): len(TINY_WORKLOAD)}
    notes = [n.text for n in final.notes if "the baseline drifted" in n.text]
    assert len(notes) == 1
    assert f"repeat {again + 1} was rejected and measured again" in notes[0]
    for name in ("baseline", "ngram-n2-k2"):
        vr = final.variant(name)
        assert vr is not None
        keys = Counter((r.request_id, r.repeat) for r in vr.measured_requests)
        assert max(keys.values()) == 1
        assert len(keys) == len(TINY_WORKLOAD) * final.plan.repeats
    assert final.certainty is not None
    assert final.certainty.baseline_spread is not None


def test_an_explicit_repeats_keeps_the_fixed_plan(
    runner: CliRunner,
    tiny_models: tuple[Path, Path],
    tiny_workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(extend, "SPREAD_LIMIT", -1.0)
    calls = _count_extend_calls(monkeypatch)
    args = _args(tiny_models, tiny_workload, tmp_path, "--methods", "ngram", "--confirm", "1", "--json")
    result = runner.invoke(app, [*args, "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    final = load_results(tmp_path / "run" / "results.json")
    assert calls == []
    assert final.certainty is None
    assert final.plan is not None
    assert final.plan.added == []
    assert final.plan.remeasured == []
    assert json.loads(result.stdout)["certainty"] is None
