"""The vllm engine's own options, typed and validated here (the registry's `options` entry for `vllm`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from runinfra_opt.engine.registry import EngineOptions
from runinfra_opt.errors import UserInputError


@dataclass(frozen=True)
class VllmOptions(EngineOptions):
    """`--vllm-python`, `--pair-baseline/--no-pair-baseline` and `--tie-tolerance`."""

    OPTIONS: ClassVar[dict[str, str]] = {
        "vllm_python": "python",
        "pair_baseline": "pair_baseline",
        "tie_tolerance": "tie_tolerance",
    }

    python: str | None = None
    """The python of a vLLM environment the user already has (None: `engine install vllm`'s)."""
    pair_baseline: bool = True
    """On CPU, where the baseline's server can stay up beside a candidate's: time each candidate beside the
    baseline, requests alternating between the two; False: one server at a time, each variant against the
    baseline's own repeats."""
    tie_tolerance: float | None = None
    """Nats: a greedy divergence where the baseline's top two candidates were this close is a numerical
    near-tie, reported but not disqualifying. None: by the engine's dtype (`records.TIE_TOLERANCES`)."""

    def __post_init__(self) -> None:
        if self.python is not None and not str(self.python).strip():
            raise UserInputError("--vllm-python: empty (the path of a python with vLLM installed)")
        if self.tie_tolerance is not None and self.tie_tolerance < 0:
            raise UserInputError(f"--tie-tolerance {self.tie_tolerance}: must be >= 0 (0: only exact ties)")

    def opener_kwargs(self) -> dict[str, Any]:
        return {"vllm_python": self.python} if self.python else {}

    @property
    def near_tie_nats(self) -> float | None:
        return self.tie_tolerance

    @property
    def pairs_baseline(self) -> bool:
        return self.pair_baseline
