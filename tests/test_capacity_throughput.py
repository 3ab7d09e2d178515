"""`--priority throughput` where the recorded arrivals do not saturate the server: the run decides by capacity, the
most traffic one server sustains, and says so (on the stand-in server's table engine, priced as tests/test_capacity.py
prices it). In a file of its own so that the suite's workers can run it beside test_capacity.py's served tests: both
are quiet and mostly wait on the stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.test_capacity import FAST, _optimize, _rows, table_server  # noqa: F401 (a fixture)


@pytest.mark.quiet
@pytest.mark.usefixtures("table_server")  # the stand-in's table engine, as tests/test_capacity.py prices it
def test_throughput_on_an_unsaturated_recorded_load_decides_by_capacity(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that batches every arrival kept up at every rate 12 requests can measure, however dear a sequence's
    # step: an arrival joins the next step, so its TTFT grows as the steps lengthen, never by half a request (the
    # queue rule), and a capacity seen only as a lower bound decides nothing (tests/test_capacity.py,
    # test_a_capacity_seen_only_as_a_lower_bound_ranks_nothing). Capped at 8 sequences a step (vLLM's max_num_seqs;
    # the step-cost probes step 8), later arrivals queue, and 24 requests (the 16 recorded, then 8 of them again: two
    # rounds, which the queue rule compares under a recorded pattern) measure up to ~29/s, above the baseline's knee
    # (~8/s): the search starts at that ceiling (the predictor has no cap) and steps down to it, bracketed or narrowed
    # as far as 6 rates go.
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps({**FAST, "max_num_seqs": 8}))
    path = tmp_path / "recorded.jsonl"
    path.write_text(_rows(arrivals=True, count=16))
    result, results = _optimize(
        runner, fake_vllm, tiny_models[0], path, tmp_path, "--load", "replay", "--confirm", "1",
        "--capacity-requests", "24",
    )  # fmt: skip
    summary = results.capacity
    assert summary is not None
    assert summary.why.startswith("the recorded load does not saturate the server")
    assert (summary.criterion, summary.arrivals) == ("saturation", "recorded pattern, scaled")
    launched = [vr for vr in results.variants if vr.confirmed]
    assert all(vr.capacity is not None and vr.capacity.levels for vr in launched)
    base = results.variant("baseline")
    assert base is not None
    assert base.capacity is not None
    assert base.capacity.status in ("bracketed", "stopped"), base.capacity  # the knee inside the rates tried
    assert base.capacity.measured is not None
    assert base.capacity.measured.high is not None  # a rate missed above it
    assert results.decision is not None
    reason = results.decision.reason
    assert reason.startswith("By capacity (the recorded load does not saturate the server"), reason
    assert "no SLO given: the highest rate the server keeps up with" in reason
    assert summary.winner is not None
    assert results.decision.winner == summary.winner
    if results.decision.winner != "baseline":
        assert "At the recorded load: e2e p50" in reason
    assert "capacity" in yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert "Capacity per server" in result.output
