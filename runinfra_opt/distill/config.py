"""Settings of one distillation, validated up front (bad values are user input errors, exit 2)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runinfra_opt.errors import UserInputError

HEAD_DIM = 64
INITS = ("layers", "embedding")
"""Attention head width of every draft (hidden must be a multiple of it)."""


@dataclass(frozen=True)
class DistillConfig:
    """What `runinfra-opt draft distill` was asked to do."""

    target: str
    workload: str
    out: Path
    layers: int = 2
    hidden: int = 288
    minutes: float = 5.0
    """Training time budget (teacher data generation and evaluation are not counted)."""
    seed: int = 0
    holdout: float = 0.25
    device: str = "auto"
    dtype: str = "auto"
    """The target's dtype (as in bench/optimize: its greedy outputs are what the draft must predict)."""
    train_dtype: str = "auto"
    """Training compute: bfloat16 autocast (auto picks it where the CPU/GPU supports it) or float32."""
    max_tokens: int = 96
    """Cap on each request's generated continuation (the request's own max_tokens applies when smaller)."""
    top_k: int = 32
    """Teacher logits kept per position for the soft labels."""
    max_steps: int | None = None
    """Stop after this many optimizer steps even if time is left (tests, reproducible runs)."""
    lookahead: int = 4
    """Lookahead of the held-out acceptance report."""
    learning_rate: float = 2e-3
    batch_tokens: int = 2048
    """Tokens (padded) per optimizer step."""
    max_seq_tokens: int = 1024
    """Longer training sequences keep their last max_seq_tokens tokens."""
    prompt_weight: float = 0.3
    """Loss weight of prompt positions relative to continuation positions."""
    prompt_positions: int = 128
    """Prompt positions sampled per sequence and step for the loss (the vocabulary projection dominates)."""
    threads: int | None = None
    init: str = "layers"
    """`layers`: the target's layers (evenly spaced) projected onto the top principal directions of its residual
    stream; `embedding`: only the target's embedding (projected), layers random; or a model directory: start
    from that model (an earlier draft, or a small pretrained model with the target's vocabulary)."""

    @property
    def init_from_model(self) -> bool:
        return self.init not in INITS

    def validate(self) -> None:
        problems = []
        if not 1 <= self.layers <= 64:
            problems.append(f"--layers {self.layers}: expected 1..64")
        if self.init == "embedding" and (self.hidden < HEAD_DIM or self.hidden % HEAD_DIM or self.hidden > 8192):
            problems.append(f"--hidden {self.hidden}: expected a multiple of {HEAD_DIM} between 64 and 8192")
        if self.init == "layers" and not 8 <= self.hidden <= 8192:
            problems.append(f"--hidden {self.hidden}: expected 8..8192 (and a multiple of the target's heads)")
        if not self.minutes > 0:
            problems.append(f"--minutes {self.minutes}: expected > 0")
        if not 0 <= self.holdout < 1:
            problems.append(f"--holdout {self.holdout}: expected a fraction in [0, 1)")
        if self.max_tokens < 1:
            problems.append(f"--max-tokens {self.max_tokens}: expected >= 1")
        if self.top_k < 1:
            problems.append(f"--top-k {self.top_k}: expected >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            problems.append(f"--max-steps {self.max_steps}: expected >= 1")
        if self.lookahead < 1:
            problems.append(f"--lookahead {self.lookahead}: expected >= 1")
        if self.train_dtype not in ("auto", "float32", "bfloat16"):
            problems.append(f"--train-dtype {self.train_dtype}: expected auto, float32 or bfloat16")
        if self.init_from_model and not (Path(self.init) / "config.json").is_file():
            problems.append(f"--init {self.init}: expected {', '.join(INITS)} or a model directory (with config.json)")
        if self.threads is not None and self.threads < 1:
            problems.append(f"--threads {self.threads}: expected >= 1")
        if problems:
            raise UserInputError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["out"] = str(self.out)
        return data

    def training_key(self) -> str:
        """Hash of every setting that changes the trained weights (not out, minutes or threads), so a
        checkpoint is resumed only by a run that would have produced it."""
        data = self.to_dict()
        for name in ("out", "minutes", "max_steps", "threads", "lookahead", "device"):
            data.pop(name)
        if self.init_from_model:
            from runinfra_opt.models import dir_fingerprint

            data["init_sha256"] = dir_fingerprint(Path(self.init))  # a changed starting model is a new run
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
