"""The engine contract: load once, then generate one request under one variant into a typed record.

The in-process transformers engine (`runinfra_opt.engine.hf`) implements it first; an HTTP engine (vLLM,
SGLang) can implement it later. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from runinfra_opt.methods import Variant
from runinfra_opt.workload.model import Request


@dataclass
class RequestRecord:
    """What one generation of one request under one variant measured. Raw values; summaries derive from them."""

    request_id: str
    variant: str
    """Variant.name."""
    category: str
    greedy: bool
    prompt_tokens: int
    output_ids: list[int]
    ttft_s: float
    """Request start to the first generated token (seen by a streamer)."""
    e2e_s: float
    target_passes: int
    """Target model forward calls (the prefill counts as one)."""
    draft_passes: int
    """Draft model forward calls (early exit: forwards of the shallow sub-model; n-gram: 0)."""
    accepted_per_pass: list[int] = field(default_factory=list)
    """Draft tokens accepted at each target verification pass (speculative variants only)."""
    drafted_tokens: int = 0
    """Draft tokens proposed in total."""
    repeat: int = 0
    lossless: bool | None = None
    """Greedy output identical to the baseline's (None: not compared, or a sampled request)."""
    first_mismatch: int | None = None
    """First differing output position against the baseline, when not lossless."""

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (n - 1)."""
        n = self.output_tokens
        return (self.e2e_s - self.ttft_s) / (n - 1) if n > 1 else None

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted_per_pass)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_tokens"] = self.output_tokens
        data["tpot_s"] = self.tpot_s
        return data


class Engine(Protocol):
    """Generates one request under one variant and measures it."""

    def generate(self, request: Request, variant: Variant, *, max_tokens: int, repeat: int = 0) -> RequestRecord:
        """Run `request` under `variant` (warm-up is the caller's choice) and return the measured record."""
        ...

    def environment(self) -> dict[str, Any]:
        """python, torch, transformers, runinfra-opt versions, device, CPU, threads, dtype, model hashes."""
        ...
