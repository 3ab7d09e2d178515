"""`draft distill` on tiny models: the saved draft works as an assistant, training is deterministic for a seed,
an interrupted run resumes to the same weights, a finished one is not redone, bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.distill.config import DistillConfig
from runinfra_opt.distill.pipeline import SilentProgress, distill
from runinfra_opt.distill.split import holdout_split
from runinfra_opt.workload.model import Request

TOPICS = ["cats", "the sea", "rain", "bread", "trains", "maps", "music", "snow", "glass", "stone", "wind", "ink"]


@pytest.fixture(scope="module")
def tiny_workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chat workload of 12 requests in two categories, short enough for a tiny model."""
    path = tmp_path_factory.mktemp("wl") / "tiny.jsonl"
    lines = []
    for i, topic in enumerate(TOPICS):
        category = "chat" if i % 2 else "json"
        content = f"tell me about {topic}" if category == "chat" else f'{{"topic": "{topic}", "n": {i}}}'
        lines.append(
            json.dumps({"id": f"r{i}", "category": category, "messages": [{"role": "user", "content": content}]})
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _config(target: Path, workload: Path, out: Path, **kw: object) -> DistillConfig:
    settings: dict[str, object] = {
        "layers": 1,
        "hidden": 64,
        "max_tokens": 12,
        "max_steps": 4,
        "minutes": 5.0,
        "batch_tokens": 256,
        "train_dtype": "float32",
        "device": "cpu",
        "threads": 2,
    }
    settings.update(kw)
    return DistillConfig(target=str(target), workload=str(workload), out=out, **settings)  # type: ignore[arg-type]


def _weights(out: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


def _same(a: dict[str, object], b: dict[str, object]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # type: ignore[arg-type]


def test_saved_draft_runs_as_assistant_and_is_lossless(
    tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, _ = tiny_models
    out = tmp_path / "draft"
    report = distill(_config(target_dir, tiny_workload, out), SilentProgress())
    assert not report.skipped
    summary = json.loads((out / "distill.json").read_text(encoding="utf-8"))
    assert summary["training"]["steps"] == 4
    assert summary["workload"]["heldout_requests"]
    assert summary["workload"]["train_requests"]
    assert set(summary["workload"]["heldout_requests"]).isdisjoint(summary["workload"]["train_requests"])
    for stage in ("heldout_before", "heldout_after"):
        assert summary[stage]["requests"] == len(summary["workload"]["heldout_requests"])
        assert 0.0 <= summary[stage]["accepted_per_pass"] <= 4.0
    assert summary["cost"]["c"] > 0
    assert summary["data"]["continuation_tokens"] > 0

    tok = AutoTokenizer.from_pretrained(out)
    draft = AutoModelForCausalLM.from_pretrained(out).eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    assert draft.config.vocab_size == target.config.vocab_size
    assert draft.config.hidden_size == 64
    assert draft.config.num_hidden_layers == 1
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "tell me about owls"}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    inputs = torch.tensor([ids])
    mask = torch.ones_like(inputs)
    greedy = target.generate(inputs, attention_mask=mask, max_new_tokens=20, do_sample=False)
    draft.generation_config.num_assistant_tokens = 4
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    assisted = target.generate(inputs, attention_mask=mask, max_new_tokens=20, do_sample=False, assistant_model=draft)
    assert assisted.tolist() == greedy.tolist()


def test_init_from_a_draft_directory_starts_where_that_draft_ended(
    tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    target_dir, _ = tiny_models
    first = distill(_config(target_dir, tiny_workload, tmp_path / "first", max_steps=6)).summary
    second = distill(_config(target_dir, tiny_workload, tmp_path / "second", init=str(tmp_path / "first"))).summary
    # Same held-out split and data: the second run's "before" is the first run's "after".
    assert second["heldout_before"] == first["heldout_after"]
    assert second["draft"]["layers"] == 1
    assert second["draft"]["hidden"] == 64
    assert second["training"]["steps"] == 4
    assert not _same(_weights(tmp_path / "first"), _weights(tmp_path / "second"))


def test_cli_init_from_a_model_that_cannot_be_a_draft_exits_2(
    tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path, runner: CliRunner
) -> None:
    target_dir, _ = tiny_models
    base = ["draft", "distill", "--target", str(target_dir), "--workload", str(tiny_workload)]
    base += ["--out", str(tmp_path / "x"), "--max-steps", "1", "--device", "cpu"]
    missing = runner.invoke(app, [*base, "--init", str(tmp_path / "nothing-here")])
    assert missing.exit_code == 2, missing.output
    assert "expected layers, embedding or a model directory" in missing.output
    other_vocab = tmp_path / "other-vocab"
    other_vocab.mkdir()
    config = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    config["vocab_size"] = int(config["vocab_size"]) + 7
    (other_vocab / "config.json").write_text(json.dumps(config), encoding="utf-8")
    result = runner.invoke(app, [*base, "--init", str(other_vocab)])
    assert result.exit_code == 2, result.output
    assert f"vocabulary of {config['vocab_size']} tokens" in result.output
    assert "Traceback" not in result.output


def test_training_is_deterministic_for_a_seed(
    tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    target_dir, _ = tiny_models
    distill(_config(target_dir, tiny_workload, tmp_path / "a", seed=3))
    distill(_config(target_dir, tiny_workload, tmp_path / "b", seed=3))
    distill(_config(target_dir, tiny_workload, tmp_path / "c", seed=4))
    assert _same(_weights(tmp_path / "a"), _weights(tmp_path / "b"))
    assert not _same(_weights(tmp_path / "a"), _weights(tmp_path / "c"))


class _InterruptAt(SilentProgress):
    def __init__(self, step: int) -> None:
        self.at = step

    def train_step(self, step: int, loss: float, elapsed_s: float, budget_s: float, max_steps: int | None) -> None:
        if step == self.at:
            raise KeyboardInterrupt


def test_interrupted_run_resumes_to_the_same_weights(
    tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    target_dir, _ = tiny_models
    whole = tmp_path / "whole"
    distill(_config(target_dir, tiny_workload, whole, max_steps=6))
    resumed = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        distill(_config(target_dir, tiny_workload, resumed, max_steps=6), _InterruptAt(3))
    assert (resumed / "checkpoint" / "state.pt").is_file()
    assert not (resumed / "distill.json").exists()
    steps: list[int] = []

    class _Record(SilentProgress):
        def train_step(self, step: int, loss: float, elapsed_s: float, budget_s: float, max_steps: int | None) -> None:
            steps.append(step)

    distill(_config(target_dir, tiny_workload, resumed, max_steps=6), _Record())
    assert steps == [4, 5, 6]  # continued from the checkpoint, not from scratch
    assert _same(_weights(whole), _weights(resumed))


def test_finished_draft_is_not_redone(tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path) -> None:
    target_dir, _ = tiny_models
    out = tmp_path / "d"
    first = distill(_config(target_dir, tiny_workload, out, max_steps=2))
    again = distill(_config(target_dir, tiny_workload, out, max_steps=2))
    assert not first.skipped
    assert again.skipped
    assert again.summary == first.summary
    more = distill(_config(target_dir, tiny_workload, out, max_steps=3))
    assert not more.skipped
    assert more.summary["training"]["steps"] == 3


def test_cli_distill_writes_a_draft(
    tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path, runner: CliRunner
) -> None:
    target_dir, _ = tiny_models
    out = tmp_path / "cli-draft"
    args = ["draft", "distill", "--target", str(target_dir), "--workload", str(tiny_workload), "--out", str(out)]
    args += ["--layers", "1", "--hidden", "64", "--max-steps", "2", "--max-tokens", "8", "--device", "cpu"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "acc/pass" in result.output
    assert "saved:" in result.output
    assert "cost ratio c" in result.output
    assert (out / "config.json").is_file()
    assert (out / "distill.json").is_file()
    again = runner.invoke(app, args)
    assert again.exit_code == 0
    assert "up to date" in again.output
    assert "kept:" in again.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target", "no/such-model-here"], "not in the local Hugging Face cache"),
        (["--target", "/nonexistent/dir"], "unknown model"),
        (["--layers", "0"], "--layers 0"),
        (["--hidden", "100"], "--hidden 100"),
        (["--holdout", "1.5"], "--holdout 1.5"),
        (["--minutes", "0"], "--minutes 0"),
        (["--workload", "no-such-workload"], "no-such-workload"),
    ],
)
def test_cli_bad_input_exits_2(
    extra: list[str], message: str, tiny_models: tuple[Path, Path], tmp_path: Path, runner: CliRunner
) -> None:
    target_dir, _ = tiny_models
    args = ["draft", "distill", "--target", str(target_dir), "--workload", "json", "--out", str(tmp_path / "x")]
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_holdout_split_is_stratified_and_deterministic() -> None:
    requests = [Request(id=f"r{i}", line=i + 1, category="a" if i < 8 else "b", prompt="x") for i in range(12)]
    train, held = holdout_split(requests, 0.25)
    assert sorted(train + held) == list(range(12))
    assert sum(1 for i in held if i < 8) == 2
    assert sum(1 for i in held if i >= 8) == 1
    assert holdout_split(list(reversed(requests)), 0.25)[1] == sorted(11 - i for i in held)  # order-independent
    assert holdout_split(requests, 0.0) == (list(range(12)), [])
    single = [Request(id="only", line=1, category="c", prompt="x")]
    assert holdout_split(single, 0.5) == ([0], [])


def test_projected_target_with_the_full_basis_and_every_layer_is_the_target(tiny_models: tuple[Path, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from runinfra_opt.distill.train import init_draft_from_layers, residual_basis, source_layers

    target = AutoModelForCausalLM.from_pretrained(tiny_models[0]).eval()
    ids = torch.arange(4, 44).unsqueeze(0)
    width = target.config.hidden_size
    basis = residual_basis(target, [ids[0].tolist()], width)
    draft = init_draft_from_layers(target, target.config.num_hidden_layers, basis, seed=0)
    with torch.no_grad():
        assert torch.allclose(draft(ids).logits, target(ids).logits, atol=1e-4)
    narrow = init_draft_from_layers(target, 2, basis[:, : width // 2], seed=0)
    assert narrow.config.hidden_size == width // 2
    assert source_layers(30, 2) == [0, 29]
    assert source_layers(30, 4) == [0, 10, 19, 29]


def test_cli_hidden_wider_than_the_target_exits_2(
    tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path, runner: CliRunner
) -> None:
    args = ["draft", "distill", "--target", str(tiny_models[0]), "--workload", str(tiny_workload)]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "x"), "--hidden", "128", "--max-steps", "1"])
    assert result.exit_code == 2, result.output
    assert "wider than the target" in result.output
