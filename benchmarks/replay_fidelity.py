"""Does the load runner keep a replay's schedule? Replays a synthetic trace (default 2,000 requests arriving as a
Poisson process at 20 requests/s) through `runinfra_opt.load` and the async client, and reports the send lag of
every request against its planned time (p50/p99/max; target p99 <= 10 ms), the requests in flight, the
client's peak RSS and the machine's load average. The trace is written as a workload file and streamed, as a
recording would be.

    .venv/bin/python benchmarks/replay_fidelity.py --fake             # the local fake server (tests/), own process
    .venv/bin/python benchmarks/replay_fidelity.py --base-url http://127.0.0.1:8000 --model MODEL [--api-key KEY]
    .venv/bin/python benchmarks/replay_fidelity.py --vllm    # launches a bf16 SmolLM2 vLLM server for the run

Options: --requests 2000 --rate 20 --max-tokens 16 --seed 0. The figures go to `--out-dir`/summary.json
(`--keep`: benchmarks/results/replay_fidelity.json, replay_fidelity-vllm.json with `--vllm`). Against a real
server each request asks for `--max-tokens` tokens with `ignore_eos` and no log-probabilities; a server slower
than the offered load queues requests (see `peak_in_flight`), which must not delay the sends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402
from runinfra_opt.engine.vllm.client import CompletionRequest, OpenAIClient, RequestResult
from runinfra_opt.load import LATE_S, LevelRun, Replay, level_metrics, plan, run_level
from runinfra_opt.stats import percentiles
from runinfra_opt.workload import stream_workload
from runinfra_opt.workload.model import Request

REPO = Path(__file__).resolve().parents[1]
FAKE = (
    "import sys\n"
    f"sys.path.insert(0, {str(REPO)!r})\n"
    "from tests.fake_openai_server import fake_server\n"
    "with fake_server() as (url, bodies):\n"
    "    print(url, flush=True)\n"
    "    sys.stdin.read()\n"
)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_trace(path: Path, requests: int, rate: float, max_tokens: int, seed: int) -> None:
    """A workload of `requests` prompts whose arrivals are a Poisson process at `rate` requests/s."""
    arrivals = np.concatenate([[0.0], np.cumsum(np.random.default_rng(seed).exponential(1 / rate, requests - 1))])
    with path.open("w", encoding="utf-8") as fh:
        for i, arrival in enumerate(arrivals):
            prompt = f"Request {i}: write one sentence about the number {i}."
            record = {"id": f"r{i}", "arrival_s": round(float(arrival), 6), "prompt": prompt, "max_tokens": max_tokens}
            fh.write(json.dumps(record) + "\n")


async def replay(base_url: str, api_key: str | None, model: str, trace: Path) -> LevelRun:
    stream = stream_workload(str(trace))
    level = Replay()
    async with OpenAIClient(base_url, api_key, model, max_connections=None) as client:

        async def send(request: Request) -> RequestResult:
            completion = CompletionRequest(
                request.id, request.max_tokens or 16, prompt=request.prompt, top_logprobs=0, ignore_eos=True
            )
            return await client.complete(completion)

        return await run_level(level, plan(level, stream), send)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="start the local fake server (tests/) in its own process")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--vllm", action="store_true", help="launch a vLLM server (bundled SmolLM2, bf16) for the run")
    parser.add_argument("--model", default="m", help="the served model's name (the server's --model)")
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="default: $VLLM_API_KEY")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()
    if sum([args.fake, args.base_url is not None, args.vllm]) != 1:
        parser.error("give exactly one of --fake, --base-url and --vllm")

    server = None
    launched = None
    if args.vllm:
        from runinfra_opt.engine.vllm.args import ServerConfig
        from runinfra_opt.engine.vllm.environment import resolve_environment
        from runinfra_opt.engine.vllm.server import VllmServer
        from runinfra_opt.models import ensure_converted, resolve_model

        model_dir = str(ensure_converted(resolve_model("default")))
        launched = VllmServer(
            resolve_environment().python, ServerConfig(model_dir), Path(tempfile.mkdtemp()), name="replay-fidelity"
        )
        launched.__enter__()
        base_url, api_key, args.model = launched.base_url, launched.api_key, launched.model_name
    elif args.fake:
        server = subprocess.Popen(
            [sys.executable, "-c", FAKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None
        base_url, api_key = server.stdout.readline().strip(), "test-key"
    else:
        base_url, api_key = args.base_url, args.api_key
    load_before = load_average()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.jsonl"
            write_trace(trace, args.requests, args.rate, args.max_tokens, args.seed)
            start = time.perf_counter()
            run_result = asyncio.run(replay(base_url, api_key, args.model, trace))
            wall = time.perf_counter() - start
    finally:
        if server is not None:
            server.communicate(input="", timeout=30)
        if launched is not None:
            launched.__exit__(None, None, None)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lags_ms = [lag * 1000 for lag in run_result.send_lags()]
    lag = percentiles(lags_ms, (50, 90, 99))
    metrics = level_metrics([run_result])
    report = {
        "server": "fake (tests/fake_openai_server.py, own process)"
        if args.fake
        else ("vLLM 0.32 CPU, bundled SmolLM2 bf16, launched for the run" if args.vllm else base_url),
        "requests": args.requests,
        "rate_per_s": args.rate,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "send_lag_ms": {**lag, "max": max(lags_ms)},
        "late_requests": run_result.late_requests,
        "late_threshold_ms": LATE_S * 1000,
        "target_p99_ms": 10.0,
        "target_met": lag["p99"] <= 10.0,
        "peak_in_flight": run_result.peak_in_flight,
        "succeeded": metrics.succeeded,
        "failed": metrics.failed,
        "wall_s": round(wall, 2),
        "planned_span_s": max(r.planned_s for r in run_result.records),
        "output_tokens_per_s": metrics.output_tokens_per_s.model_dump() if metrics.output_tokens_per_s else None,
        "requests_per_s": metrics.requests_per_s,
        "ttft_ms": {k: v * 1000 for k, v in metrics.ttft_s.items()},
        "peak_rss_mb": round(peak_rss_mb, 1),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "python": sys.version.split()[0],
        "notes": run_result.notes,
    }
    print(
        f"send lag: p50 {lag['p50']:.2f} ms, p90 {lag['p90']:.2f} ms, p99 {lag['p99']:.2f} ms, "
        f"max {max(lags_ms):.2f} ms ({run_result.late_requests} of {len(lags_ms)} > {LATE_S * 1000:g} ms); "
        f"target p99 <= 10 ms: {'met' if report['target_met'] else 'NOT met'}"
    )
    print(
        f"{metrics.succeeded} ok, {metrics.failed} failed, peak {run_result.peak_in_flight} in flight, "
        f"{wall:.1f} s wall for a {report['planned_span_s']:.1f} s schedule; peak RSS {peak_rss_mb:.0f} MB; "
        f"load average {load_before} -> {report['load_average_after']}"
    )
    for note in run_result.notes:
        print(f"note: {note}")
    summary.write_summary(args, report, kept="replay_fidelity-vllm" if args.vllm else None)


if __name__ == "__main__":
    main()
