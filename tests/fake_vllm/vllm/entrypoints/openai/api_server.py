"""Stands in for vLLM's API server in the lifecycle tests (tests/test_vllm_server.py): the same module path
and arguments, an "engine core" child in its process group, `/health` and `/metrics` on the given loopback
port, and on SIGTERM it stops its child and exits, as vLLM does. The real server is tested in
tests/test_vllm_e2e.py.

FAKE_VLLM_MODE: ok (default); die (exits during start-up, leaving its child behind, as a crashed API
server may); hang (never answers /health); stubborn (ignores SIGTERM, as does its child);
stubborn_hang (both).

It also serves `/v1/completions` (streamed, token-id prompts, `token_id:N` log-probabilities, usage) for the
vLLM engine's tests (tests/test_optimize_vllm.py), deterministically: the output copies the prompt from its
start, cycling (`max_tokens` tokens); the top-2 margin is 0.01 nats at output position 3 (a near-tie) and 2.0
elsewhere. Every chunk takes 10 ms (one decoding step). With `--speculative-config` it streams chunks of up
to k + 1 tokens and counts drafts in /metrics as vLLM does. FAKE_VLLM_SPEC (servers with a speculative config
only): `reject` (exits at start-up as vLLM does on a config it refuses); `diverge:N` (output token N
differs); `die_after:N` (exits after N requests); after N requests (warm-ups count), `error500_after:N` (answers
HTTP 500), `drop_after:N` (drops the connection after the first chunk), `stop_after:N` (SIGSTOPs its own process
group: hung); `jitter` (no gain: one token a step, the requests' steps taking 6 and 18 ms in turn, so a ratio to
the baseline is ~1 with a wide interval). FAKE_VLLM_BASE: the same modes for a server without one.
Every completion served prints a line with their count to the log.

FAKE_VLLM_STEP=batch makes a step cost grow with the batch, as verification does on a real server: with B
requests in flight and k drafted tokens a step takes 10 ms x (1 + 0.05 x k^2 x (B - 1)), so a long lookahead
wins alone and a short one under load. The k of a step follows `num_speculative_tokens_per_batch_size` (by the
requests in flight, as vLLM's scheduler does) when the config has one; FAKE_VLLM_STEP=batch_bad ignores the
schedule and always drafts `num_speculative_tokens` (a schedule that measures worse than its parts).

FAKE_VLLM_STEP=table runs an engine loop like vLLM's (tests/test_vllm_stepcost.py): requests admitted by one
"frontend" (`admit` seconds each, one at a time) wait for the running step to end and are scheduled together in
the next; a step over sequences carrying n_1..n_B new tokens takes `fixed + sum(per_seq + per_token * n_i +
bump[n_i])` seconds (FAKE_VLLM_STEP_COST, JSON, known to the test; with `bulk_after`, a sequence's tokens beyond
that many cost `bulk_token` each: a long prompt is cheap per token), each sequence carrying its prompt tokens not
found in the prefix cache in its first step, then 1. The prefix cache keeps full blocks of `block_size` tokens
under the request's `cache_salt`, and recomputes at least the last prompt token, as vLLM does. With `max_num_seqs`,
a step runs at most that many sequences and later requests wait for one to finish, as under vLLM's own cap: a
server offered more than it finishes queues them (without it every arrival joins the next step, and only the
steps lengthen). Every first token
reaches the client `overhead` seconds after its step (HTTP and detokenization, the same for every token).
/metrics adds the cache config, the cached prompt tokens and the tokens-per-step histogram's count and sum.
With an n-gram `--speculative-config` the table engine speculates by vLLM's rule (the project's own
`runinfra_opt.methods.vllm_ngram.propose`, checked against vLLM's in tests/test_vllm_e2e.py): a decoding sequence
carries 1 + proposed tokens in a step (priced as such) and emits 1 + accepted, in one streamed chunk, and the
spec-decode counters count them (the serving predictor's tests: tests/test_optimize_vllm_predict.py). A
speculating engine's every step costs `spec_step` more per sequence in it (the proposer runs per request), and
`spec_token` more per drafted token (the drafted positions' logits), which the baseline's probes cannot see.
"""

import argparse
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Server(ThreadingHTTPServer):
    request_queue_size = 128
    """socketserver's listen backlog is 5: a burst of more connections (8 step-cost probes and their blocker, a
    capacity rate's arrivals) loses some, and the client retries each 1 s later (its SYN's timeout)."""


class TableEngine:
    """FAKE_VLLM_STEP=table: one engine loop, steps priced by FAKE_VLLM_STEP_COST, a salted prefix cache."""

    def __init__(self, cost, spec=None, counters=None):
        self.fixed = float(cost.get("fixed", 0.01))
        self.per_seq = float(cost.get("per_seq", 0.002))
        self.per_token = float(cost.get("per_token", 0.001))
        self.bump = {int(n): float(s) for n, s in (cost.get("bump") or {}).items()}
        self.overhead = float(cost.get("overhead", 0.015))
        self.admit = float(cost.get("admit", 0.002))
        self.spec_step = float(cost.get("spec_step", 0.0))
        self.bulk_after = int(cost.get("bulk_after", 1 << 30))
        self.bulk_token = float(cost.get("bulk_token", self.per_token))
        self.spec_token = float(cost.get("spec_token", 0.0))
        self.block_size = int(cost.get("block_size", 32))
        self.prefix_caching = bool(cost.get("prefix_caching", True))
        self.max_num_seqs = int(cost.get("max_num_seqs", 1 << 30))
        self.cached_blocks = set()
        self.waiting = []
        self.condition = threading.Condition()
        self.frontend = threading.Lock()
        self.stats = {"steps": 0, "step_tokens": 0, "cached": 0}
        self.spec = spec if spec and spec.get("method") == "ngram" else None
        self.counters = counters if counters is not None else {}
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, prompt, max_tokens, salt, output=None):
        """Queue a request; returns the queue its chunks arrive on as (time, tokens) (None after the last)."""
        tokens = queue.Queue()
        with self.frontend:  # one frontend: requests reach the engine one after another
            time.sleep(self.admit)
            with self.condition:
                self.waiting.append({"prompt": prompt, "max": max_tokens, "salt": salt, "out": tokens, "done": 0,
                                     "output": output or []})  # fmt: skip
                self.condition.notify()
        return tokens

    def _proposal(self, request):
        """vLLM's n-gram proposal for a decoding sequence (empty without a speculative config)."""
        if self.spec is None:
            return []
        from runinfra_opt.methods.vllm_ngram import propose

        context = list(request["prompt"]) + list(request["output"][: request["done"]])
        return propose(context, k=int(self.spec["num_speculative_tokens"]),
                       prompt_lookup_min=int(self.spec.get("prompt_lookup_min", 5)),
                       prompt_lookup_max=int(self.spec.get("prompt_lookup_max", 5)), max_model_len=2048)  # fmt: skip

    def _blocks(self, request, upto):
        return [(request["salt"], tuple(request["prompt"][:end])) for end in range(self.block_size, upto + 1,
                self.block_size)]  # fmt: skip

    def _token_s(self, n):
        return self.per_token * min(n, self.bulk_after) + self.bulk_token * max(n - self.bulk_after, 0)

    def _step_s(self, new_tokens):
        return self.fixed + sum(self.per_seq + self._token_s(n) + self.bump.get(n, 0.0) for n in new_tokens)

    def _loop(self):
        running = []
        while True:
            with self.condition:
                while not self.waiting and not running:
                    self.condition.wait()
                room = max(self.max_num_seqs - len(running), 0)  # the rest wait for a sequence to finish
                arrived, self.waiting = self.waiting[:room], self.waiting[room:]
            for request in arrived:
                hits = 0  # at most len(prompt) - 1 tokens from the cache, in full blocks
                for key in self._blocks(request, len(request["prompt"]) - 1):
                    if not self.prefix_caching or key not in self.cached_blocks:
                        break
                    hits += self.block_size
                request["new"] = len(request["prompt"]) - hits
                self.stats["cached"] += hits
                running.append(request)
            proposals = [self._proposal(r) if r["done"] > 0 else [] for r in running]
            new_tokens = [r["new"] if r["done"] == 0 else 1 + len(p) for r, p in zip(running, proposals, strict=True)]
            extra = self.spec_step * len(running) + self.spec_token * sum(map(len, proposals)) if self.spec else 0.0
            time.sleep(self._step_s(new_tokens) + extra)
            self.stats["steps"] += 1
            # as vLLM's histogram counts them: prompt tokens computed, plus one sampled per sequence
            self.stats["step_tokens"] += sum(r["new"] for r in running if r["done"] == 0) + len(running)
            for request, proposal in zip(running, proposals, strict=True):
                if request["done"] == 0:
                    self.cached_blocks.update(self._blocks(request, len(request["prompt"])))
                accepted = 0
                output = request["output"]
                while (accepted < len(proposal) and request["done"] + accepted < len(output)
                       and proposal[accepted] == output[request["done"] + accepted]):  # fmt: skip
                    accepted += 1
                if proposal:
                    self.counters["drafts"] = self.counters.get("drafts", 0) + 1
                    self.counters["draft_tokens"] = self.counters.get("draft_tokens", 0) + len(proposal)
                    self.counters["accepted"] = self.counters.get("accepted", 0) + accepted
                emitted = min(1 + accepted, request["max"] - request["done"])
                request["done"] += emitted
                request["out"].put((time.monotonic(), emitted))
                if request["done"] >= request["max"]:
                    request["out"].put(None)
            running = [r for r in running if r["done"] < r["max"]]

    def metrics(self):
        return (
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.block_size}",'
            f'enable_prefix_caching="{self.prefix_caching}"}} 1.0\n'
            "# TYPE vllm:prompt_tokens_cached counter\n"
            f'vllm:prompt_tokens_cached_total{{model_name="m"}} {self.stats["cached"]}.0\n'
            "# TYPE vllm:iteration_tokens_total histogram\n"
            f'vllm:iteration_tokens_total_bucket{{le="+Inf",model_name="m"}} {self.stats["steps"]}.0\n'
            f'vllm:iteration_tokens_total_count{{model_name="m"}} {self.stats["steps"]}.0\n'
            f'vllm:iteration_tokens_total_sum{{model_name="m"}} {self.stats["step_tokens"]}.0\n'
        )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--speculative-config", default=None)
    args, _ = parser.parse_known_args()
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    spec_mode = os.environ.get("FAKE_VLLM_SPEC", "") if spec else os.environ.get("FAKE_VLLM_BASE", "")
    if spec_mode == "reject":
        print("ValueError: speculative config rejected by the fake server", flush=True)
        sys.exit(1)
    key_set = bool(os.environ.get("VLLM_API_KEY"))
    print(f"fake vLLM: model {args.model}, mode {mode}, api key set: {key_set}", flush=True)

    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if mode.startswith("stubborn") else ""
    child = subprocess.Popen([sys.executable, "-c", f"{ignore}import time; time.sleep(600)"])
    print(f"api server pid {os.getpid()}, engine core pid {child.pid}", flush=True)

    if mode.startswith("stubborn"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:

        def _stop(signum, frame):
            child.terminate()
            child.wait()
            sys.exit(0)

        signal.signal(signal.SIGTERM, _stop)

    if mode == "die":
        print("RuntimeError: operator torchvision::nms does not exist", flush=True)
        sys.exit(1)
    if mode in ("hang", "stubborn_hang"):
        while True:
            time.sleep(1)

    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "generated": 0, "requests": 0}
    step_mode = os.environ.get("FAKE_VLLM_STEP", "")
    schedule = (spec or {}).get("num_speculative_tokens_per_batch_size") if step_mode == "batch" else None
    in_flight = [0]
    served = itertools.count()
    lock = threading.Lock()

    def k_now(k_max):
        """The lookahead of the next step: by the schedule at the requests in flight, else the configured k."""
        if not schedule:
            return k_max
        batch = in_flight[0]
        k = k_max
        for first, _last, value in sorted(schedule):
            if batch >= first:
                k = min(value, k_max)
        return k

    api_key = os.environ.get("VLLM_API_KEY")
    table_cost = json.loads(os.environ.get("FAKE_VLLM_STEP_COST") or "{}")
    engine = TableEngine(table_cost, spec, counters) if step_mode == "table" else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        disable_nagle_algorithm = True  # each streamed chunk leaves at once (Nagle held small writes ~200 ms)

        def log_message(self, format, *a):
            pass

        def do_POST(self):
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self.send_response(401)
                self.end_headers()
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            fault, _, after = spec_mode.partition("_after:")
            if fault in ("error500", "drop", "stop") and counters["requests"] >= int(after):
                if fault == "stop":  # hung: the whole server stops where it is, as under SIGSTOP
                    os.killpg(os.getpgrp(), signal.SIGSTOP)
                if fault == "error500":
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "Internal Server Error", "code": 500}}')
                    return
            prompt = body["prompt"]
            n = int(body["max_tokens"])
            out = [prompt[i % len(prompt)] for i in range(n)]
            if spec_mode.startswith("diverge:"):
                at = int(spec_mode.split(":")[1])
                if at < n:
                    out[at] = out[at] + 1
            k_max = int(spec["num_speculative_tokens"]) if spec else 0
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            with lock:
                in_flight[0] += 1
            try:
                if fault == "drop" and counters["requests"] >= int(after):
                    self.wfile.write(b'data: {"choices": [{"index": 0, "text": "x", "finish_reason": null}]}\n\n')
                    self.wfile.flush()
                    self.connection.shutdown(2)  # the connection drops mid-stream
                    return
                if engine is not None:
                    self._stream_steps(engine.submit(prompt, n, body.get("cache_salt"), out), out, body)
                else:
                    self._stream(out, n, 0 if spec_mode == "jitter" else k_max)
            finally:
                with lock:
                    in_flight[0] -= 1
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            counters["generated"] += n
            counters["requests"] += 1
            print(f"completions served: {counters['requests']}", flush=True)
            if spec_mode.startswith("die_after:") and counters["requests"] >= int(spec_mode.split(":")[1]):
                child.kill()
                os._exit(1)

        def _stream_steps(self, tokens, out, body):
            """One chunk per engine step of the table engine, `overhead` seconds after the step ended. Its tokens
            decode to no text (as an EOS does): only log-probs or `return_token_ids` show them."""
            i = 0
            for ready, count in iter(tokens.get, None):
                time.sleep(max(0.0, ready + engine.overhead - time.monotonic()))
                chunk = out[i : i + count]
                i += count
                # A probe (return_token_ids) gets tokens that decode to no text; other requests get text, as most
                # tokens do (under load the engine asks for neither log-probs nor ids, and counts text chunks).
                text = "" if body.get("return_token_ids") else "x" * len(chunk)
                choice = {"index": 0, "text": text, "finish_reason": None}
                if body.get("logprobs"):
                    choice["logprobs"] = {
                        "tokens": [f"token_id:{t}" for t in chunk],
                        "token_logprobs": [-0.1] * len(chunk),
                        "top_logprobs": [{f"token_id:{t}": -0.1, f"token_id:{t + 7}": -2.1} for t in chunk],
                    }
                if body.get("return_token_ids"):
                    choice["token_ids"] = chunk
                self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                self.wfile.flush()

        def _stream(self, out, n, k_max):
            """The output in chunks: the first token alone (prefill), then up to k + 1 per step."""
            position, i = 0, 0
            factor = (0.6 + 1.2 * (next(served) % 2)) if spec_mode == "jitter" else 1.0
            while i < n:
                k = k_now(k_max) if i > 0 else 0
                size = min(k + 1, n - i)
                chunk = out[i : i + size]
                if k > 0:
                    counters["drafts"] += 1
                    counters["draft_tokens"] += k
                    counters["accepted"] += size - 1
                i += size
                step = 0.01 * factor  # one decoding step per chunk: a verified chunk costs about a plain step
                if step_mode.startswith("batch"):
                    step *= 1 + 0.05 * k * k * max(in_flight[0] - 1, 0)
                time.sleep(step)
                tops = []
                for tid in chunk:
                    margin = 0.01 if position == 3 else 2.0
                    tops.append({f"token_id:{tid}": -0.1, f"token_id:{tid + 7}": -0.1 - margin})
                    position += 1
                event = {
                    "choices": [
                        {
                            "index": 0,
                            "text": "x" * len(chunk),
                            "logprobs": {
                                "tokens": [f"token_id:{t}" for t in chunk],
                                "token_logprobs": [-0.1] * len(chunk),
                                "top_logprobs": tops,
                            },
                            "finish_reason": None,
                        }
                    ]
                }
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()

        def do_GET(self):
            if self.path == "/health":
                body = b""
            elif self.path == "/metrics":
                body = (
                    "# TYPE vllm:generation_tokens counter\n"
                    f'vllm:generation_tokens_total{{model_name="m"}} {counters["generated"] + 7}.0\n'
                    "# TYPE vllm:spec_decode_num_drafts counter\n"
                    f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {counters["drafts"]}.0\n'
                    "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
                    f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {counters["draft_tokens"]}.0\n'
                    "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
                    f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {counters["accepted"]}.0\n'
                    + (engine.metrics() if engine is not None else "")
                ).encode()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    time.sleep(0.5)  # a start-up that takes a moment
    Server((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
