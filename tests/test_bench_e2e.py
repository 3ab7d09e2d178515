"""End to end on the bundled SmolLM2: prompt lookup against the baseline over two small requests is lossless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app

# The bundled SmolLM2 converts once per session (conftest).
pytestmark = pytest.mark.usefixtures("shared_model_cache")


@pytest.mark.e2e
def test_ngram_vs_baseline_on_smollm2_is_lossless(runner: CliRunner, tmp_path: Path) -> None:
    passage = (
        "The harbour office opens at 8:00 on weekdays and at 9:30 on Saturdays. Ferries to the north island "
        "leave every forty minutes; the last ferry leaves at 21:10. Tickets are sold at the harbour office."
    )
    rows = [
        {
            "id": "copy",
            "category": "summarize",
            "messages": [{"role": "user", "content": f"{passage}\n\nRepeat the first sentence exactly."}],
            "max_tokens": 24,
        },
        {"id": "plain", "category": "chat", "prompt": "The capital of France is", "max_tokens": 12},
    ]
    workload = tmp_path / "tiny.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = runner.invoke(
        app,
        ["bench", "--workload", str(workload), "--method", "ngram", "--lookahead", "4", "--vs-baseline", "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["lossless"] is True
    assert data["mismatches"] == []
    base = {r["request_id"]: r for r in data["records"]["baseline"]}
    ngram = {r["request_id"]: r for r in data["records"]["ngram-n2-k4"]}
    assert base.keys() == ngram.keys() == {"copy", "plain"}
    for rid, record in base.items():
        assert record["target_passes"] == record["output_tokens"]
        assert ngram[rid]["output_ids"] == record["output_ids"]
    # Copying a sentence from the prompt: prompt lookup verifies several tokens per pass.
    assert ngram["copy"]["target_passes"] < ngram["copy"]["output_tokens"]
    assert data["environment"]["model_sha256"]["target"]
