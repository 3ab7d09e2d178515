"""The engine contract: load once, then generate one request under one variant into a typed record
(`runinfra_opt.records.RequestRecord`).

The in-process transformers engine (`runinfra_opt.engine.hf`) implements it first; an HTTP engine (vLLM,
SGLang) can implement it later. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, Protocol

from runinfra_opt.records import RequestRecord
from runinfra_opt.variants import Variant
from runinfra_opt.workload.model import Request


class Engine(Protocol):
    """Generates one request under one variant and measures it."""

    def generate(self, request: Request, variant: Variant, *, max_tokens: int, repeat: int = 0) -> RequestRecord:
        """Run `request` under `variant` (warm-up is the caller's choice) and return the measured record."""
        ...

    def environment(self) -> dict[str, Any]:
        """python, torch, transformers, runinfra-opt versions, device, CPU, threads, dtype, model hashes."""
        ...
