"""Load generation for a serving engine: load levels parsed from `--load` (`spec`), the planned send times
(`schedule`), a runner that keeps them and records each request (`runner`), the raw records on disk (`store`),
and serving metrics per level (`metrics`).

Library pieces for the HTTP serving engine, which supplies the async client; nothing here imports an engine,
numpy or pandas at module level. The model that predicts a run
without a server is `runinfra_opt.predict`."""

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
