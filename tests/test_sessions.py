"""Sessions: validation of turns, history built from answers, replay in turn order (stand-in server), inspect
and the OpenAI conversation importer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.vllm.client import CompletionRequest, OpenAIClient, RequestResult
from runinfra_opt.load import Concurrency, LevelRun, Replay, plan, run_level
from runinfra_opt.workload import load_workload
from runinfra_opt.workload.inspect import inspect_workload
from runinfra_opt.workload.model import Request
from runinfra_opt.workload.sessions import SessionHistory, expand_all, with_predecessors
from tests.fake_openai_server import API_KEY, fake_server

ANSWER = "Hello wor ld!"
"""What the stand-in server answers every request."""


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _turn(session: str, turn: int, text: str, **more: Any) -> dict[str, Any]:
    return {
        "id": f"{session}-{turn}",
        "session_id": session,
        "turn": turn,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        **more,
    }


def test_malformed_sessions_exit_2_with_file_line_and_field(tmp_path: Path, runner: CliRunner) -> None:
    path = _write(
        tmp_path / "bad.jsonl",
        [
            _turn("a", 1, "one"),
            _turn("a", 3, "three"),  # no turn 2 before it
            {**_turn("a", 1, "again"), "id": "dup"},  # turn 1 again
            {"id": "t", "turn": 1, "messages": [{"role": "user", "content": "x"}]},  # a turn without a session
            {**_turn("b", 1, "x"), "turn": 0},
            {"id": "p", "session_id": "c", "turn": 1, "prompt": "raw text"},
        ],
    )
    result = runner.invoke(app, ["workload", "validate", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [
        f"error: {path}:2: turn: turn 3 of session 'a' has no turn 2 before it in the file (its last turn so far "
        "is 1 on line 1)",
        f"error: {path}:3: turn: duplicate turn 1 of session 'a' (also on line 1)",
        f"error: {path}:4: turn: given without session_id: a turn belongs to a session",
        f"error: {path}:5: turn: must be an integer >= 1, got 0 (an integer)",
        f"error: {path}:6: prompt: a session's turns are chat: give messages, not prompt",
    ]
    assert "Traceback" not in result.output


def test_a_later_turn_may_not_arrive_before_its_predecessor(tmp_path: Path, runner: CliRunner) -> None:
    path = _write(tmp_path / "w.jsonl", [_turn("a", 1, "one", arrival_s=2.0), _turn("a", 2, "two", arrival_s=1.0)])
    result = runner.invoke(app, ["workload", "validate", str(path)])
    assert result.exit_code == 2
    assert f"{path}:2: arrival_s: turn 2 of session 'a' arrives before turn 1 (line 1)" in result.output


def test_history_is_the_earlier_turns_and_their_answers(tmp_path: Path) -> None:
    workload = load_workload(
        str(_write(tmp_path / "w.jsonl", [_turn("a", 1, "one"), _turn("b", 1, "other"), _turn("a", 2, "two")]))
    )
    history = SessionHistory()
    first, other, second = workload.requests
    assert not history.ready(second)
    history.answer(history.expand(first), "answer one")
    history.answer(history.expand(other), "answer other")
    full = history.expand(second)
    assert [(m.role, m.content) for m in full.messages or ()] == [
        ("user", "one"),
        ("assistant", "answer one"),
        ("user", "two"),
    ]
    assert full.history_included
    assert history.expand(full) is full
    rebuilt = expand_all(workload.requests, {"a-1": "answer one"})
    assert rebuilt[2] == full
    assert with_predecessors(workload.requests, {"a-2"}) == {"a-1", "a-2"}


def _chat(request: Request) -> CompletionRequest:
    messages = [{"role": m.role, "content": m.content} for m in request.messages or ()]
    return CompletionRequest(request.id, request.max_tokens or 4, messages=messages)


def _replay(level: Any, requests: tuple[Request, ...], url: str) -> LevelRun:
    async def go() -> LevelRun:
        async with OpenAIClient(url, API_KEY, "m", max_connections=None) as client:

            async def send(request: Request) -> RequestResult:
                return await client.complete(_chat(request))

            return await run_level(level, plan(level, requests), send)

    return asyncio.run(go())


def test_replay_sends_no_turn_before_its_predecessors_answer_and_think_time(tmp_path: Path) -> None:
    # Two sessions overlap: b starts while a waits. Recorded arrivals of later turns come before their
    # predecessor could have been answered (~60 ms a request), so only the session rule holds them back.
    records = [
        _turn("a", 1, "a one", arrival_s=0.0),
        _turn("b", 1, "b one", arrival_s=0.01),
        _turn("a", 2, "a two", arrival_s=0.02, think_s=0.15),
        _turn("b", 2, "b two", arrival_s=0.03),
        _turn("a", 3, "a three", arrival_s=0.04, think_s=0.05),
    ]
    requests = load_workload(str(_write(tmp_path / "s.jsonl", records))).requests
    think = {r["id"]: r.get("think_s", 0.0) for r in records}
    for level in (Replay(), Concurrency(2)):
        with fake_server() as (url, bodies):
            run = _replay(level, requests, url)
        by_id = {r.request_id: r for r in run.records}
        assert all(r.success for r in run.records)
        received = {body["messages"][-1]["content"]: body for body in bodies}
        for session, last in (("a", 3), ("b", 2)):
            for turn in range(2, last + 1):
                current, previous = by_id[f"{session}-{turn}"], by_id[f"{session}-{turn - 1}"]
                wait = think[f"{session}-{turn}"]
                assert current.sent_s >= previous.done_s + wait  # the client's clock
                body = received[f"{session} {['one', 'two', 'three'][turn - 1]}"]
                # the server's clock: the request arrived after the answer and the think time
                assert body["_received_at"] >= run.started_at + previous.done_s + wait - 0.005
                history = [(m["role"], m["content"]) for m in body["messages"][:-1]]
                assert history[-1] == ("assistant", ANSWER)
                assert len(history) == 2 * (turn - 1)
        # sessions overlap: b's first turn went out before a's second
        assert by_id["b-1"].sent_s < by_id["a-2"].sent_s


def test_inspect_reports_sessions_and_repeated_content(tmp_path: Path, runner: CliRunner) -> None:
    text = "the quick brown fox jumps over the lazy dog"
    path = _write(
        tmp_path / "w.jsonl",
        [
            _turn("a", 1, text),
            _turn("a", 2, text),
            _turn("b", 1, "something else entirely new here"),
            {"id": "x", "messages": [{"role": "user", "content": "fresh words never seen before"}]},
        ],
    )
    stats = inspect_workload(load_workload(str(path)))
    assert stats.sessions == 2
    assert stats.session_turns is not None
    assert stats.session_turns.p50 == 1.5
    grams = 7  # 3-grams of the 9-word sentence; the second copy repeats all of them
    assert stats.repeated_share == grams / (grams * 2 + 3 + 3)  # two 5-word texts: 3 each
    result = runner.invoke(app, ["workload", "inspect", str(path)])
    assert result.exit_code == 0
    assert "2 (turns per session p50 2, p90 2)" in result.output
    assert "35%" in result.output


def test_openai_conversation_logs_become_sessions(tmp_path: Path, runner: CliRunner) -> None:
    first = [{"role": "user", "content": "hi"}]
    second = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    path = _write(
        tmp_path / "log.jsonl",
        [
            {"metadata": {"conversation_id": "c1"}, "request": {"messages": first}, "response": "hello"},
            {"conversation_id": "c2", "request": {"messages": [{"role": "user", "content": "other"}]}},
            {"metadata": {"conversation_id": "c1"}, "request": {"messages": second}},
            {"conversation_id": "c2", "request": {"messages": [{"role": "user", "content": "not a continuation"}]}},
        ],
    )
    result = runner.invoke(app, ["workload", "validate", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {path}:4: request.messages: does not continue conversation 'c2': expected the previous call's "
        "messages, then its assistant answer"
    )
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    requests = load_workload(str(path)).requests
    assert [(r.session_id, r.turn) for r in requests] == [("c1", 1), ("c2", 1), ("c1", 2)]
    assert [m.content for m in requests[2].messages or ()] == ["again"]
