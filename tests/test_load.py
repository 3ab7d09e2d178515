"""Load models, schedules, the load runner (against the local fake server) and per-level serving metrics."""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.vllm.client import CompletionRequest, OpenAIClient, RequestResult
from runinfra_opt.errors import UserInputError
from runinfra_opt.load import (
    Concurrency,
    LevelRun,
    LoadRecord,
    Rate,
    Replay,
    level_metrics,
    measured_window,
    parse_load,
    plan,
    records_frame,
    run_level,
    summarize,
    throughput_ratio,
)
from runinfra_opt.load.schedule import GAP_BATCH, gaps
from runinfra_opt.stats import bootstrap_interval
from runinfra_opt.workload import load_workload, stream_workload
from runinfra_opt.workload.model import Request
from tests.fake_openai_server import API_KEY, fake_server


def _requests(arrivals: list[float | None], prompt: str = "hi") -> list[Request]:
    return [Request(id=f"r{i}", line=i + 1, arrival_s=a, prompt=prompt, max_tokens=4) for i, a in enumerate(arrivals)]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ load specs
def test_parse_load_levels_in_order() -> None:
    levels = parse_load("replay + concurrency:1,4,16 + rate:0.5,inf", time_scale=0.5, burstiness=0.7, seed=3)
    assert levels == [
        Replay(0.5),
        Concurrency(1),
        Concurrency(4),
        Concurrency(16),
        Rate(0.5, 0.7, 3),
        Rate(float("inf"), 0.7, 3),
    ]
    assert [level.name for level in levels] == [
        "replay", "concurrency:1", "concurrency:4", "concurrency:16", "rate:0.5", "rate:inf",
    ]  # fmt: skip
    assert [level.open_loop for level in levels] == [True, False, False, False, True, True]
    assert parse_load("RATE:2")[0] == Rate(2.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty; give replay, concurrency:1,4,16 or rate:0.5,2"),
        ("poisson:2", "unknown load model 'poisson' (available: replay, concurrency, rate)"),
        ("replay:2", "replay takes no values (its time scale is --time-scale)"),
        ("concurrency", "concurrency needs values after the colon, e.g. concurrency:1,4,16"),
        ("concurrency:0", "concurrency '0' is not a whole number >= 1"),
        ("concurrency:1.5", "concurrency '1.5' is not a whole number >= 1"),
        ("rate:abc", "rate 'abc' is not a number of requests/s > 0 (or inf)"),
        ("rate:-1", "rate '-1' is not a number of requests/s > 0 (or inf)"),
        ("rate:nan", "rate 'nan' is not a number of requests/s > 0 (or inf)"),
        ("concurrency:4,4", "concurrency:4 is given twice"),
        ("replay+concurrency:2+", "unknown load model '(nothing)'"),
    ],
)
def test_bad_load_spec_is_one_clear_line(spec: str, message: str) -> None:
    with pytest.raises(UserInputError) as info:
        parse_load(spec)
    text = str(info.value)
    assert text.startswith(f"--load {spec!r}: ")
    assert message in text
    assert "\n" not in text


def test_bad_time_scale_and_burstiness() -> None:
    with pytest.raises(UserInputError, match=r"--time-scale: must be a number > 0"):
        parse_load("replay", time_scale=0)
    with pytest.raises(UserInputError, match=r"--burstiness: must be > 0"):
        parse_load("rate:1", burstiness=-1)


# ------------------------------------------------------------------------------------------------ schedules
def test_replay_counts_from_the_first_arrival_scaled() -> None:
    schedule = list(plan(Replay(0.5), _requests([5.0, 6.0, 9.0])))
    assert [p.at_s for p in schedule] == [0.0, 0.5, 2.0]
    assert [p.index for p in schedule] == [0, 1, 2]


def test_replay_sorts_requests_out_of_order_and_keeps_ties_in_file_order() -> None:
    schedule = list(plan(Replay(), _requests([2.0, 0.0, 1.0, 0.0])))
    assert [p.request.id for p in schedule] == ["r1", "r3", "r2", "r0"]
    assert [p.at_s for p in schedule] == [0.0, 0.0, 1.0, 2.0]


def test_replay_without_arrivals_is_refused() -> None:
    with pytest.raises(UserInputError, match=r"--load replay: the workload records no arrival times"):
        plan(Replay(), _requests([None, None]))


def test_rate_schedule_is_seeded_and_has_the_asked_mean_rate() -> None:
    requests = _requests([None] * 20_000)
    first = [p.at_s for p in plan(Rate(4.0, seed=1), requests)]
    again = [p.at_s for p in plan(Rate(4.0, seed=1), requests)]
    other = [p.at_s for p in plan(Rate(4.0, seed=2), requests)]
    assert first == again
    assert first != other
    assert first[0] == 0.0
    spacing = np.diff(np.array(first, dtype=float))
    assert spacing.mean() == pytest.approx(0.25, rel=0.03)
    assert spacing.std() / spacing.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps: CV 1
    bursty = np.diff(np.array([p.at_s for p in plan(Rate(4.0, burstiness=0.25), requests)], dtype=float))
    assert bursty.mean() == pytest.approx(0.25, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # gamma(k): CV 1/sqrt(k)


def test_rate_gaps_do_not_depend_on_the_batching() -> None:
    drawn = list(zip(range(GAP_BATCH + 10), gaps(Rate(3.0, burstiness=0.5, seed=7)), strict=False))
    direct = np.random.default_rng(7).gamma(shape=0.5, scale=1 / 1.5, size=GAP_BATCH + 10)
    assert np.allclose([gap for _, gap in drawn], direct)


def test_rate_edge_cases_and_closed_loop() -> None:
    requests = _requests([None] * 4)
    assert [p.at_s for p in plan(Rate(float("inf")), requests)] == [0.0] * 4
    assert [p.at_s for p in plan(Rate(2.0, burstiness=float("inf")), requests)] == [0.0, 0.5, 1.0, 1.5]
    assert [p.at_s for p in plan(Concurrency(2), requests)] == [None] * 4


def test_summary_counts_span_and_busiest_second() -> None:
    requests = _requests([0.0, 0.1, 0.2, 0.9, 1.5, 3.0])
    summary = summarize(Replay(), plan(Replay(), requests))
    assert summary.requests == 6
    assert summary.span_s == 3.0
    assert summary.peak_per_s == 4  # 0.0, 0.1, 0.2, 0.9
    assert summary.mean_rate_per_s == pytest.approx(5 / 3.0)
    assert summary.max_tokens == 24
    closed = summarize(Concurrency(2), plan(Concurrency(2), requests))
    assert (closed.span_s, closed.peak_per_s, closed.mean_rate_per_s) == (None, None, None)


# ------------------------------------------------------------------------------------------------ streamed workloads
@pytest.mark.parametrize("timing", ["arrival_s", "timestamp"])
def test_stream_matches_the_loaded_workload(tmp_path: Path, timing: str) -> None:
    records = [
        {"id": f"q{i}", timing: (1_700_000_000 + t if timing == "timestamp" else t), "prompt": f"p{i}"}
        for i, t in enumerate([3.0, 4.5, 4.0])
    ]
    path = _write(tmp_path / "w.jsonl", records)
    stream = stream_workload(str(path))
    loaded = load_workload(str(path))
    assert list(stream) == list(loaded.requests)
    assert list(stream) == list(loaded.requests)  # re-read on every iteration
    assert stream.fingerprint == loaded.fingerprint
    assert stream.requests == 3
    assert stream.has_arrivals
    assert not stream.in_arrival_order
    assert stream.first_arrival_s == (0.0 if timing == "timestamp" else 3.0)
    assert [p.at_s for p in plan(Replay(), stream)] == [0.0, 1.0, 1.5]


def test_stream_in_order_is_replayed_without_sorting(tmp_path: Path) -> None:
    path = _write(tmp_path / "w.jsonl", [{"id": f"q{i}", "arrival_s": 2.0 + i, "prompt": "x"} for i in range(3)])
    stream = stream_workload(str(path))
    assert stream.in_arrival_order
    schedule = plan(Replay(), stream)
    assert not isinstance(schedule, list)
    assert [(p.request.id, p.at_s) for p in schedule] == [("q0", 0.0), ("q1", 1.0), ("q2", 2.0)]


def test_stream_without_timing_refuses_replay(tmp_path: Path) -> None:
    path = _write(tmp_path / "untimed.jsonl", [{"id": "a", "prompt": "x"}])
    stream = stream_workload(str(path))
    assert not stream.has_arrivals
    with pytest.raises(UserInputError, match=r"workload 'untimed' records no arrival times"):
        plan(Replay(), stream)


# ------------------------------------------------------------------------------------------------ runner
def _completion(request: Request) -> CompletionRequest:
    return CompletionRequest(request.id, request.max_tokens or 4, prompt=request.prompt, top_logprobs=2)


def _run(level: Any, requests: Iterable[Request], url: str, **kwargs: Any) -> LevelRun:
    async def go() -> LevelRun:
        async with OpenAIClient(url, API_KEY, "m", max_connections=None) as client:

            async def send(request: Request) -> RequestResult:
                return await client.complete(_completion(request))

            return await run_level(level, plan(level, requests), send, **kwargs)

    return asyncio.run(go())


def test_open_loop_keeps_its_schedule_while_the_server_is_slow() -> None:
    # Each "slow" request takes ~0.6 s; they are due 0.1 s apart: an open loop sends them on time regardless.
    requests = _requests([0.1 * i for i in range(6)], prompt="slow")
    seen: list[str] = []
    with fake_server() as (url, bodies):
        run = _run(Replay(), requests, url, on_result=lambda record, result: seen.append(result.output_text))
    assert len(bodies) == 6
    records = sorted(run.records, key=lambda r: r.index)
    assert [r.planned_s for r in records] == pytest.approx([0.1 * i for i in range(6)])
    # On time: each send lagged its schedule by less than half the shortest answer took (a loop that waited for
    # answers would lag by whole answers), whatever the machine's load does to both.
    assert all(0 <= r.send_lag_s < 0.5 * min(r.e2e_s or 0.0 for r in records) for r in records)
    assert run.peak_in_flight >= 4  # sends did not wait for answers
    assert seen == ["Hello wor ld!"] * 6
    for record in records:
        assert record.success
        assert record.output_tokens == 4
        assert list(record.chunk_tokens) == [1, 2, 1]
        assert record.ttft_s is not None
        assert record.e2e_s is not None
        assert record.chunk_s[0] == pytest.approx(record.sent_s + record.ttft_s)
        assert record.sent_s < record.chunk_s[0] < record.chunk_s[-1] <= record.done_s
        # the server sleeps 0.2 s before each of its three chunks: the last cannot arrive sooner than 0.6 s
        assert record.chunk_s[-1] - record.sent_s >= 0.59
        assert all(gap > 0 for gap in record.itl_s)
    # Chunks are timed as they arrive, not when the stream ends (that would make every gap ~0): the server sends
    # its three chunks 0.2 s apart, so the stream spans two thirds of a request. One request's span can shrink when
    # a stalled event loop reads two chunks late (seen on a loaded CI machine), not most of them.
    assert float(np.median([(r.chunk_s[-1] - r.chunk_s[0]) / (r.done_s - r.sent_s) for r in records])) > 1 / 3
    assert run.duration_s >= records[-1].done_s


def test_a_streamed_recording_replays_from_its_file(tmp_path: Path) -> None:
    records = [{"id": f"q{i}", "arrival_s": 10.0 + 0.05 * i, "prompt": "hi", "max_tokens": 4} for i in range(4)]
    stream = stream_workload(str(_write(tmp_path / "w.jsonl", records)))
    with fake_server() as (url, bodies):
        run = _run(Replay(), stream, url)
    assert [b["prompt"] for b in bodies] == ["hi"] * 4
    assert sorted((r.request_id, round(r.planned_s, 6)) for r in run.records) == [
        ("q0", 0.0), ("q1", 0.05), ("q2", 0.1), ("q3", 0.15),
    ]  # fmt: skip
    assert all(r.success for r in run.records)


def test_a_cancelled_level_leaves_nothing_running() -> None:
    requests = _requests([0.05 * i for i in range(20)], prompt="slow")

    async def go(url: str) -> None:
        async with OpenAIClient(url, API_KEY, "m", max_connections=None) as client:

            async def send(request: Request) -> RequestResult:
                return await client.complete(_completion(request))

            with pytest.raises(TimeoutError):
                await asyncio.wait_for(run_level(Replay(), plan(Replay(), requests), send), timeout=0.3)
            await asyncio.sleep(0)
            assert asyncio.all_tasks() == {asyncio.current_task()}

    with fake_server() as (url, bodies):
        asyncio.run(go(url))
        # The server records a body when its handler thread has read it, which can lag the client's send on a
        # loaded machine (the full suite once saw 2 recorded at the cancellation and 6 later). Wait until the
        # count has been still for 0.2 s: a level still sending would add one every 50 ms until all 20 were in.
        sent, still_since = len(bodies), time.monotonic()
        while time.monotonic() - still_since < 0.2 and len(bodies) < 20:
            time.sleep(0.01)
            if len(bodies) != sent:
                sent, still_since = len(bodies), time.monotonic()
        time.sleep(0.3)
        assert len(bodies) == sent < 20  # nothing was sent after the cancellation


def test_closed_loop_keeps_exactly_n_in_flight() -> None:
    requests = _requests([None] * 6, prompt="slow")
    with fake_server() as (url, _):
        start = time.perf_counter()
        run = _run(Concurrency(2), requests, url)
        wall = time.perf_counter() - start
    assert run.peak_in_flight == 2
    assert sorted(r.index for r in run.records) == list(range(6))
    shortest = min(r.e2e_s or 0.0 for r in run.records)
    assert wall >= 3 * shortest  # six requests two at a time: three rounds, each as long as the shortest at least
    by_sent = sorted(run.records, key=lambda r: r.sent_s)
    # after the first two, each request is due when an earlier one finished, and goes at once (well within the
    # time an answer takes)
    assert all(0 <= r.send_lag_s < 0.5 * shortest for r in by_sent)
    assert {round(r.planned_s, 6) for r in by_sent[2:]} <= {round(r.done_s, 6) for r in by_sent}


def test_failures_are_records_not_exceptions() -> None:
    requests = [Request(id="bad", line=1, arrival_s=0.0, prompt="fail", max_tokens=4), *_requests([0.05, 0.1])]
    with fake_server() as (url, _):
        run = _run(Replay(), requests, url)
    bad = next(r for r in run.records if r.request_id == "bad")
    assert not bad.success
    assert bad.status == 400
    assert "maximum context length" in (bad.error or "")
    assert bad.output_tokens == 0
    metrics = level_metrics([run])
    assert (metrics.requests, metrics.succeeded, metrics.failed) == (3, 2, 1)


def test_a_late_client_is_flagged() -> None:
    # A client that blocks its own event loop for 80 ms per send cannot keep a 20 ms spacing.
    requests = _requests([0.02 * i for i in range(8)])

    async def go() -> LevelRun:
        async def send(request: Request) -> Any:
            time.sleep(0.08)
            return RequestResult(request.id, success=True, status=200, ttft_s=0.01, e2e_s=0.01, output_tokens=1,
                                 chunk_tokens=[1])  # fmt: skip

        return await run_level(Replay(), plan(Replay(), requests), send)

    run = asyncio.run(go())
    assert run.late_requests >= 6
    (note,) = run.notes
    assert note.startswith("replay: the client fell behind its schedule (send lag p50 ")
    assert "the load offered was lighter than planned" in note
    assert level_metrics([run]).notes[0] == note


def test_an_exception_from_send_ends_the_level() -> None:
    async def send(request: Request) -> Any:
        raise RuntimeError("client bug")

    with pytest.raises(RuntimeError, match="client bug"):
        asyncio.run(run_level(Replay(), plan(Replay(), _requests([0.0, 0.01])), send))
    with pytest.raises(RuntimeError, match="client bug"):
        asyncio.run(run_level(Concurrency(1), plan(Concurrency(1), _requests([None])), send))


# ------------------------------------------------------------------------------------------------ metrics
def _record(index: int, sent: float, ttft: float = 0.5, e2e: float = 1.0, tokens: list[int] | None = None,
            output_tokens: int | None = None, success: bool = True) -> LoadRecord:  # fmt: skip
    chunks = tokens or [1, 2]
    times = np.linspace(sent + ttft, sent + e2e, len(chunks)).tolist()
    return LoadRecord(
        index=index, request_id=f"r{index}", category="c", planned_s=sent, sent_s=sent, done_s=sent + e2e,
        success=success, ttft_s=ttft if success else None, e2e_s=e2e if success else None,
        output_tokens=(output_tokens if output_tokens is not None else sum(chunks)) if success else 0,
        chunk_s=array("d", times if success else []), chunk_tokens=array("q", chunks if success else []),
    )  # fmt: skip


def _level_run(records: list[LoadRecord], level: Any = None) -> LevelRun:
    return LevelRun(level or Rate(1.0), records, started_at=0.0, duration_s=max(r.done_s for r in records),
                    peak_in_flight=2)  # fmt: skip


def test_metrics_over_the_measured_window() -> None:
    # Ten requests sent 1 s apart, each: 1 token at +0.5 s, 2 tokens at +1.0 s (done). The first send is
    # warm-up (10%), the window is [1 s, 9 s] (the last send): request 0 contributes its 2 tokens at 1.0 s,
    # requests 1-8 all 3 tokens, request 9 none (its chunks come after the last send).
    ttfts = [0.5] * 8 + [0.6, 0.6]
    run = _level_run([_record(i, float(i), ttft=ttfts[i]) for i in range(10)])
    window = measured_window(run)
    assert (window.start_s, window.end_s, window.warmup_requests, window.steady) == (1.0, 9.0, 1, True)
    metrics = level_metrics([run], slo_ttft_ms=500)
    assert metrics.output_tokens_per_s is not None
    assert metrics.output_tokens_per_s.value == pytest.approx((2 + 8 * 3) / 8.0)
    low, high = metrics.output_tokens_per_s.low, metrics.output_tokens_per_s.high
    assert low <= metrics.output_tokens_per_s.value <= high
    assert metrics.requests_per_s == pytest.approx(9 / 8.0)  # requests 0-8 complete at 1..9 s
    assert metrics.ttft_s["p50"] == pytest.approx(0.5)  # requests 1-9 (sent inside the window)
    assert metrics.tpot_s["p50"] == pytest.approx((1.0 - 0.5) / 2)
    assert metrics.e2e_s["p99"] == pytest.approx(1.0)
    assert metrics.itl_s["p50"] == pytest.approx(0.5)
    assert metrics.goodput is not None
    assert metrics.goodput.value == pytest.approx(7 / 9)  # requests 1-7 within 500 ms (inclusive); 8, 9 not
    assert metrics.goodput.low <= 7 / 9 <= metrics.goodput.high
    assert metrics.goodput_requests_per_s == pytest.approx(8 / 8.0)  # requests 0-7 done inside, all good
    assert metrics.send_lag_s["p99"] == 0.0
    assert metrics.notes == []


def test_tpot_slo_and_failed_requests_in_goodput() -> None:
    records = [_record(i, float(i), e2e=1.0 + 0.5 * (i % 2), tokens=[1, 1, 1]) for i in range(9)]
    records.append(_record(9, 4.5, success=False))
    metrics = level_metrics([_level_run(records)], slo_tpot_ms=300)
    # Window [1 s, 8 s] (the last send): requests 1-8 and the failure (sent at 4.5 s) are measured. tpot is
    # (e2e - 0.5) / 2: 0.25 s (even i) meets 300 ms, 0.5 s (odd i) does not; the failure is not good.
    assert metrics.goodput is not None
    assert metrics.goodput.value == pytest.approx(4 / 9)
    assert metrics.failed == 1
    assert level_metrics([_level_run(records)]).goodput is None  # no SLO, no goodput


def test_tokens_follow_the_server_usage_count() -> None:
    # Without log-probs each chunk counts as one token; the server's usage count is what is scaled to.
    run = _level_run([_record(i, float(i), tokens=[1, 1], output_tokens=4) for i in range(10)])
    metrics = level_metrics([run])
    assert metrics.output_tokens_per_s is not None
    assert metrics.output_tokens_per_s.value == pytest.approx((2 + 8 * 4) / 8.0)


def test_a_run_too_short_for_a_window_is_measured_whole_and_says_so() -> None:
    run = _level_run([_record(i, 0.0) for i in range(5)], level=Rate(float("inf")))
    window = measured_window(run)
    assert (window.start_s, window.end_s, window.steady) == (0.0, 1.0, False)
    metrics = level_metrics([run])
    assert metrics.output_tokens_per_s is not None
    assert metrics.output_tokens_per_s.value == pytest.approx(15 / 1.0)
    assert metrics.notes == [
        "rate:inf: 1 of 1 run(s) too short to exclude warm-up and drain: "
        "measured from the first send to the last completion"
    ]


def test_repeats_pool_tokens_over_windows() -> None:
    fast = _level_run([_record(i, float(i)) for i in range(10)])
    slow = _level_run([_record(i, 2.0 * i) for i in range(10)])
    pooled = level_metrics([fast, slow])
    assert pooled.runs == 2
    assert pooled.requests == 20
    assert pooled.output_tokens_per_s is not None
    # fast: 26 tokens in 8 s; slow (window [2, 18]): request 0's 3 tokens come before 2 s, so 8 x 3 = 24 in 16 s
    assert pooled.output_tokens_per_s.value == pytest.approx((26 + 24) / (8.0 + 16.0))
    with pytest.raises(ValueError, match="one load level"):
        level_metrics([fast, _level_run(fast.records, level=Concurrency(1))])


def test_throughput_ratio_pairs_runs_and_requests() -> None:
    baseline = _level_run([_record(i, float(i)) for i in range(10)])
    twice = _level_run([_record(i, float(i), tokens=[2, 4]) for i in range(10)])
    ratio = throughput_ratio([twice], [baseline])
    assert ratio is not None
    assert (ratio.value, ratio.low, ratio.high) == pytest.approx((2.0, 2.0, 2.0))  # every request streams twice
    mixed = _level_run([_record(i, float(i), tokens=[2, 4] if i % 2 else [1, 2]) for i in range(10)])
    spread = throughput_ratio([mixed], [baseline])
    assert spread is not None
    assert spread.value == pytest.approx((2 + 4 * 6 + 4 * 3) / 26)  # request 0 (even) adds its 2 tokens at 1.0 s
    assert spread.low < spread.value < spread.high
    assert throughput_ratio([], [baseline]) is None
    with pytest.raises(ValueError, match="one load level"):
        throughput_ratio([_level_run(twice.records, level=Concurrency(1))], [baseline])


def test_long_runs_bootstrap_in_batches() -> None:
    # Above 2,000 rows the bootstrap resamples in batches (bounded memory); the interval stays a proper one.
    values = np.random.default_rng(0).normal(5.0, 1.0, size=3000)
    interval = bootstrap_interval(np.mean, [values.tolist()], seed=1)
    assert interval.value == pytest.approx(values.mean())
    assert interval.low < values.mean() < interval.high
    assert interval.high - interval.low == pytest.approx(2 * 1.96 / np.sqrt(3000), rel=0.2)
    assert bootstrap_interval(np.mean, [values.tolist()], seed=1) == interval  # seeded


def test_records_frame_has_one_row_per_request_in_order() -> None:
    records = [_record(1, 1.0), _record(0, 0.0)]
    records[0].sent_s = 1.004
    frame = records_frame(_level_run(records))
    assert list(frame["index"]) == [0, 1]
    assert frame.loc[1, "send_lag_s"] == pytest.approx(0.004)
    assert frame.loc[0, "tpot_s"] == pytest.approx(0.25)
    assert "chunk_s" not in frame.columns


# ------------------------------------------------------------------------------------------------ CLI
def test_load_plan_command(tmp_path: Path) -> None:
    path = _write(tmp_path / "w.jsonl", [{"id": f"q{i}", "arrival_s": i * 0.5, "prompt": "x"} for i in range(5)])
    args = ["load", "plan", "--workload", str(path), "--load", "replay+concurrency:2"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "workload w (sha256:" in result.output
    assert "5 requests, arrivals recorded" in result.output
    assert "recorded arrivals" in result.output
    assert "closed loop, 2 in flight" in result.output
    as_json = CliRunner().invoke(
        app, ["load", "plan", "--workload", str(path), "--load", "replay+rate:4", "--time-scale", "2", "--json"]
    )
    assert as_json.exit_code == 0, as_json.output
    payload = json.loads(as_json.output)
    replay, rate = payload["levels"]
    assert (replay["requests"], replay["span_s"], replay["peak_per_s"]) == (5, 4.0, 1)
    assert rate["level"] == "rate:4"
    assert payload["in_arrival_order"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load", "rate:fast"], "error: --load 'rate:fast': rate 'fast' is not a number of requests/s > 0"),
        (["--load", "replay"], "error: --load replay: workload 'untimed' records no arrival times"),
        (["--load", "replay", "--time-scale", "0"], "error: --time-scale: must be a number > 0"),
    ],
)
def test_load_plan_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    path = _write(tmp_path / "untimed.jsonl", [{"id": "a", "prompt": "x"}])
    result = CliRunner().invoke(app, ["load", "plan", "--workload", str(path), *args])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(message), result.stderr


def test_a_closed_loop_of_equal_answers_has_an_interval_not_a_point() -> None:
    # Concurrency 1, every answer 8 tokens, but the requests take different times (as prompts and acceptance
    # differ): the interval must reflect the times. With equal shares of the window per request, every resample
    # would have the same tokens per share and the interval would collapse to the point (as it did on vLLM).
    durations = [0.5, 1.5, 0.7, 1.2, 0.9, 2.0, 0.6, 1.1, 0.8, 1.4, 0.5, 1.0]
    starts = np.concatenate([[0.0], np.cumsum(durations[:-1])]).tolist()
    run = _level_run(
        [_record(i, starts[i], ttft=0.1, e2e=d, tokens=[1, 7]) for i, d in enumerate(durations)],
        level=Concurrency(1),
    )
    metrics = level_metrics([run])
    assert metrics.output_tokens_per_s is not None
    tps = metrics.output_tokens_per_s
    low, value, high = tps.low, tps.value, tps.high
    assert low < value < high
    assert high / low > 1.1
    # Paired: each request 1.6x-2.5x as fast (as acceptance differs by request): a ratio near 2 with a spread.
    factors = [0.4, 0.6, 0.5, 0.45, 0.55, 0.5, 0.4, 0.6, 0.5, 0.45, 0.55, 0.5]
    fast_durations = [d * f for d, f in zip(durations, factors, strict=True)]
    fast_starts = np.concatenate([[0.0], np.cumsum(fast_durations[:-1])]).tolist()
    faster = _level_run(
        [_record(i, fast_starts[i], ttft=d, e2e=d, tokens=[8]) for i, d in enumerate(fast_durations)],
        level=Concurrency(1),
    )
    # Both runs: every request's 8 tokens in one chunk at its end, so the same requests count in both windows.
    whole = _level_run(
        [_record(i, starts[i], ttft=d, e2e=d, tokens=[8]) for i, d in enumerate(durations)], level=Concurrency(1)
    )
    ratio = throughput_ratio([faster], [whole])
    assert ratio is not None
    assert 1.8 < ratio.value < 2.2
    assert ratio.low < ratio.value < ratio.high
