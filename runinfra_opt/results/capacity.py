"""Capacity in the results file (`optimize.capacity`): each offered rate of a search, a variant's capacity
(predicted, then measured), and the decision by servers needed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from runinfra_opt.results.base import Interval, _Model


class CapacityLevel(_Model):
    """One offered rate of a capacity search: what the server attained there, and whether it sustained it."""

    rate: float
    """Offered requests/s."""
    requests: int
    attained: float | None = None
    """The share of requests that succeeded within every SLO (None without an SLO)."""
    ttft_s: dict[str, float] = Field(default_factory=dict)
    tpot_s: dict[str, float] = Field(default_factory=dict)
    kept_up: bool = True
    """The queue did not grow through the window, nothing failed, nothing was preempted."""
    passed: bool = False
    reason: str = ""
    """Why the rate was missed (empty when sustained)."""
    preemptions: int | None = None
    kv_cache_peak: float | None = None
    """The highest KV-cache usage (0-1) the server reported during the level."""
    records: str | None = None
    wall_s: float | None = None
    purpose: Literal["search", "unclear", "confirm"] = "search"
    """Why the search ran it: a rate the search offered, a rate's second run because its first verdict was unclear,
    or the capacity found run once more to confirm it (`optimize.capacity.search`)."""


class VariantCapacity(_Model):
    """A variant's capacity: predicted (every predictable variant), then searched on its server (launched ones)."""

    predicted: float | None = None
    """The serving predictor's highest sustained rate, with the latest calibration."""
    before_warmup: float | None = None
    """The prediction before this variant's server warmed up for its search (the last before any of its own steps
    under load were seen)."""
    search_start: float | None = None
    """The predicted rate the search started at: predicted again once the server had warmed up, with the steps its
    warm-up showed (no searched rate is seen by it)."""
    measured: Interval | None = None
    """The highest rate sustained (value and low) and the lowest missed above it (high)."""
    status: Literal["bracketed", "at_least", "below", "stopped"] | None = None
    levels: list[CapacityLevel] = Field(default_factory=list)
    """Every run of the search in order; a rate whose verdict was unclear appears once per run of it."""
    warmup_s: float | None = None
    """The untimed warm-up's seconds on this variant's server before its first rate (`optimize.capacity.warm_up`)."""
    warmup_records: str | None = None
    """The warm-up's records (judged by nothing; the baseline's decoding steps calibrate the capacity predictions)."""
    note: str | None = None


class CapacityRow(_Model):
    """One variant in the capacity decision."""

    variant: str
    capacity: float
    low: float | None = None
    high: float | None = None
    source: Literal["measured", "predicted"]
    servers: int | None = None
    headroom: float | None = None
    """Spare share of the target rate the servers carry (servers x capacity / target - 1)."""
    cost_per_hour: float | None = None
    cost_per_million_tokens: float | None = None
    eligible: bool = True
    why_not: str | None = None


UNSATURATED = "the recorded load does not saturate the server (throughput there is only the offered load)"
"""`CapacitySummary.why` when throughput at the recorded load asked for capacity (not `--priority capacity`)."""


class CapacitySummary(_Model):
    """What capacity was searched against and how (`optimize.capacity`), and the decision by it."""

    criterion: Literal["slo", "saturation"]
    """slo: the attainment of the SLOs; saturation: the server keeps up (no SLO given)."""
    why: str
    """Why capacity decides: `--priority capacity`, or throughput at a recorded load that does not saturate."""
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    attainment: float = 0.99
    target_rate: float | None = None
    target_source: str | None = None
    arrivals: str = "poisson"
    tolerance: float = 0.1
    max_levels: int = 6
    requests_per_level: int = 0
    server_cost_per_hour: float | None = None
    plan: list[str] = Field(default_factory=list)
    budget_ran_out: list[str] = Field(default_factory=list)
    rows: list[CapacityRow] = Field(default_factory=list)
    winner: str | None = None
    reason: str | None = None

    @property
    def answered(self) -> bool:
        """Capacity told the variants apart (a winner): the reports show server counts and the manifest carries a
        capacity section only then."""
        return self.winner is not None
