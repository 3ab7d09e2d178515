"""`workload inspect`: the statistics core (pure) and its rendering, through the real CLI."""

from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.cli.workload import render_stats
from runinfra_opt.workload import load_workload
from runinfra_opt.workload.inspect import inspect_workload, percentile

FIXTURES = Path(__file__).parent / "workload_fixtures"
NATIVE = FIXTURES / "native.jsonl"


def test_percentile_matches_numpy() -> None:
    import numpy as np

    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([7.0], 99) == 7.0


def test_inspect_json_figures(runner: CliRunner) -> None:
    result = runner.invoke(app, ["workload", "inspect", str(NATIVE), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    workload = load_workload(str(NATIVE))
    assert stats["fingerprint"] == workload.fingerprint
    assert stats["fingerprint_short"] == f"sha256:{workload.fingerprint[:12]}"
    assert stats["requests"] == 3
    assert stats["categories"] == {"chat": 2, "code": 1}
    assert stats["chat_requests"] == 3
    # arrivals 0, 1.5, 4.25: gaps 1.5 and 2.75
    assert stats["duration_s"] == pytest.approx(4.25)
    assert stats["mean_rate_per_s"] == pytest.approx(2 / 4.25)
    gaps = [1.5, 2.75]
    assert stats["burstiness_cv"] == pytest.approx(statistics.pstdev(gaps) / statistics.mean(gaps))
    # character lengths of the prompt text (messages joined by newlines)
    lengths = sorted(len(r.prompt_text()) for r in workload.requests)
    assert stats["length_unit"] == "characters"
    assert stats["prompt_length"]["p50"] == lengths[1]
    assert stats["max_tokens"]["p50"] == 64  # 32, 64 and the default 128
    assert stats["max_tokens"]["p90"] == pytest.approx(64 + 0.8 * 64)
    assert stats["max_tokens_defaulted"] == 1
    assert stats["greedy_share"] == pytest.approx(2 / 3)
    assert stats["sampled_share"] == pytest.approx(1 / 3)
    per_category = {c["name"]: c for c in stats["per_category"]}
    # chat: "The capital of France is Paris." has 5 word 3-grams, one ("capital of France") in the prompt;
    # "Hi!" has none. code: 8 3-grams, "def f (" and ") : return" occur in the prompt.
    assert per_category["chat"]["predictability"] == pytest.approx(1 / 5)
    assert per_category["code"]["predictability"] == pytest.approx(2 / 8)
    assert per_category["chat"]["responses"] == 2


def test_inspect_without_timing_or_responses(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text('{"prompt": "abc", "temperature": 0.8}\n{"prompt": "abcdefg", "max_tokens": 10}\n')
    result = runner.invoke(app, ["workload", "inspect", str(path), "--json"])
    stats = json.loads(result.stdout)
    assert stats["has_timing"] is False
    assert stats["duration_s"] is None
    assert stats["burstiness_cv"] is None
    assert stats["per_category"][0]["predictability"] is None
    result = runner.invoke(app, ["workload", "inspect", str(path)], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "burstiness (CV of gaps) │ n/a" in result.stdout
    assert "n/a (no arrival times: back to back)" in result.stdout
    assert "1 request(s) without max_tokens got 128" in result.stdout


def test_rendered_tables() -> None:
    workload = load_workload(str(NATIVE))
    stats = inspect_workload(workload)
    buffer = io.StringIO()
    render_stats(stats, Console(width=120, file=buffer, color_system=None))
    text = buffer.getvalue()
    assert f"workload native (sha256:{stats.fingerprint[:12]}), jsonl" in text
    assert "Lengths (characters)" in text
    assert "│ requests                │ 3 (3 chat, 0 prompt)" in text
    assert "chat 2, code 1" in text
    assert "0.471 requests/s" in text
    row = next(line for line in text.splitlines() if line.startswith("│ code"))
    cells = [cell.strip() for cell in row.split("│")[1:7]]
    code_prompt = len(workload.requests[1].prompt_text())
    assert cells == ["code", "1 (33%)", str(code_prompt), "0%", "1", "25%"]


def test_inspect_in_tokens_with_a_tokenizer(runner: CliRunner, tiny_models: tuple[Path, Path]) -> None:
    from transformers import AutoTokenizer

    target, _ = tiny_models
    result = runner.invoke(app, ["workload", "inspect", str(NATIVE), "--json", "--tokenizer", str(target)])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["length_unit"] == "tokens"
    assert stats["ngram_unit"] == "tokens"
    tokenizer = AutoTokenizer.from_pretrained(target)
    expected = []
    for request in load_workload(str(NATIVE)).requests:
        chat = [{"role": m.role, "content": m.content} for m in request.messages or ()]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        expected.append(len(ids if isinstance(ids, list) else ids["input_ids"]))
    assert stats["prompt_length"]["p50"] == sorted(expected)[1]
    assert stats["prompt_length"]["p50"] > 40 + len("<|im_start|>user")  # the chat template counts
    predictability = stats["per_category"][0]["predictability"]
    assert predictability is not None
    assert 0 < predictability <= 1
    assert not math.isnan(stats["prompt_length"]["p99"])
    result = runner.invoke(app, ["workload", "inspect", str(NATIVE), "--tokenizer", str(target)])
    assert result.exit_code == 0, result.output
    assert "Lengths (tokens, tokenizer" in result.stdout


def test_bad_tokenizer_is_bad_input(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["workload", "inspect", str(NATIVE), "--tokenizer", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "error:" in result.stderr
