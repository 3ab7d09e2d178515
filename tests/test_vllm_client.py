"""The streaming client against a small local fake server (tests/test_vllm_e2e.py runs it against vLLM)."""

from __future__ import annotations

import time

import pytest

from runinfra_opt.engine.vllm.client import CompletionRequest, parse_token, replay, request_body
from runinfra_opt.engine.vllm.server import free_port
from tests.fake_openai_server import API_KEY, fake_server


def test_parse_token() -> None:
    assert parse_token("token_id:42") == 42
    assert parse_token("token_id:x") is None
    assert parse_token("hello") is None


def test_request_body_asks_for_usage_ids_and_top2() -> None:
    body = request_body(CompletionRequest("r", 8, prompt=[1, 2, 3]), "m")
    assert body["stream_options"] == {"include_usage": True}
    assert body["logprobs"] == 2
    assert body["return_tokens_as_token_ids"] is True
    assert body["temperature"] == 0.0
    chat = request_body(CompletionRequest("r", 8, messages=[{"role": "user", "content": "hi"}]), "m")
    assert chat["logprobs"] is True
    assert chat["top_logprobs"] == 2
    plain = request_body(CompletionRequest("r", 8, prompt="x", top_logprobs=0), "m")
    assert "logprobs" not in plain
    assert "return_tokens_as_token_ids" not in plain


def test_request_needs_prompt_or_messages() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        CompletionRequest("r", 8)


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_result(chat: bool) -> None:
    request = (
        CompletionRequest("a", 4, messages=[{"role": "user", "content": "hi"}])
        if chat
        else CompletionRequest("a", 4, prompt="hi")
    )
    with fake_server() as (url, bodies):
        results, wall = replay(url, API_KEY, "m", [request])
    (result,) = results
    assert result.success, result.error
    assert result.status == 200
    assert result.output_text == "Hello wor ld!"
    assert result.output_token_ids == [10, 12, 14, 16]
    assert result.top_logprobs[1] == [(12, -0.2), (13, -0.25)]  # sorted best first
    assert result.output_tokens == 4
    assert result.prompt_tokens == 5
    assert result.chunk_tokens == [1, 2, 1]
    assert len(result.itl_s) == 2
    assert result.finish_reason == "length"
    assert result.ttft_s is not None
    assert result.e2e_s is not None
    assert 0.015 < result.ttft_s < result.e2e_s <= wall
    # The server sleeps 20 ms before each of its 3 chunks. A gap is what the client saw between two chunks: a
    # client late to read one (a busy machine) sees the next sooner, so only their sum and the whole are bounded.
    assert all(gap >= 0 for gap in result.itl_s)
    assert result.ttft_s + sum(result.itl_s) <= result.e2e_s
    assert result.e2e_s >= 0.06
    assert bodies[0]["model"] == "m"


def test_failures_are_data_not_exceptions() -> None:
    requests = [
        CompletionRequest("ok", 4, prompt="hi"),
        CompletionRequest("bad", 4, prompt="fail"),
        CompletionRequest("cut", 4, prompt="drop"),
        CompletionRequest("short", 4, prompt="cut"),
    ]
    with fake_server() as (url, _):
        results, _ = replay(url, API_KEY, "m", requests, concurrency=4)
        unauthorised, _ = replay(url, "wrong-key", "m", requests[:1])
    ok, bad, cut, short = results
    assert [r.request_id for r in results] == ["ok", "bad", "cut", "short"]
    assert ok.success
    assert not bad.success
    assert bad.status == 400
    assert "maximum context length" in (bad.error or "")
    assert not cut.success
    assert cut.error
    assert not short.success  # whole chunks, then no [DONE]: a dropped stream, not a short answer
    assert "ended before [DONE]" in (short.error or "")
    assert not unauthorised[0].success
    assert unauthorised[0].status == 401
    assert unauthorised[0].error == "Unauthorized"


def test_no_server_is_a_failed_result() -> None:
    results, _ = replay(f"http://127.0.0.1:{free_port()}", API_KEY, "m", [CompletionRequest("a", 4, prompt="hi")])
    assert not results[0].success
    assert results[0].status is None
    assert "ConnectError" in (results[0].error or "")


def test_concurrency_overlaps_requests() -> None:
    requests = [CompletionRequest(str(i), 4, prompt="slow") for i in range(4)]
    with fake_server() as (url, _):
        _, serial = replay(url, API_KEY, "m", requests, concurrency=1)
        results, parallel = replay(url, API_KEY, "m", requests, concurrency=4)
    assert all(r.success for r in results)
    assert serial > 4 * 3 * 0.2 * 0.9
    assert parallel < serial / 2


def test_a_hung_server_fails_the_requests_in_flight_and_later_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that stops answering (SIGSTOP, a deadlock): a socket that listens and never answers. The requests
    in flight end as failed results once /health has failed HUNG_AFTER times in a row, not after the request
    timeout; later requests fail at once."""
    import asyncio
    import socket

    from runinfra_opt.engine.vllm import client as client_module

    monkeypatch.setattr(client_module, "HEALTH_EVERY_S", 0.05)
    monkeypatch.setattr(client_module, "HEALTH_TIMEOUT_S", 0.05)
    request_timeout_s = 60.0
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"

        async def go() -> tuple[list[client_module.RequestResult], float, float]:
            async with client_module.OpenAIClient(url, "k", "m", timeout_s=request_timeout_s) as client:
                requests = [client_module.CompletionRequest(f"r{i}", 4, prompt=[1, 2]) for i in range(3)]
                start = time.monotonic()
                first = await client_module.run_requests(client, requests, concurrency=2)
                in_flight_s = time.monotonic() - start
                later = await client.complete(requests[0])
                return [*first, later], in_flight_s, time.monotonic() - start - in_flight_s

        results, in_flight_s, later_s = asyncio.run(go())
    assert in_flight_s < request_timeout_s  # ended by the health checks, before the request timeout
    assert later_s < in_flight_s  # a later request fails at once, without health checks of its own
    assert [r.success for r in results] == [False] * 4
    assert all("stopped answering" in (r.error or "") for r in results)
