"""Load generation for a serving engine: load models, streamed schedules, a runner that keeps the schedule, and
serving metrics per load level.

- `spec`: `parse_load("replay+concurrency:1,4")` -> load levels (`Replay`, `Concurrency`, `Rate`).
- `schedule`: `plan(level, requests)` -> the planned send time of every request, lazily (`summarize` counts it).
- `runner`: `await run_level(level, schedule, send)` -> a `LevelRun` of raw per-request `LoadRecord`s with their
  planned and actual send times; notes when the client fell behind. `sink=RecordWriter(path)` and
  `keep_records=False` stream the records to a file instead of keeping them (`store`: `read_run(path, lazy=True)`).
- `metrics`: `level_metrics(runs, slo_ttft_ms=..., slo_tpot_ms=...)` -> `LevelMetrics` over the measured window;
  `throughput_ratio(runs, baseline_runs)`: a variant's tokens/s over the baseline's at one level, paired.

Library pieces for the HTTP serving engine (`runinfra_opt.engine.vllm`), which supplies `send` (its async
client); nothing here imports an engine, numpy or pandas at module level. The model that predicts a run without
a server is `runinfra_opt.predict`.
"""

from runinfra_opt.load.metrics import (
    LevelMetrics,
    MeasuredWindow,
    level_metrics,
    measured_window,
    records_frame,
    throughput_ratio,
)
from runinfra_opt.load.runner import LATE_S, LevelRun, LoadRecord, RecordSink, StreamedResult, run_level
from runinfra_opt.load.schedule import Planned, ScheduleSummary, plan, summarize
from runinfra_opt.load.spec import Concurrency, LoadLevel, Rate, Replay, parse_load

__all__ = [
    "LATE_S",
    "Concurrency",
    "LevelMetrics",
    "LevelRun",
    "LoadLevel",
    "LoadRecord",
    "MeasuredWindow",
    "Planned",
    "Rate",
    "RecordSink",
    "Replay",
    "ScheduleSummary",
    "StreamedResult",
    "level_metrics",
    "measured_window",
    "parse_load",
    "plan",
    "records_frame",
    "run_level",
    "summarize",
    "throughput_ratio",
]
