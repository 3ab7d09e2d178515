"""The step-cost measurement on the stand-in vLLM server in its table mode (tests/fake_vllm, FAKE_VLLM_STEP=table):
an engine loop that batches the requests waiting between steps, prices each step by a cost the test knows,
keeps a salted prefix cache in blocks, and delays every first token by a fixed client-visible overhead. The
measured table must recover the known step costs (not the TTFT, which carries the overhead); the real server is
measured in tests/test_vllm_e2e.py and benchmarks/vllm_step_costs.py."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from runinfra_opt.engine.vllm import metrics
from runinfra_opt.engine.vllm.args import ServerConfig
from runinfra_opt.engine.vllm.client import CompletionRequest, request_body
from runinfra_opt.engine.vllm.server import VllmServer
from runinfra_opt.engine.vllm.stepcost import StepCostError, StepCostGrid, measure_step_costs

COST: dict[str, Any] = {
    "fixed": 0.02,
    "per_seq": 0.005,
    "per_token": 0.004,
    "bump": {"3": 0.012},  # not monotonic in the tokens, as on a CPU (FACTS.md)
    "overhead": 0.025,
    "admit": 0.008,  # 4 probes take longer to reach the engine than a short blocker step
    "block_size": 32,
}
TOLERANCE = {"rel": 0.1, "abs": 0.006}
"""Thread wake-ups on a loaded 2-core machine move single trials by several ms; the medians stay close. Taking
the TTFT for the step (25 ms more) or timing probes that did not land in one step would not."""


def known_step_s(batch: int, tokens: int) -> float:
    return COST["fixed"] + batch * (COST["per_seq"] + COST["per_token"] * tokens + COST["bump"].get(str(tokens), 0.0))


def _server(fake_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cost: dict[str, Any]) -> VllmServer:
    monkeypatch.setenv("FAKE_VLLM_STEP", "table")
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps(cost))
    return VllmServer(fake_vllm, ServerConfig("m"), tmp_path, startup_timeout_s=30)


def test_measured_table_recovers_the_known_step_costs(
    fake_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _server(fake_vllm, tmp_path, monkeypatch, COST) as server:
        start = time.perf_counter()
        measured = measure_step_costs(
            server.base_url, server.api_key, server.model_name,
            StepCostGrid(batch_sizes=(1, 2, 4), tokens=(1, 3, 5), prefill_lengths=(16, 48), context=40, repeats=3),
            vocab_size=1000, blocker_tokens=1,  # too short for 4 probes to reach the engine: it must grow
        )  # fmt: skip
        outside_s = time.perf_counter() - start
    table = measured.table
    assert table.context == 64  # 40 rounded up to whole 32-token blocks
    assert measured.block_size == 32
    assert measured.checked_on_counters
    for i, batch in enumerate(table.batch_sizes):
        for j, tokens in enumerate(table.tokens):
            expected = known_step_s(batch, tokens)
            assert table.seconds[i][j] == pytest.approx(expected, **TOLERANCE), (batch, tokens)
    for length, seconds in table.prefill:
        assert seconds == pytest.approx(known_step_s(1, length), **TOLERANCE), length
    assert any(r["reason"].startswith("split") for r in measured.rejected)  # the 1-token blocker was too short
    assert all(t.spread_s < 0.5 * t.step_s for t in measured.trials)
    assert 0.5 * outside_s < measured.wall_s <= outside_s  # its own wall time, as timed around the call
    assert len(measured.trials) == 3 * (3 * 3 + 2)
    sweeps = [[(t.kind, t.batch, t.tokens) for t in measured.trials[i : i + 11]] for i in (0, 11, 22)]
    assert all(sorted(sweep) == sorted(sweeps[0]) for sweep in sweeps)  # every cell once a sweep
    assert [t.sweep for t in measured.trials] == [0] * 11 + [1] * 11 + [2] * 11
    assert len({tuple(sweep) for sweep in sweeps}) > 1  # in an order of its own (grid order biased the first cells)
    # a request's first token comes later than its step by the overhead: the table must not carry it
    assert measured.request_overhead_s is not None
    assert measured.request_overhead_s > COST["overhead"]  # + admission and HTTP: more under load
    assert measured.to_dict()["table"]["seconds"] == [list(row) for row in table.seconds]


def test_a_server_without_prefix_caching_is_refused(
    fake_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        _server(fake_vllm, tmp_path, monkeypatch, {**COST, "prefix_caching": False}) as server,
        pytest.raises(StepCostError, match="without prefix caching"),
    ):
        measure_step_costs(server.base_url, server.api_key, server.model_name, vocab_size=1000)


def test_probes_are_salted_and_counters_parse() -> None:
    body = request_body(CompletionRequest("p", 1, prompt=[1, 2], top_logprobs=0, cache_salt="s"), "m")
    assert body["cache_salt"] == "s"
    assert "cache_salt" not in request_body(CompletionRequest("p", 1, prompt=[1, 2]), "m")
    text = (
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf"} 2.0\n'
        'vllm:iteration_tokens_total_count{engine="0"} 2.0\n'
        'vllm:iteration_tokens_total_sum{engine="0"} 300.0\n'
        "# TYPE vllm:prompt_tokens_cached counter\n"
        'vllm:prompt_tokens_cached_total{engine="0"} 256.0\n'
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0"} 1.0\n'
    )
    counters = metrics.parse_counters(text)
    assert (counters.engine_steps, counters.step_tokens, counters.prompt_tokens_cached) == (2, 300, 256)
    assert metrics.cache_config(text)["block_size"] == "128"
    assert metrics.has_step_counters(text)
    assert not metrics.has_step_counters("# TYPE x counter\nx_total 1.0\n")


def test_the_engine_measures_on_the_baselines_server(
    fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runinfra_opt.engine.vllm.engine import open_engine

    monkeypatch.setenv("FAKE_VLLM_STEP", "table")
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps({**COST, "per_token": 0.0005}))
    engine = open_engine(str(tiny_models[0]), vllm_python=fake_vllm, log_dir=tmp_path)
    try:
        grid = StepCostGrid(batch_sizes=(1, 2), tokens=(1, 3), prefill_lengths=(16,), context=32, repeats=1)
        measured = engine.step_costs(grid=grid)
    finally:
        engine.close()
    assert [launch.variant for launch in engine.launches] == ["baseline"]
    assert measured.table.batch_sizes == (1, 2)
    assert measured.table.context == 32
    assert "--speculative-config" not in Path(engine.launches[0].log).read_text().splitlines()[0]


def test_a_later_pass_over_the_same_requests_finds_none_of_its_prompts_cached(
    fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline pass and the confirmation's first repeat are both repeat 0 of the baseline on one server: the
    second must prefill its prompts again (a cached prompt flattered the baseline's TTFT by ~0.5 s a request)."""
    from runinfra_opt.engine.vllm.engine import open_engine
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.workload.model import Request

    monkeypatch.setenv("FAKE_VLLM_STEP", "table")
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps(COST))
    engine = open_engine(str(tiny_models[0]), vllm_python=fake_vllm, log_dir=tmp_path)
    words = " ".join(f"word{i}" for i in range(120))
    requests = [Request(id=f"r{i}", line=i + 1, prompt=f"{i}: {words}", max_tokens=4) for i in range(2)]
    cached = []
    try:
        for _ in range(2):
            for request in requests:
                engine.generate(request, BASELINE, max_tokens=4, repeat=0)
                assert engine._pool.live is not None
                cached.append(metrics.scrape(engine._pool.live.server.base_url).prompt_tokens_cached)
        # the same request on its own again, with the same repeat, is a third pass: cold too
        engine.generate(requests[0], BASELINE, max_tokens=4, repeat=0)
        cached.append(metrics.scrape(engine._pool.live.server.base_url).prompt_tokens_cached)
    finally:
        engine.close()
    assert cached == [0.0] * 5


def test_the_grid_leaves_out_what_the_run_cannot_use() -> None:
    """Batch sizes up to the first that holds the run's most sequences in a step, token counts up to the first
    that holds its longest verification, prefill lengths up to the first that holds the most prompt tokens a step
    can carry; the predictor interpolates between (and beyond) what is left."""
    grid = StepCostGrid()
    assert (grid.batch_sizes, grid.tokens) == ((1, 2, 4, 8), (1, 2, 3, 5, 9))
    assert grid.covering() == grid
    assert grid.covering(max_batch=4, max_tokens=5).batch_sizes == (1, 2, 4)
    assert grid.covering(max_batch=3, max_tokens=4).tokens == (1, 2, 3, 5)
    assert grid.covering(max_batch=3).batch_sizes == (1, 2, 4)
    assert grid.covering(max_batch=1, max_tokens=1) == dataclasses.replace(grid, batch_sizes=(1,), tokens=(1,))
    assert grid.covering(max_batch=16, max_tokens=17) == grid  # beyond the grid: all of it (extrapolated past)
    assert grid.prefill_lengths == (64, 256, 512, 1024)
    assert grid.covering(max_prefill=80).prefill_lengths == (64, 256)
    assert grid.covering(max_prefill=256).prefill_lengths == (64, 256)
    assert grid.covering(max_prefill=20).prefill_lengths == (64,)
    assert grid.covering(max_prefill=5000).prefill_lengths == grid.prefill_lengths
