"""`workload inspect --tokenizer default` on the bundled SmolLM2 tokenizer (e2e: converts the GGUF once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.workload import load_workload

# The bundled SmolLM2 converts once per session (conftest).
pytestmark = pytest.mark.usefixtures("shared_model_cache")

NATIVE = Path(__file__).parent / "workload_fixtures" / "native.jsonl"


@pytest.mark.e2e
def test_inspect_with_the_bundled_smollm2_tokenizer(runner: CliRunner) -> None:
    from runinfra_opt.models import load_tokenizer

    result = runner.invoke(app, ["workload", "inspect", str(NATIVE), "--json", "--tokenizer", "default"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    tokenizer = load_tokenizer("default")
    expected = []
    for request in load_workload(str(NATIVE)).requests:
        chat = [{"role": m.role, "content": m.content} for m in request.messages or ()]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        expected.append(len(ids if isinstance(ids, list) else ids["input_ids"]))
    assert stats["length_unit"] == "tokens"
    assert stats["prompt_length"]["p50"] == sorted(expected)[1]
