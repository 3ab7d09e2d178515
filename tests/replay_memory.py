"""A replay's memory, measured in a child process (for tests/test_load_memory.py): a synthetic recording (requests
50 ms apart) streamed with `stream_workload` and replayed through `run_level` with an in-process client, each request
sleeping `service_ms` on the event loop and returning `chunks` one-token chunks (no HTTP server, so the figures are
the client's). The child reports its peak RSS (VmHWM: not inherited across exec, unlike `ru_maxrss`) and its RSS
after imports. Modes: `kept` (every `LoadRecord` stays in the returned run), `streamed` (each record appended to a
JSON-lines file, only the send lags kept), `metrics` (`level_metrics` over the streamed file read lazily).

    python -m tests.replay_memory --mode streamed --workload W --records R   # one measurement, JSON on stdout
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def write_workload(path: Path, requests: int) -> Path:
    """The recording tests/test_load_memory.py plans: chat requests 50 ms apart, three categories, 64 max tokens."""
    with path.open("w", encoding="utf-8") as fh:
        for i in range(requests):
            record = {
                "id": f"r{i}",
                "arrival_s": round(i * 0.05, 3),
                "category": ("chat", "code", "json")[i % 3],
                "messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}? Explain briefly."}],
                "max_tokens": 64,
            }
            fh.write(json.dumps(record) + "\n")
    return path


def _status_mb(field_name: str) -> float:
    """A figure of /proc/self/status in MB (VmRSS: now; VmHWM: the peak since this process's exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field_name} in /proc/self/status")


@dataclass
class SyntheticResult:
    """A streamed result as the vLLM client returns one (`runinfra_opt.load.runner.StreamedResult`)."""

    ttft_s: float
    itl_s: list[float]
    chunk_tokens: list[int]
    e2e_s: float
    output_tokens: int
    success: bool = True
    status: int | None = 200
    error: str | None = None
    prompt_tokens: int | None = 24


def synthetic_send(service_s: float, chunks: int) -> Any:
    """An in-process client: each request takes `service_s` on the event loop, its first chunk at a fifth of it."""
    ttft = service_s / 5
    gap = (service_s - ttft) / max(chunks - 1, 1)

    async def send(request: object) -> SyntheticResult:
        await asyncio.sleep(service_s)
        return SyntheticResult(ttft, [gap] * (chunks - 1), [1] * chunks, service_s, chunks)

    return send


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process; returns its figures."""
    import numpy  # noqa: F401 - imported before the baseline: every mode imports it (the notes' percentiles)

    from runinfra_opt.load import Replay, level_metrics, plan, run_level
    from runinfra_opt.load.store import RecordWriter, read_run
    from runinfra_opt.stats import percentiles
    from runinfra_opt.workload import stream_workload

    rss_before = _status_mb("VmRSS")
    start = time.perf_counter()
    out: dict[str, Any] = {"mode": args.mode}
    if args.mode == "metrics":
        run = read_run(args.records, lazy=True)
        metrics = level_metrics([run], slo_ttft_ms=200)
        out.update(requests=metrics.requests, succeeded=metrics.succeeded,
                   output_tokens_per_s=metrics.output_tokens_per_s.value if metrics.output_tokens_per_s else None,
                   itl_p50_ms=metrics.itl_s["p50"] * 1000)  # fmt: skip
    else:
        level = Replay(time_scale=args.time_scale)
        send = synthetic_send(args.service_ms / 1000, args.chunks)
        schedule = plan(level, stream_workload(str(args.workload)))
        if args.mode == "kept":
            run = asyncio.run(run_level(level, schedule, send))
        else:
            with RecordWriter(args.records) as writer:
                run = asyncio.run(run_level(level, schedule, send, sink=writer, keep_records=False))
            out["records_file_mb"] = round(args.records.stat().st_size / 1e6, 1)
        lags = percentiles([lag * 1000 for lag in run.send_lags()], (50, 99))
        out.update(requests=run.requests, records_in_memory=len(run.records), peak_in_flight=run.peak_in_flight,
                   send_lag_ms={k: round(v, 2) for k, v in lags.items()}, late_requests=run.late_requests,
                   level_duration_s=round(run.duration_s, 2))  # fmt: skip
    out.update(
        seconds=round(time.perf_counter() - start, 2),
        rss_before_mb=round(rss_before, 1),
        peak_rss_mb=round(_status_mb("VmHWM"), 1),
    )
    return out


def measure(workload: Path, mode: str, records: Path, *, chunks: int, time_scale: float, service_ms: float) -> Any:
    """One measurement in a child process: its figures."""
    command = [
        sys.executable, "-m", "tests.replay_memory", "--mode", mode, "--workload", str(workload), "--records",
        str(records), "--chunks", str(chunks), "--time-scale", str(time_scale), "--service-ms", str(service_ms),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} on {workload.name} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=64, help="streamed chunks (one token each) per request")
    parser.add_argument("--time-scale", type=float, default=0.005, help="replay's time scale (0.005: 4,000 req/s)")
    parser.add_argument("--service-ms", type=float, default=20.0, help="each synthetic request's duration")
    parser.add_argument("--mode", choices=["kept", "streamed", "metrics"], required=True)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--records", type=Path, required=True)
    print(json.dumps(child(parser.parse_args())))


if __name__ == "__main__":
    main()
