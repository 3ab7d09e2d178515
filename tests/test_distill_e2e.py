"""`draft distill` on the bundled SmolLM2: a few steps on three short requests give a draft that the engine
accepts as sharing the target's vocabulary, and that is far cheaper than the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runinfra_opt.distill.config import DistillConfig
from runinfra_opt.distill.pipeline import distill

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("shared_model_cache")]


def test_distilled_draft_for_smollm2_shares_the_vocabulary_and_is_cheap(tmp_path: Path) -> None:
    from runinfra_opt.engine.hf.engine import check_same_vocabulary
    from runinfra_opt.models import load_model

    workload = tmp_path / "w.jsonl"
    questions = ["Name three colours.", "What is 2 + 2?", "Say hello in French.", "Name a fruit."]
    workload.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": q}]}) + "\n"
            for i, q in enumerate(questions)
        ),
        encoding="utf-8",
    )
    out = tmp_path / "draft"
    config = DistillConfig(
        target="default", workload=str(workload), out=out, max_tokens=8, max_steps=2, threads=2, device="cpu"
    )
    summary = distill(config).summary
    assert summary["training"]["steps"] == 2
    assert summary["heldout_after"]["requests"] == 1
    assert summary["cost"]["c"] < 0.5  # a 288-wide head vs the target's 576-wide one and 30 layers
    target = load_model("default", device="cpu")
    draft = load_model(str(out), device="cpu")
    assert check_same_vocabulary(target, draft) is None
    assert draft.model.config.hidden_size == 288
