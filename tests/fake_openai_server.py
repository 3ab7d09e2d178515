"""A small local OpenAI-compatible streaming server for the client's unit tests (in addition to the tests
against real vLLM servers, never instead of them). It streams what vLLM streams: text chunks with
`token_id:N` log-probability tokens, then a usage chunk, then `[DONE]`.

Behaviour by prompt (or last chat message): "fail" -> HTTP 400 with an OpenAI error body; "drop" -> the
connection closes mid-chunk; "cut" -> it closes after the first whole chunk (no `[DONE]`); "slow" -> 0.2 s
between chunks; anything else -> three chunks 20 ms apart, the second carrying two tokens (as a speculative step
would).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "test-key"
# (text, [(token id, logprob, [(alt id, alt logprob)])]) per chunk
CHUNKS: list[tuple[str, list[tuple[int, float, list[tuple[int, float]]]]]] = [
    ("Hello", [(10, -0.1, [(11, -2.5)])]),
    (" wor ld", [(12, -0.2, [(13, -0.25)]), (14, -0.3, [(15, -3.0)])]),
    ("!", [(16, -0.05, [(17, -4.0)])]),
]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the stream ends when the connection closes, like a bare SSE server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {API_KEY}":
            self._json(401, {"error": {"message": "Unauthorized", "type": "auth"}})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["_received_at"] = time.time()  # for tests of when a request arrived (not part of the API)
        self.server.bodies.append(body)  # type: ignore[attr-defined]
        chat = self.path == "/v1/chat/completions"
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        if prompt == "fail":
            self._json(400, {"error": {"message": "This model's maximum context length is 2048", "code": 400}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        delay = 0.2 if prompt == "slow" else 0.02
        for index, (text, tokens) in enumerate(CHUNKS):
            time.sleep(delay)
            if prompt == "cut" and index == 1:  # the connection closes between two whole chunks
                return
            if prompt == "drop" and index == 1:
                self.wfile.write(b'data: {"choices": [{"index": 0, "te')
                self.wfile.flush()
                return
            self._event(self._chunk(text, tokens, chat, last=index == len(CHUNKS) - 1))
        self._event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    @staticmethod
    def _chunk(text: str, tokens: list[tuple[int, float, list[tuple[int, float]]]], chat: bool, last: bool) -> Any:
        finish = "length" if last else None
        if chat:
            content = [
                {
                    "token": f"token_id:{tid}",
                    "logprob": lp,
                    "top_logprobs": [{"token": f"token_id:{a}", "logprob": alp} for a, alp in [(tid, lp), *alts]],
                }
                for tid, lp, alts in tokens
            ]
            return {
                "choices": [
                    {"index": 0, "delta": {"content": text}, "logprobs": {"content": content}, "finish_reason": finish}
                ]
            }
        return {
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": {
                        "tokens": [f"token_id:{tid}" for tid, _, _ in tokens],
                        "token_logprobs": [lp for _, lp, _ in tokens],
                        # dict order deliberately worst-first: the client must sort
                        "top_logprobs": [
                            {f"token_id:{a}": alp for a, alp in [*alts, (tid, lp)]} for tid, lp, alts in tokens
                        ],
                    },
                    "finish_reason": finish,
                }
            ]
        }


@contextmanager
def fake_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(base_url, bodies received) of a server on a free loopback port, for the `with` block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.bodies  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
