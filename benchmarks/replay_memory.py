"""Does a replay run in bounded memory? Replays a synthetic recording (requests 50 ms apart, as
tests/test_load_memory.py writes one, streamed with `stream_workload`, replayed at `--time-scale`) through
`run_level` with an in-process client: each request sleeps `--service-ms` on the event loop and returns a synthetic
streamed result of `--chunks` one-token chunks (no HTTP server, so the figures are the client's: the streamed
workload, the schedule, the runner and its records). Each measurement runs in its own child process, which reports
its peak RSS (VmHWM: not inherited across exec, unlike `ru_maxrss`) and its RSS after imports, for each size:

- `kept`: `run_level(...)` as `optimize` calls it today: every `LoadRecord` stays in the returned run;
- `streamed`: `run_level(..., sink=RecordWriter(file), keep_records=False)`: each record appended to a JSON-lines
  file as it completes, only the send lags (8 bytes a request) kept;
- `metrics` (with `--metrics`): `level_metrics` (TTFT SLO 200 ms) over the streamed file read lazily
  (`read_run(file, lazy=True)`), in its own child.

    .venv/bin/python benchmarks/replay_memory.py [--requests 1000,100000] [--chunks 64] [--time-scale 0.005]
        [--service-ms 20] [--metrics] [--out-dir DIR] [--keep]

The figures go to `--out-dir`/summary.json (`--keep`: benchmarks/results/replay_memory.json).

The client falls behind the schedule when it cannot keep up (4,000 requests/s at the default scale): that makes
the run longer, not its memory larger (the requests in flight are bounded by the service time); the send lags are
reported. `--child` runs one measurement (used by tests/test_load_memory.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]


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
    """One measurement in a child process (`--child`): its figures."""
    command = [
        sys.executable, str(SCRIPT), "--child", "--mode", mode, "--workload", str(workload), "--records",
        str(records), "--chunks", str(chunks), "--time-scale", str(time_scale), "--service-ms", str(service_ms),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} on {workload.name} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="1000,100000", help="comma-separated workload sizes")
    parser.add_argument("--chunks", type=int, default=64, help="streamed chunks (one token each) per request")
    parser.add_argument("--time-scale", type=float, default=0.005, help="replay's time scale (0.005: 4,000 req/s)")
    parser.add_argument("--service-ms", type=float, default=20.0, help="each synthetic request's duration")
    parser.add_argument("--metrics", action="store_true", help="also compute level_metrics from the streamed file")
    summary.add_output_options(parser, __file__)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["kept", "streamed", "metrics"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--records", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    sizes = [int(n) for n in args.requests.split(",")]
    report: dict[str, Any] = {
        "what": "peak RSS (VmHWM) of a child process replaying a synthetic recording through run_level with an "
        "in-process client (no HTTP): records kept in memory vs streamed to a JSON-lines file",
        "chunks_per_request": args.chunks,
        "time_scale": args.time_scale,
        "service_ms": args.service_ms,
        "load_average_before": load_average(),
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            workload = write_workload(Path(tmp) / f"w{size}.jsonl", size)
            records = Path(tmp) / f"records{size}.jsonl"
            modes = ["kept", "streamed", *(["metrics"] if args.metrics else [])]
            for mode in modes:
                figures = measure(workload, mode, records, chunks=args.chunks, time_scale=args.time_scale,
                                  service_ms=args.service_ms)  # fmt: skip
                figures["workload_requests"] = size
                figures["load_average"] = load_average()
                report["runs"].append(figures)
                print(
                    f"{size:>7,} requests {mode:>8}: peak RSS {figures['peak_rss_mb']:6.1f} MB "
                    f"(after imports {figures['rss_before_mb']:.1f} MB), {figures['seconds']:.1f} s"
                    + (f", send lag p99 {figures['send_lag_ms']['p99']:.1f} ms" if "send_lag_ms" in figures else ""),
                    flush=True,
                )
            workload.unlink()
            records.unlink(missing_ok=True)
    by = {(r["workload_requests"], r["mode"]): r["peak_rss_mb"] for r in report["runs"]}
    if len(sizes) >= 2:
        small, big = min(sizes), max(sizes)
        report["growth_mb"] = {
            mode: round(by[(big, mode)] - by[(small, mode)], 1) for mode in ("kept", "streamed", "metrics")
            if (big, mode) in by
        }  # fmt: skip
        print(f"peak RSS growth from {small:,} to {big:,} requests: {report['growth_mb']}")
    report["load_average_after"] = load_average()
    summary.write_summary(args, report)


if __name__ == "__main__":
    main()
