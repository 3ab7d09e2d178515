"""A serving engine's measured step-cost table: what one scheduler step of the target takes by the number of
sequences in the batch and the tokens each carries in it (1 for plain decoding, k + 1 when k drafted tokens are
verified), and what a prefill takes by prompt length.

The engine measures it (`runinfra_opt.engine.vllm.stepcost`); the serving predictor (`predict.serving`) prices
simulated rounds with it. It is measured points and their interpolation, not a formula: verification on a CPU is
neither free nor linear in the tokens per sequence. Nothing here imports numpy at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from runinfra_opt.predict.interpolate import interpolate


@dataclass(frozen=True)
class StepCostTable:
    """Seconds of one step by (batch size, tokens per sequence), and of a prefill by prompt tokens."""

    batch_sizes: tuple[int, ...]
    """Measured batch sizes, ascending (sequences in one step)."""
    tokens: tuple[int, ...]
    """Measured tokens per sequence in one step, ascending (1 = a plain decoding step; k + 1 = a verification
    of k drafted tokens)."""
    seconds: tuple[tuple[float, ...], ...]
    """`seconds[i][j]`: the step time at `batch_sizes[i]` sequences of `tokens[j]` tokens each."""
    prefill: tuple[tuple[int, float], ...] = ()
    """(prompt tokens, seconds) of a prefill alone, ascending in tokens (empty: `prefill_s` uses the steps)."""
    context: int | None = None
    """The context length (KV cache per sequence) the steps were measured at."""
    method: str = ""
    """How it was measured, in words (for results and docs)."""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.batch_sizes or not self.tokens:
            raise ValueError("a step-cost table needs at least one batch size and one token count")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or list(self.tokens) != sorted(set(self.tokens)):
            raise ValueError("batch sizes and token counts must be ascending and distinct")
        if len(self.seconds) != len(self.batch_sizes) or any(len(row) != len(self.tokens) for row in self.seconds):
            raise ValueError("seconds must have one row per batch size and one column per token count")
        if min(self.batch_sizes) < 1 or min(self.tokens) < 1:
            raise ValueError("batch sizes and token counts start at 1")

    def step_s(self, batch: int, tokens_per_seq: float) -> float:
        """One step of `batch` sequences carrying `tokens_per_seq` tokens each: linear in the tokens within a
        measured batch size, then linear in the batch size between (and beyond) the measured ones."""
        if batch < 1:
            raise ValueError("a step has at least one sequence")
        by_batch = [
            (float(b), interpolate(list(zip(map(float, self.tokens), row, strict=True)), tokens_per_seq))
            for b, row in zip(self.batch_sizes, self.seconds, strict=True)
        ]
        return interpolate(by_batch, float(batch))

    def prefill_s(self, prompt_tokens: int) -> float:
        """A prefill of `prompt_tokens` tokens alone (piecewise linear over the measured lengths); without
        prefill points, one step of one sequence of that many tokens."""
        if self.prefill:
            return interpolate([(float(n), s) for n, s in self.prefill], float(prompt_tokens))
        return self.step_s(1, float(prompt_tokens))

    def monotone(self) -> StepCostTable:
        """The same table with every batch size's row made non-decreasing in the tokens per sequence: the least-squares
        non-decreasing fit of the measured cells (scipy's `isotonic_regression`; a row that already rises is kept
        as measured). A step that carries more tokens does not cost less on vLLM's CPU server, but single noisy
        cells can measure less than their neighbours, and the speculating servers' steps do not follow them
        (re-predicting the recorded runs with and without it: `benchmarks/repredict.py`)."""
        from scipy.optimize import isotonic_regression

        rows = tuple(tuple(float(s) for s in isotonic_regression(row).x) for row in self.seconds)
        return replace(self, seconds=rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_sizes": list(self.batch_sizes),
            "tokens": list(self.tokens),
            "seconds": [list(row) for row in self.seconds],
            "prefill": [list(point) for point in self.prefill],
            "context": self.context,
            "method": self.method,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepCostTable:
        return cls(
            batch_sizes=tuple(int(b) for b in data["batch_sizes"]),
            tokens=tuple(int(t) for t in data["tokens"]),
            seconds=tuple(tuple(float(s) for s in row) for row in data["seconds"]),
            prefill=tuple((int(n), float(s)) for n, s in data.get("prefill", [])),
            context=data.get("context"),
            method=str(data.get("method", "")),
            notes=tuple(data.get("notes", [])),
        )
