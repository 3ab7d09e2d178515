"""An async streaming client for OpenAI-compatible servers (vLLM), timing each request the way
`vllm bench serve` does (`vllm/benchmarks/lib/endpoint_request_func.py`).

Per request: time to first token, the gaps between streamed chunks with their token counts, end-to-end latency,
the server's output token count, and the output token ids with their top-2 log-probabilities (exact ids, and the
margins that near-ties are judged by). A failed request is a result with `success=False`, never an exception.
httpx rather than the `openai` SDK, whose retries and parsing would sit between the request and the clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

TOKEN_ID_PREFIX = "token_id:"
DEFAULT_TIMEOUT_S = 600.0
HEALTH_EVERY_S = 10.0
HEALTH_TIMEOUT_S = 5.0
HUNG_AFTER = 3
"""While requests are in flight, `/health` is asked every `HEALTH_EVERY_S`; this many failures in a row (about
45 s) mean the server hangs (stopped, deadlocked): the requests in flight and every later one fail at once
instead of each waiting out `DEFAULT_TIMEOUT_S`."""


@dataclass(frozen=True)
class CompletionRequest:
    """One request: a prompt (text or token ids, for /v1/completions) or chat messages (/v1/chat/completions)."""

    request_id: str
    max_tokens: int
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_logprobs: int = 2
    """0 requests no log-probabilities (and so no token ids)."""
    ignore_eos: bool = False
    seed: int | None = None
    cache_salt: str | None = None
    """vLLM's prefix-cache salt: only requests with the same salt share cached blocks."""
    return_token_ids: bool = False
    """Ask vLLM for each chunk's token ids (`return_token_ids`) without log-probabilities: exact ids and token
    counts even where a token decodes to no text (an EOS, part of a character)."""

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a CompletionRequest needs exactly one of prompt and messages")

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass
class RequestResult:
    """What one request measured; `success=False` carries `status` and `error` instead of raising."""

    request_id: str
    success: bool = False
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    """Gaps between successive streamed chunks that carried output (as `vllm bench serve` reports them)."""
    chunk_tokens: list[int] = field(default_factory=list)
    """Tokens per streamed chunk (first chunk included): speculation may deliver several at once."""
    e2e_s: float | None = None
    output_text: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per output position, the top candidates as (token id, log-probability), best first."""
    output_tokens: int | None = None
    """From the server's `usage.completion_tokens`."""
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    started_at: float | None = None
    """`time.perf_counter()` when the request was sent (its first token arrived at `started_at + ttft_s`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_token(token: str) -> int | None:
    """`token_id:123` (vLLM's `return_tokens_as_token_ids`) -> 123; anything else -> None."""
    if token.startswith(TOKEN_ID_PREFIX):
        rest = token[len(TOKEN_ID_PREFIX) :]
        if rest.lstrip("-").isdigit():
            return int(rest)
    return None


def request_body(request: CompletionRequest, model: str) -> dict[str, Any]:
    """The JSON body for the request (greedy at temperature 0; usage in the stream; top-k log-probs)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.ignore_eos:
        body["ignore_eos"] = True
    if request.seed is not None:
        body["seed"] = request.seed
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    if request.return_token_ids:
        body["return_token_ids"] = True
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.is_chat:
        body["messages"] = request.messages
        if request.top_logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = request.top_logprobs
    else:
        body["prompt"] = request.prompt
        if request.top_logprobs:
            body["logprobs"] = request.top_logprobs
    if request.top_logprobs:
        body["return_tokens_as_token_ids"] = True
    return body


def _top(candidates: dict[str, float] | list[dict[str, Any]] | None) -> list[tuple[int, float]]:
    """Top candidates from either API's shape, best first; entries whose token is not an id are dropped."""
    pairs: list[tuple[int, float]] = []
    items: list[tuple[Any, Any]]
    if isinstance(candidates, dict):  # completions: {"token_id:5": -0.1, ...}
        items = list(candidates.items())
    elif isinstance(candidates, list):  # chat: [{"token": "token_id:5", "logprob": -0.1}, ...]
        items = [(c.get("token", ""), c.get("logprob")) for c in candidates]
    else:
        return pairs
    for token, logprob in items:
        token_id = parse_token(str(token))
        if token_id is not None and logprob is not None:
            pairs.append((token_id, float(logprob)))
    pairs.sort(key=lambda pair: -pair[1])
    return pairs


def _absorb_choice(choice: dict[str, Any], result: RequestResult, is_chat: bool) -> int:
    """Add one streamed choice's text, token ids and log-probs to the result; return its token count."""
    if is_chat:
        text = (choice.get("delta") or {}).get("content") or ""
        entries = (choice.get("logprobs") or {}).get("content") or []
        tokens = [e.get("token", "") for e in entries]
        tops = [_top(e.get("top_logprobs")) for e in entries]
    else:
        text = choice.get("text") or ""
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        tops = [_top(t) for t in (logprobs.get("top_logprobs") or [])]
    result.output_text += text
    for token in tokens:
        token_id = parse_token(str(token))
        if token_id is not None:
            result.output_token_ids.append(token_id)
    result.top_logprobs.extend(tops)
    if choice.get("finish_reason"):
        result.finish_reason = choice["finish_reason"]
    ids = choice.get("token_ids")
    if not tokens and isinstance(ids, list) and ids:  # vLLM's `return_token_ids`
        result.output_token_ids.extend(int(i) for i in ids)
        return len(ids)
    # Without log-probs the chunk's token count is unknown: count a non-empty chunk as one (as vllm bench does).
    return len(tokens) if tokens else (1 if text else 0)


class OpenAIClient:
    """`async with OpenAIClient(base_url, api_key, model) as client: await client.complete(request)`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int | None = 64,
    ) -> None:
        """`max_connections=None`: no cap (an open-loop load must not queue requests inside the client)."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._http: Any = None
        self.hung: str | None = None
        """Why the server is judged hung (`HUNG_AFTER`); None while it answers."""
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OpenAIClient:
        import httpx

        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout_s),
            limits=httpx.Limits(max_connections=self._max_connections, max_keepalive_connections=self._max_connections),
            headers=self._headers,
            trust_env=False,  # loopback: never through a proxy from the environment
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await self._http.aclose()

    async def _watch_health(self) -> None:
        """While requests are in flight, ask `/health`; after `HUNG_AFTER` failures in a row, cancel them."""
        failures = 0
        while self._in_flight:
            await asyncio.sleep(HEALTH_EVERY_S)
            try:
                response = await self._http.get(self.base_url + "/health", timeout=HEALTH_TIMEOUT_S)
                failures = 0 if response.status_code == 200 else failures + 1
            except Exception:  # noqa: BLE001 (any failure to answer counts)
                failures += 1
            if failures >= HUNG_AFTER:
                self.hung = f"the server stopped answering (/health failed {failures} times in a row)"
                for task in list(self._in_flight):
                    task.cancel()
                return

    async def complete(self, request: CompletionRequest) -> RequestResult:
        """Send one streaming request and time it; errors come back in the result (a hung server's too)."""
        if self.hung:
            return RequestResult(request.request_id, error=self.hung)
        task = asyncio.current_task()
        assert task is not None
        self._in_flight.add(task)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._watch_health())
        try:
            return await self._complete(request)
        except asyncio.CancelledError:
            if not self.hung:
                raise
            task.uncancel()  # cancelled by the watch, not by the caller: the request ends as a failed result
            return RequestResult(request.request_id, error=self.hung)
        finally:
            self._in_flight.discard(task)
            if not self._in_flight and self._watch is not None:  # the last request out stops the watch
                watch, self._watch = self._watch, None
                watch.cancel()
                await asyncio.wait([watch])

    async def _complete(self, request: CompletionRequest) -> RequestResult:
        import httpx

        path = "/v1/chat/completions" if request.is_chat else "/v1/completions"
        result = RequestResult(request.request_id)
        body = request_body(request, self.model)
        start = result.started_at = time.perf_counter()
        last: float | None = None
        ended = False  # the server's `[DONE]`: a stream cut before it is a failed request, not a short answer
        try:
            async with self._http.stream("POST", self.base_url + path, json=body) as response:
                result.status = response.status_code
                if response.status_code != 200:
                    raw = (await response.aread()).decode("utf-8", errors="replace")
                    result.error = _error_message(raw) or f"HTTP {response.status_code}"
                    return result
                lines = response.aiter_lines()
                async with contextlib.aclosing(lines):  # closed on `break` and on return
                    async for line in lines:
                        if not line.startswith("data:"):
                            continue
                        data = line[len("data:") :].strip()
                        if data == "[DONE]":
                            ended = True
                            break
                        now = time.perf_counter()
                        chunk = json.loads(data)
                        if "error" in chunk and not chunk.get("choices"):
                            result.error = _error_message(data) or "error in stream"
                            return result
                        usage = chunk.get("usage")
                        if usage:
                            result.output_tokens = usage.get("completion_tokens")
                            result.prompt_tokens = usage.get("prompt_tokens")
                        tokens = sum(_absorb_choice(c, result, request.is_chat) for c in chunk.get("choices") or [])
                        if tokens:
                            if result.ttft_s is None:
                                result.ttft_s = now - start
                            elif last is not None:
                                result.itl_s.append(now - last)
                            result.chunk_tokens.append(tokens)
                            last = now
        except (httpx.HTTPError, ValueError, OSError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            return result
        result.e2e_s = time.perf_counter() - start
        if not ended:
            result.error = "the stream ended before [DONE] (the connection dropped mid-stream)"
            return result
        if result.ttft_s is None and result.output_tokens:
            result.error = "the stream carried no output chunks"
            return result
        result.success = True
        return result


def _error_message(raw: str) -> str | None:
    """The `message` of an OpenAI-style error body, or the raw text (shortened)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.strip()[:500] or None
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error)[:500]


async def run_requests(
    client: OpenAIClient, requests: Sequence[CompletionRequest], *, concurrency: int = 1
) -> list[RequestResult]:
    """Send the requests with at most `concurrency` in flight (closed loop); results in request order."""
    semaphore = asyncio.Semaphore(max(1, concurrency))

    async def one(request: CompletionRequest) -> RequestResult:
        async with semaphore:
            return await client.complete(request)

    return list(await asyncio.gather(*(one(r) for r in requests)))


def replay(
    base_url: str,
    api_key: str | None,
    model: str,
    requests: Sequence[CompletionRequest],
    *,
    concurrency: int = 1,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[list[RequestResult], float]:
    """Synchronous entry point: run the requests; return their results and the wall time of the whole run."""

    async def go() -> tuple[list[RequestResult], float]:
        async with OpenAIClient(
            base_url, api_key, model, timeout_s=timeout_s, max_connections=max(1, concurrency)
        ) as client:
            start = time.perf_counter()
            results = await run_requests(client, requests, concurrency=concurrency)
            return results, time.perf_counter() - start

    return asyncio.run(go())
