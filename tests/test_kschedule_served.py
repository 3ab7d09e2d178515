"""The k schedule end to end: `optimize --engine vllm --load concurrency:1,4` through the real CLI on the stand-in
server (tests/fake_vllm, FAKE_VLLM_STEP=batch), which proposes, measures and writes (or not) a schedule. The rules
themselves, on results built in code: tests/test_kschedule.py.

Quiet (tests/conftest.py): each level here is 12 short requests, under a second of timing, so one stall of a few
tenths of a second in a fixed k's level (a machine busy with real vLLM servers) drags the lower bound of its ratio
to the baseline below another k's, and the rule's choices, rightly, change (`git show
e14cd7e:docs/measurements.md`, Experiments without a script, 2026-12-07 03:20)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.results import RunResults, VariantResult, load_results
from tests.test_optimize_vllm_load import PROMPTS


@pytest.mark.quiet
@pytest.mark.parametrize("mode", ["batch", "batch_bad"])
def test_a_k_schedule_is_measured_as_a_variant_and_written_only_when_better(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """On the stand-in a step costs more with the batch and the square of k (FAKE_VLLM_STEP), so k 8 wins alone
    and k 2 at 4 in flight: the schedule built from those choices is launched, timed at batch 1 and at both
    levels. `batch_bad` is a server that ignores the schedule and always drafts 8: it measures worse than the
    fixed k 2 at concurrency 4, and is not written."""
    monkeypatch.setenv("FAKE_VLLM_STEP", mode)
    path = tmp_path / "w.jsonl"
    rows = [{"id": f"r{i}", "category": "copy", "prompt": f"{PROMPTS[i % len(PROMPTS)]} {i}"} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["optimize", "--engine", "vllm", "--vllm-python", fake_vllm, "--target", str(tiny_models[0])]
    args += ["--workload", str(path), "--methods", "vllm_ngram", "--lookahead", "2,8", "--ngram-max", "3"]
    args += ["--max-tokens", "24", "--repeats", "1", "--load", "concurrency:1,4", "--run-dir", str(tmp_path / "run")]
    args += ["--out", str(tmp_path / "m.yaml")]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code in (0, 4), result.output
    results = load_results(tmp_path / "run" / "results.json")
    assert results.load is not None
    schedule = results.load.schedule
    assert schedule is not None, _measured_levels(results)
    assert schedule.built_from == {"concurrency:1": "vllm_ngram-m1-n3-k8", "concurrency:4": "vllm_ngram-m1-n3-k2"}
    assert schedule.schedule == [[1, 2, 8], [3, 1024, 2]]
    measured = results.variant(schedule.variant)
    assert measured is not None
    assert measured.confirmed  # timed at batch 1 against the baseline's outputs, like any variant
    assert len(measured.measured_requests) == 12
    assert [lr.level for lr in measured.load] == ["concurrency:1", "concurrency:4"]
    assert [launch["variant"] for launch in results.launches][-1] == schedule.variant
    k2, k8 = results.variant("vllm_ngram-m1-n3-k2"), results.variant("vllm_ngram-m1-n3-k8")
    assert k2 is not None
    assert k8 is not None
    mine, fixed, eight = (_tokens_at(vr, "concurrency:4") for vr in (measured, k2, k8))
    manifest = (tmp_path / "m.yaml").read_text()
    if mode == "batch_bad":
        assert mine < 0.8 * fixed  # it drafted 8 at 4 in flight
        assert not schedule.written
        assert not schedule.verified
        assert schedule.reason.startswith("not written")  # the first level it falls short at (here 4, or 1 by noise)
        assert results.decision is not None
        assert results.decision.winner != schedule.variant
        assert "num_speculative_tokens_per_batch_size" not in manifest
        assert all(d.winner != schedule.variant for d in results.load.decisions)
        assert any(schedule.variant in n.text and "not written" in n.text for n in results.notes)
    else:
        assert mine > 1.5 * eight  # the server followed the schedule: k 2, not 8, at 4 in flight
        assert schedule.written == schedule.verified
        if results.decision is not None and results.decision.winner == schedule.variant:
            assert "num_speculative_tokens_per_batch_size" in manifest


def _measured_levels(results: RunResults) -> str:
    """What the k-schedule rule chose from, as the report's load table renders it (every variant's tokens/s and
    paired ratio per level, its status), and the run's notes."""
    from runinfra_opt.report.load import columns, table_cells

    rows = [" | ".join(columns(results))] + [" | ".join(cells) for cells in table_cells(results)]
    return "\n".join(rows + [note.text for note in results.notes])


def _tokens_at(vr: VariantResult, level: str) -> float:
    found = next(lr for lr in vr.load if lr.level == level)
    assert found.metrics.output_tokens_per_s is not None
    return found.metrics.output_tokens_per_s.value
