"""The run's cost model as `results.json` records it (`RunResults.cost_model`): what the run's predictor measured
and fitted, one part per predictor.

- `in_process`: the in-process predictor's forward/prefill cost tables (`predict.costmodel.CostModel`), the samples
  they were fitted on, their check against the baseline pass, and the model with generate-loop overheads fitted
  before and after confirmation;
- `serving`: the serving predictor's step-cost tables (the target's on the baseline's server, each draft model's on
  a server of its own), the corrections fitted at batch 1 and to the capacity searches' warm-ups, and the
  speculative step terms (`predict.overhead`).

A results file written before these types (a flat dict under about a dozen keys) reads into them
(`CostModelRecord._flat_dict`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from runinfra_opt.results.base import _Model

# ---- the in-process predictor ------------------------------------------------------------------------------------


class RoleCostRecord(_Model):
    """`predict.costmodel.RoleCost` as recorded (token counts as strings: JSON object keys)."""

    forward_s: dict[str, float] = Field(default_factory=dict)
    prefill_s: dict[str, float] = Field(default_factory=dict)
    ref_context: int = 0
    context_slope_s: float = 0.0
    prefill_line: list[float] | None = None


class SearchCostRecord(_Model):
    """`predict.costmodel.SearchCost` as recorded: per size (or candidates), (context, seconds) points."""

    scan_s: dict[str, list[list[float]]] = Field(default_factory=dict)
    extract_s: dict[str, list[list[float]]] = Field(default_factory=dict)


class FittedCosts(_Model):
    """`predict.costmodel.CostModel` as recorded (`CostModel.to_dict` / `from_dict`)."""

    roles: dict[str, RoleCostRecord] = Field(default_factory=dict)
    request_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    round_overhead_s: dict[str, float] = Field(default_factory=dict)
    drafted_token_overhead_s: dict[str, float] = Field(default_factory=dict)
    search: dict[str, SearchCostRecord] = Field(default_factory=dict)


class CostSampleRecord(_Model):
    """`predict.costmodel.CostSample` as recorded: one measured time."""

    role: str
    kind: str
    tokens: int
    context: int
    seconds: float
    runs: int = 1


class CostProvenance(_Model):
    """Which roles were measured and which read from the cost cache, and the cache files (`engine.hf.cost`)."""

    measured: list[str] = Field(default_factory=list)
    cached: list[str] = Field(default_factory=list)
    cache_files: list[str] = Field(default_factory=list)


class InProcessCosts(_Model):
    fitted: FittedCosts
    """The measured tables, no overheads fitted (phase `cost`; measured again by `check_cost` when off)."""
    provenance: CostProvenance = Field(default_factory=CostProvenance)
    samples: list[CostSampleRecord] = Field(default_factory=list)
    baseline_prediction_error: float | None = None
    """The raw model's prediction of the baseline pass over its measured time, minus 1 (`check_cost`)."""
    checked: bool = False
    """`check_cost` ran."""
    calibrated: FittedCosts | None = None
    """With the generate loop's overheads fitted to the profiling pass's baseline (phase `predict`)."""
    calibrated_after_confirm: FittedCosts | None = None
    """With them fitted to the confirmation's baseline repeats (phase `repredict`)."""


# ---- the serving predictor ---------------------------------------------------------------------------------------


class StepTableRecord(_Model):
    """`predict.steptable.StepCostTable` as recorded (`to_dict` / `from_dict`)."""

    batch_sizes: list[int]
    tokens: list[int]
    seconds: list[list[float]]
    prefill: list[list[float]] = Field(default_factory=list)
    """(prompt tokens, seconds) pairs."""
    context: int | None = None
    method: str = ""
    notes: list[str] = Field(default_factory=list)


class StepTrial(_Model):
    """One measured step of a step-cost measurement (`engine.vllm.stepcost`): `batch` sequences of `tokens` new
    tokens over `context` cached ones (context 0 and batch 1: a prefill of `tokens`)."""

    kind: str
    """`step` or `prefill`."""
    batch: int
    tokens: int
    context: int
    step_s: float
    """First token of the earliest probe minus the blocker's first token."""
    spread_s: float
    """Latest minus earliest probe's first token (the same step: small against `step_s`)."""
    blocker_tokens: int
    attempt: int
    """1 when the first try landed."""
    sweep: int = 0
    """Which pass over the grid it belongs to (0-based)."""


class RejectedTry(_Model):
    """A measuring try that did not land (`engine.vllm.stepcost`): what it was and why."""

    kind: str | None = None
    batch: int | None = None
    tokens: int | None = None
    attempt: int | None = None
    reason: str | None = None
    blocker_tokens: int | None = None
    lead_s: float | None = None


class StepCostsRecord(_Model):
    """A step-cost measurement on a server (`engine.vllm.stepcost.StepCostMeasurement.to_dict`)."""

    table: StepTableRecord
    trials: list[StepTrial] = Field(default_factory=list)
    rejected: list[RejectedTry] = Field(default_factory=list)
    block_size: int | None = None
    checked_on_counters: bool | None = None
    lone_ttft_s: list[float] = Field(default_factory=list)
    request_overhead_s: float | None = None
    wall_s: float | None = None


class Batch1Corrections(_Model):
    """The step and request corrections fitted at batch 1 (`predict.calibrate`), and what they were fitted to."""

    step_s: float
    request_s: float
    fitted_to: str


class CapacityCorrections(_Model):
    """The step corrections by batch size the capacity predictions use, and what they were read off."""

    by_batch: list[list[float]]
    """(batch size, step correction in seconds) points, ascending in the batch size."""
    request_s: float
    fitted_to: str


class SpecTerms(_Model):
    """`predict.overhead.SpecOverhead` as recorded: what a speculative server adds to the table's steps."""

    step_s: float = 0.0
    drafted_token_s: float = 0.0
    fitted_on: list[str] = Field(default_factory=list)
    requests: int = 0


class SpecOverheads(_Model):
    """The speculative step terms fitted on the confirmed variants' batch-1 requests, and per load level."""

    all: SpecTerms | None = None
    """Pooled over every timed speculative variant."""
    by_method: dict[str, SpecTerms] = Field(default_factory=dict)
    held_out: dict[str, SpecTerms] = Field(default_factory=dict)
    """Per timed variant: the terms fitted on the other timed variants."""
    method: str = ""
    levels: dict[str, dict[str, SpecTerms]] = Field(default_factory=dict)
    """Per load level, per variant: the per-drafted-token term fitted again on that level's decoding steps."""


class CapacitySpecOverheads(_Model):
    """The speculative step terms the capacity predictions use, fitted on the capacity searches' warm-ups."""

    by_method: dict[str, SpecTerms] = Field(default_factory=dict)
    method: str = ""


class ServingCosts(_Model):
    step_costs: StepCostsRecord
    """The target's step-cost measurement on the baseline's server (phase `cost`)."""
    draft_step_costs: dict[str, StepCostsRecord] = Field(default_factory=dict)
    """Per draft model's role: its step-cost measurement on a server of its own (phase `profile`)."""
    batch1_corrections: Batch1Corrections | None = None
    spec_overhead: SpecOverheads | None = None
    capacity_corrections: CapacityCorrections | None = None
    capacity_spec_overheads: CapacitySpecOverheads | None = None


# ---- the record ----------------------------------------------------------------------------------------------------

_IN_PROCESS_KEYS = (
    "fitted",
    "provenance",
    "samples",
    "baseline_prediction_error",
    "checked",
    "calibrated",
    "calibrated_after_confirm",
)
_SERVING_KEYS = (
    "step_costs",
    "draft_step_costs",
    "batch1_corrections",
    "spec_overhead",
    "capacity_corrections",
    "capacity_spec_overheads",
)


class CostModelRecord(_Model):
    """What the run's predictor measured and fitted: one part, the predictor's (both None: no predictor ran, or its
    measurement failed)."""

    in_process: InProcessCosts | None = None
    serving: ServingCosts | None = None

    @model_validator(mode="before")
    @classmethod
    def _flat_dict(cls, value: Any) -> Any:
        """A results file written before these types holds one flat dict: the in-process predictor's keys
        (`fitted`, `provenance`, `samples`, `baseline_prediction_error`, `checked`, `calibrated`,
        `calibrated_after_confirm`) or the serving predictor's (`step_costs`, `kind`, `draft_step_costs`,
        `batch1_corrections`, `spec_overhead`, `capacity_corrections`, `capacity_spec_overheads`)."""
        if not isinstance(value, dict) or "in_process" in value or "serving" in value:
            return value
        out: dict[str, Any] = {}
        if "fitted" in value:
            out["in_process"] = {key: value[key] for key in _IN_PROCESS_KEYS if key in value}
        if "step_costs" in value:
            out["serving"] = {key: value[key] for key in _SERVING_KEYS if key in value}
        return out
