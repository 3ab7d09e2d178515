"""The one request record: what one generation of one request under one variant measured (or was predicted to).

Engines return it, `bench` aggregates it, `optimize` stores it in results.json (measured and predicted) and the
statistics read it. Raw values; summaries derive from them. Imports nothing heavy and no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

TIE_TOLERANCES = {"bfloat16": 0.25, "float16": 0.05, "float32": 0.01}
"""`--tie-tolerance` by the engine's dtype (nats): a divergence where the baseline's top-1 and top-2
log-probabilities are this close is a numerical near-tie. bfloat16 keeps 8 significant bits: SmolLM2's top
logits (magnitude 16-32) are spaced 0.125 apart, and on vLLM's bfloat16 server every margin seen at a divergence
was 0.0 or 0.125 (one step): two steps, 0.25, is the bf16 default. float16 keeps 11 bits (a step of 0.016 there);
float32 is exact but for summation order (1e-5-scale differences): 0.01 leaves only true ties."""


def default_tie_tolerance(dtype: str | None) -> float:
    """The tie tolerance for an engine running in `dtype` (float32's when unknown)."""
    return TIE_TOLERANCES.get(str(dtype), TIE_TOLERANCES["float32"])


class RequestRecord(BaseModel):
    """One request under one variant: raw measured values (one per repeat) or predicted values.

    `output_ids` is kept where losslessness is checked (measured records); predicted records and calibration
    runs have none. `output_tokens`, `tpot_s` and `accepted_tokens` are derived from `output_ids` and
    `accepted_per_pass` when not given."""

    model_config = ConfigDict(extra="allow")

    request_id: str
    category: str
    greedy: bool = True
    repeat: int = 0
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    """Request start to the first generated token (seen by a streamer)."""
    e2e_s: float
    tpot_s: float | None = None
    """Time per output token after the first: (e2e - ttft) / (n - 1)."""
    target_passes: int
    """Target model forward calls (the prefill counts as one)."""
    draft_passes: int = 0
    """Draft model forward calls (early exit: forwards of the shallow sub-model; n-gram: 0)."""
    drafted_tokens: int = 0
    """Draft tokens proposed in total."""
    accepted_tokens: int = 0
    accepted_per_pass: list[int] = Field(default_factory=list)
    """Draft tokens accepted at each target verification pass (speculative variants only)."""
    lossless: bool | None = None
    """Greedy output identical to the baseline's (None: not compared, or a sampled request)."""
    first_mismatch: int | None = None
    """First differing output position against the baseline, when not lossless."""
    output_ids: list[int] | None = None
    """The generated token ids (measured records; None where not kept)."""
    top_margins: list[float | None] | None = None
    """Per output position, log p(top-1) - log p(top-2) as the engine reported them (the vLLM engine; None
    where not reported). The near-tie rule of `compare_to_baseline` reads the baseline's."""
    near_tie: bool | None = None
    """Not lossless, but the first divergence is at a position where the baseline's top two candidates were
    within the tie tolerance: a numerical near-tie (reduced-precision kernels), reported, not disqualifying."""
    variant: str | None = None
    """Variant.name, set by the engine (containers of records also key them by variant)."""
    trial: str | None = None
    """The trial that measured it, where trials run apart (`optimize --executor ray`: a variant timed with its
    own baseline repeats on one node); records pair with the baseline's only within their trial. None: every
    variant was timed with one baseline, in one process."""

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        """Fill the derived counts from the raw values when they are not given."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        ids = data.get("output_ids")
        if "output_tokens" not in data and ids is not None:
            data["output_tokens"] = len(ids)
        if "tpot_s" not in data and "output_tokens" in data:
            n = int(data["output_tokens"])
            data["tpot_s"] = (data["e2e_s"] - data["ttft_s"]) / (n - 1) if n > 1 else None
        if "accepted_tokens" not in data:
            data["accepted_tokens"] = sum(data.get("accepted_per_pass") or [])
        return data

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def compare_to_baseline(
    record: RequestRecord, baseline_record: RequestRecord, *, tie_tolerance: float | None = None
) -> RequestRecord:
    """Fill `record.lossless` / `record.first_mismatch` (and `near_tie`) against the baseline's output for the
    same request.

    Only greedy requests are compared (sampled outputs legitimately differ: lossless stays None). The first
    mismatch is the first differing position, or the shorter length when one output is a prefix of the other.
    With `tie_tolerance` and the baseline's `top_margins`, a first mismatch where the baseline's top-1 and
    top-2 log-probabilities were within the tolerance is a numerical near-tie (`near_tie=True`): the outputs
    still differ (`lossless=False`), but the divergence is not evidence of a wrong variant.
    """
    if record.request_id != baseline_record.request_id:
        raise ValueError(f"comparing request {record.request_id} with baseline of {baseline_record.request_id}")
    if not (record.greedy and baseline_record.greedy):
        record.lossless, record.first_mismatch = None, None
        return record
    ours, theirs = record.output_ids, baseline_record.output_ids
    if ours is None or theirs is None:
        raise ValueError(f"request {record.request_id}: no output ids kept to compare")
    if ours == theirs:
        record.lossless, record.first_mismatch, record.near_tie = True, None, None
        return record
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    record.lossless, record.first_mismatch = False, first
    margins = baseline_record.top_margins
    record.near_tie = False
    if tie_tolerance is not None and margins is not None and first < len(margins):
        margin = margins[first]
        record.near_tie = margin is not None and margin <= tie_tolerance
    return record


NO_PASS_SAVED = "saved no target pass (none produced more than one token): a measured gain is noise"
"""What `optimize` rules such a variant out with and `bench` notes under its table (`saved_a_pass`)."""


def saved_a_pass(records: Sequence[RequestRecord]) -> bool:
    """Whether any target pass of `records` produced more than one token (an accepted draft token). A speculative
    variant that never did does all the baseline's target passes and its drafting besides, so it cannot be
    faster, and a gain measured for it (a machine's drift between its passes and the baseline's) must not make it
    win. Judged on passes and tokens, which every engine reports, not on acceptance counters."""
    return any(r.target_passes < r.output_tokens for r in records)


def disqualifying(record: RequestRecord) -> bool:
    """A greedy output that differs from the baseline's at a confident position (not a near-tie)."""
    return record.lossless is False and not record.near_tie
