"""Serving under load in the results file (`optimize --engine vllm --load ...`): a level's figures, each variant's
result per level, the predictions, and what was decided per level. `runinfra_opt.load` computes the figures."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runinfra_opt.results.base import Interval, _Model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MeasuredWindow(_Strict):
    """The part of one run the throughput figures are measured over (seconds after the level's start)."""

    start_s: float
    end_s: float
    warmup_requests: int
    """Sends before the window (warm-up); 0 when the whole run is measured."""
    steady: bool
    """False: the run was too short to exclude warm-up and drain, so its whole span is measured."""

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


class LevelMetrics(_Strict):
    """One load level's serving figures (pooled over its runs)."""

    level: str
    description: str
    runs: int
    requests: int
    succeeded: int
    failed: int
    windows: list[MeasuredWindow]
    output_tokens_per_s: Interval | None
    requests_per_s: float | None
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    itl_s: dict[str, float]
    e2e_s: dict[str, float]
    send_lag_s: dict[str, float]
    late_requests: int
    """Sends more than the runner's lateness threshold behind their planned time."""
    peak_in_flight: int
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    goodput: Interval | None = None
    """Share of the measured requests that succeeded within every SLO given (None: no SLO given)."""
    goodput_requests_per_s: float | None = None
    notes: list[str] = []


class AddedPass(_Model):
    """One more pass of a level whose decision was unclear (`optimize.level_repeats`): the candidate's records and the
    baseline's, timed beside it (relative to the run directory)."""

    records: str
    baseline_records: str


class LevelResult(_Model):
    """One variant measured under one load level, on its own server (`optimize --engine vllm --load ...`)."""

    level: str
    """The level's name (`replay`, `concurrency:4`, `rate:2`)."""
    metrics: LevelMetrics
    records: str | None = None
    """The raw per-request records (JSON lines), relative to the run directory."""
    vs_baseline: Interval | None = None
    """Output tokens/s over the baseline's at this level (paired by repeat and schedule position)."""
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    """The server's counters over the level (`/metrics` before and after)."""
    added: list[AddedPass] = Field(default_factory=list)
    """Passes added because the level's decision was unclear; `metrics` and `vs_baseline` pool every pass."""
    mismatched: int | None = None
    """Greedy outputs that differ from the baseline's batch-1 output; None: not checked (the vLLM engine asks
    for no log-probabilities under load, so it gets no token ids; losslessness is judged at batch 1)."""

    @property
    def acceptance_rate(self) -> float | None:
        if not self.drafted_tokens or self.accepted_tokens is None:
            return None
        return self.accepted_tokens / self.drafted_tokens


class PredictedLevel(_Model):
    """One variant predicted under one load level by the serving-engine predictor (`optimize.serving`): `metrics`
    as `level_metrics` measures a real run; `calibrated`: overheads fitted to the baseline's measured run there;
    `vs_baseline`: predicted tokens/s over the baseline's predicted tokens/s."""

    level: str
    metrics: LevelMetrics
    calibrated: bool
    vs_baseline: float | None = None


class LevelDecision(_Model):
    """The winner at one load level, on measured figures (lossless variants only)."""

    level: str
    winner: str
    figure: str
    """What was ranked (`output tokens/s`, `goodput requests/s`, `TTFT p95`)."""
    gain: Interval | None = None
    """The winner's output tokens/s over the baseline's at this level."""
    reason: str


class Crossover(_Model):
    """Where one speculative variant stops paying as concurrency grows (from its paired ratios to the baseline)."""

    variant: str
    method: str
    status: Literal["crosses", "pays_everywhere", "never_pays", "unclear"]
    concurrency: float | None = None
    """The concurrency at which the ratio's point estimate falls to 1 (log-linear between measured levels)."""
    low: float | None = None
    high: float | None = None
    """Where the ratio's 95% interval bounds cross 1 (None: that bound does not cross within the levels)."""
    ratios: dict[str, Interval] = Field(default_factory=dict)
    """Level -> the variant's throughput ratio to the baseline."""
    text: str


class KSchedule(_Model):
    """A batch-size -> lookahead schedule (vLLM's `num_speculative_tokens_per_batch_size`), written to the
    manifest only when measured as a variant of its own and found better than every fixed k it is built from."""

    variant: str
    """The schedule's variant name (measured like any other variant)."""
    schedule: list[list[int]]
    """[[first batch size, last batch size, k], ...] (inclusive ranges, from 1)."""
    built_from: dict[str, str] = Field(default_factory=dict)
    """Load level -> the fixed-k variant the choice rule picked there."""
    verified: bool = False
    """Measured at every level it covers and better than every fixed k there."""
    written: bool = False
    reason: str = ""


class LoadSummary(_Model):
    """What `--load` measured, and what it decided per load level."""

    spec: str
    levels: list[str]
    time_scale: float = 1.0
    burstiness: float = 1.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    requests_per_level: int = 0
    decisions: list[LevelDecision] = Field(default_factory=list)
    crossovers: list[Crossover] = Field(default_factory=list)
    schedule: KSchedule | None = None
    deploy_level: str | None = None
    """The level whose winner the manifest carries (the recorded load, `replay`, when measured)."""
    passes: list[str] = Field(default_factory=list)
    """What adding passes to unclear levels did (`optimize.level_repeats`), one line per candidate and level."""
    budget_ran_out: list[str] = Field(default_factory=list)
    """The unclear levels where one more pass did not fit `--budget-minutes`."""
