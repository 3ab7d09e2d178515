"""The whole `runinfra-opt draft distill` job: teacher data, held-out split, initialise, train, evaluate, save.

`distill(config, progress)` returns a `DistillReport` and leaves in `config.out` a standard transformers
checkpoint (LlamaForCausalLM + the target's tokenizer), `distill.json` (settings, data fingerprint, cost
ratio, held-out acceptance before/after) and `checkpoint/` (to resume or continue training).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runinfra_opt import __version__
from runinfra_opt.distill.config import DistillConfig
from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.workload.fingerprint import prompt_digest

REPORT_FILE = "distill.json"
CHECKPOINT_DIR = "checkpoint"
COST_CONTEXT_TOKENS = 128


class DistillProgress(Protocol):
    """What the pipeline tells its caller as it goes (the CLI renders it as rich progress bars)."""

    def stage(self, name: str, done: int, total: int) -> None: ...

    def train_step(self, step: int, loss: float, elapsed_s: float, budget_s: float, max_steps: int | None) -> None: ...

    def message(self, text: str) -> None: ...


class SilentProgress:
    def stage(self, name: str, done: int, total: int) -> None:
        return None

    def train_step(self, step: int, loss: float, elapsed_s: float, budget_s: float, max_steps: int | None) -> None:
        return None

    def message(self, text: str) -> None:
        return None


@dataclass
class DistillReport:
    out: Path
    skipped: bool
    """True when `out` already held a draft made by the same settings (nothing was done)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """The contents of distill.json."""


def request_key(config: DistillConfig, target_sha256: str | None, workload_fingerprint: str) -> dict[str, Any]:
    """What identifies a finished distillation: same inputs and settings give the same draft."""
    return {
        "target_sha256": target_sha256,
        "workload_fingerprint": workload_fingerprint,
        "training_key": config.training_key(),
        "minutes": config.minutes,
        "max_steps": config.max_steps,
    }


def up_to_date(out: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The existing distill.json when `out` holds a complete draft made with `key`, else None."""
    report = out / REPORT_FILE
    if not report.is_file() or not (out / "config.json").is_file():
        return None
    try:
        saved = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None
    # Drafts written before training prompts were recorded are redone (bench/optimize need the digests).
    return saved if "train_prompt_digests" in saved.get("workload", {}) else None


def distill(config: DistillConfig, progress: DistillProgress | None = None, *, force: bool = False) -> DistillReport:
    """Distil a draft for `config.target` from its greedy outputs on `config.workload`; see the module doc."""
    config.validate()
    progress = progress or SilentProgress()
    from runinfra_opt.models import load_model, resolve_model
    from runinfra_opt.workload import load_workload

    workload = load_workload(config.workload)
    resolved = resolve_model(config.target)
    key = request_key(config, resolved.sha256(), workload.fingerprint)
    if not force and (existing := up_to_date(config.out, key)) is not None:
        return DistillReport(config.out, True, existing)
    if config.out.exists() and not config.out.is_dir():
        raise UserInputError(f"--out {config.out}: exists and is not a directory")

    import torch

    from runinfra_opt.distill.data import build_teacher_data
    from runinfra_opt.distill.evaluate import cost_ratio, heldout_acceptance
    from runinfra_opt.distill.split import holdout_split
    from runinfra_opt.distill.train import check_width, make_draft, make_examples, save_draft, train, use_autocast
    from runinfra_opt.engine.prompts import PromptTokenizer

    started = time.perf_counter()
    target = load_model(config.target, device=config.device, dtype=config.dtype)
    check_width(target.model.config, config)  # before the teacher data: a bad --hidden fails in seconds
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    prompts = PromptTokenizer.for_model(target.model, target.tokenizer, label=target.name)  # as the engines do
    # A request that does not fit the target's context is an input error naming its line.
    prompts.filter_requests(workload.requests, max_tokens=config.max_tokens, source=workload.path)
    train_idx, held_idx = holdout_split(workload.requests, config.holdout)
    if not train_idx:
        raise UserInputError(f"workload {workload.name}: no requests left for training after the held-out split")
    data = build_teacher_data(
        target,
        workload,
        prompts.prompt_ids,
        max_tokens=config.max_tokens,
        top_k=config.top_k,
        progress=progress.stage,
    )
    progress.message(
        f"teacher data: {data.meta['requests']} requests, {data.meta['prompt_tokens']} prompt + "
        f"{data.meta['continuation_tokens']} continuation tokens ({data.meta.get('generation')})"
    )
    draft = make_draft(target.model, data, train_idx, config)
    draft.to(target.device)  # type: ignore[arg-type]
    before = heldout_acceptance(draft, data, held_idx, config.lookahead) if held_idx else {"requests": 0}
    examples = make_examples(data, train_idx, config.max_seq_tokens)
    budget_s = config.minutes * 60.0

    def on_step(step: int, loss: float, elapsed_s: float) -> None:
        progress.train_step(step, loss, elapsed_s, budget_s, config.max_steps)

    checkpoint = config.out / CHECKPOINT_DIR
    state = train(draft, examples, config, checkpoint, config.training_key(), device=target.device, on_step=on_step)
    after = heldout_acceptance(draft, data, held_idx, config.lookahead) if held_idx else {"requests": 0}
    context = data.sequences[held_idx[0] if held_idx else train_idx[0]].ids[:COST_CONTEXT_TOKENS]
    cost = cost_ratio(draft, target.model, context, device=target.device)
    save_draft(draft, target.tokenizer, config.out)
    summary = {
        "runinfra_opt_version": __version__,
        "key": key,
        "settings": config.to_dict(),
        "target": target.info(),
        "workload": {
            "name": workload.name,
            "fingerprint": workload.fingerprint,
            "requests": len(workload.requests),
            "train_requests": [workload.requests[i].id for i in train_idx],
            # bench and optimize leave these prompts out when they measure this draft (it has memorised them).
            "train_prompt_digests": [prompt_digest(workload.requests[i]) for i in train_idx],
            "heldout_requests": [workload.requests[i].id for i in held_idx],
        },
        "data": data.meta,
        "draft": {
            "layers": int(draft.config.num_hidden_layers),
            "hidden": int(draft.config.hidden_size),
            "num_parameters": int(sum(p.numel() for p in draft.parameters())),
            "bf16_autocast": use_autocast(config.train_dtype, target.device),
        },
        "training": {
            "steps": state.step,
            "seconds": round(state.elapsed_s, 1),
            "final_loss": state.last_loss,
            "threads": torch.get_num_threads(),
        },
        "cost": cost,
        "heldout_before": before,
        "heldout_after": after,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    atomic_write_text(config.out / REPORT_FILE, json.dumps(summary, indent=2) + "\n")
    return DistillReport(config.out, False, summary)
