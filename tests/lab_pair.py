"""The lab pair, a test instrument: a slow target and a good draft of the same tokenizer, built from the bundled
SmolLM2-135M-Instruct, so that draft-model speculation can be seen winning on this machine (tests/test_vllm_e2e.py
serves `SMALL`; benchmarks/lab_pair.py measures `FULL` and predictor_accuracy.py --lab-pair times it).

The draft is SmolLM2 itself (the float32 conversion of the bundled GGUF). The target is SmolLM2 with extra decoder
layers after its own 30: copies of its layers (extra layer j copies layer j mod 30) whose output projections
(`o_proj`, `down_proj`) are multiplied by a scale, so each adds a small term to the residual stream. The function
barely changes and the target's cost grows with its depth. Deterministic: the same bundled GGUF, depth and scale
build the same weights. Not a product default and no user-facing claim rests on it."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PairShape:
    extra_layers: int
    scale: float


FULL = PairShape(extra_layers=90, scale=0.05)
"""The benchmark pair (measured in-process: benchmarks/results/lab_pair.json)."""
SMALL = PairShape(extra_layers=60, scale=0.02)
"""The test pair: a shallower target (a smaller file, a faster build) whose draft is still cheap and accepted
often enough to win at batch 1 (measured in-process: benchmarks/results/lab_pair-small.json)."""

STAMP = "lab_pair.json"
"""Written last in DIR: the shape and the source model's hash; a directory whose stamp matches is reused."""


def _source() -> Path:
    from runinfra_opt.models import ensure_converted, resolve_model

    return ensure_converted(resolve_model("default"))


def _stamp(shape: PairShape, source: Path) -> dict[str, Any]:
    origin = json.loads((source / "source.json").read_text(encoding="utf-8"))
    return {"shape": asdict(shape), "source_sha256": origin["sha256"], "version": 1}


def build(out: Path, shape: PairShape = FULL) -> tuple[Path, Path]:
    """DIR/target and DIR/draft, built once per shape (reused while `STAMP` matches); written beside, renamed in."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _source()
    stamp = _stamp(shape, source)
    target, draft = out / "target", out / "draft"
    stamp_path = out / STAMP
    built = (target / "config.json").is_file() and (draft / "config.json").is_file()
    if built and stamp_path.is_file() and json.loads(stamp_path.read_text(encoding="utf-8")) == stamp:
        return target, draft
    out.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)
    for path in (target, draft):
        shutil.rmtree(path, ignore_errors=True)
    tmp = out / "draft.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns(".complete", "source.json"))
    tmp.rename(draft)

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source)
    layers = model.model.layers
    own = len(layers)
    with torch.no_grad():
        for j in range(shape.extra_layers):
            copy = _copy_layer(layers[j % own], own + j)
            copy.self_attn.o_proj.weight.mul_(shape.scale)
            copy.mlp.down_proj.weight.mul_(shape.scale)
            layers.append(copy)
    model.config.num_hidden_layers = own + shape.extra_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[0]] * model.config.num_hidden_layers
    tmp = out / "target.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name in ("generation_config.json",):
        if (source / name).is_file() and not (tmp / name).is_file():
            shutil.copy(source / name, tmp / name)
    tmp.rename(target)
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    return target, draft


def _copy_layer(layer: Any, index: int) -> Any:
    import copy

    clone = copy.deepcopy(layer)
    attention = getattr(clone, "self_attn", None)
    if attention is not None and hasattr(attention, "layer_idx"):
        attention.layer_idx = index  # the KV cache is indexed by layer
    return clone
