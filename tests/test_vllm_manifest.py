"""A written manifest's `serving.vllm.args`, and the `vllm serve --config` file written beside it, read by
vLLM's own argument parser in the vLLM environment (real vLLM, no server): for a baseline, an n-gram, a
draft-model, an EAGLE-3 and a k-schedule (vLLM n-gram) winner over a tiny target, both parse to the same model,
dtype, context length, seed and speculative config, and vLLM builds its engine configuration from them (it reads
the models' config.json files and validates the speculative config, without loading weights); a context longer
than the target's positions is refused, from the arguments and from the file.

Needs the vLLM environment, handed over by `make test` in RUNINFRA_OPT_VLLM_PYTHON (as tests/test_vllm_e2e.py).
One process imports vLLM once for every check: about a minute on a busy 2-core machine, no server start."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runinfra_opt.engine.vllm.validate import check_serve_args_many
from runinfra_opt.manifest import build_manifest, vllm_config_text, write_manifest
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.methods.k_schedule import parse_schedule, with_schedule
from runinfra_opt.methods.vllm_ngram import make
from runinfra_opt.results import ModelInfo
from tests.test_manifest import SHA, _results

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def _no_bytecode() -> Iterator[None]:
    """The vLLM environment lives in the user's cache, which the suite must leave untouched."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONDONTWRITEBYTECODE", "1")
        yield


@pytest.fixture(scope="module")
def vllm_python() -> str:
    """The vLLM environment's python, handed over by `make test` (tests do not look in the user's cache).
    Not probed first (`environment.verify` imports vLLM, which takes half a minute here): a broken
    environment fails the check itself, with its message."""
    python = os.environ.get("RUNINFRA_OPT_VLLM_PYTHON")
    if not python:
        pytest.fail(
            "no vLLM environment given: run `make test` (it installs one), or set RUNINFRA_OPT_VLLM_PYTHON to "
            "the python of `runinfra-opt engine install vllm --json`"
        )
    return python


def _eagle3_head(root: Path, target_dir: Path) -> Path:
    """A directory shaped like an EAGLE-3 head for the tiny target: its config (a one-layer Llama of the
    target's width and vocabulary, as EAGLE-3 heads for Llama targets are). No weights: nothing is loaded."""
    target = json.loads((target_dir / "config.json").read_text())
    head = root / "tiny-eagle3"
    head.mkdir()
    config = {**target, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1}
    (head / "config.json").write_text(json.dumps(config))
    return head


def _manifest(winner: Variant, target_dir: Path, draft_dir: Path) -> dict[str, Any]:
    results = _results(winner)
    results.config["seed"] = 7
    results.target = ModelInfo(spec=str(target_dir), name="tiny-target", path=str(target_dir), file_sha256=SHA,
                               dtype="float32", device="cpu")  # fmt: skip
    results.drafts = [ModelInfo(spec=str(draft_dir), name="tiny-draft", path=str(draft_dir))]
    return build_manifest(results)


def test_manifest_args_and_config_file_parse_with_vllms_own_parser(
    vllm_python: str, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    target_dir, draft_dir = tiny_models
    head = _eagle3_head(tmp_path, target_dir)
    winners = [
        BASELINE,
        Variant("ngram", lookahead=4, ngram_max=3),
        Variant("draft", lookahead=3, draft=str(draft_dir)),
        Variant("eagle3", lookahead=2, draft=f"eagle3:{head}"),
        with_schedule(make(2, 1, 3), parse_schedule("1-2:8,3-8:4,9-1024:2")),
    ]
    arg_lists: list[list[str]] = []
    expected: list[dict[str, Any]] = []
    for winner in winners:
        manifest = _manifest(winner, target_dir, draft_dir)
        config_file = write_manifest(tmp_path / f"{winner.method}.yaml", manifest)
        assert config_file is not None
        arg_lists += [manifest["serving"]["vllm"]["args"], ["--config", str(config_file)]]
        parsed = {"model": str(target_dir), "dtype": "float32", "max_model_len": 2048, "seed": 7,
                  "speculative_config": manifest["serving"]["vllm"]["speculativeConfig"]}  # fmt: skip
        expected += [parsed, parsed]
    assert expected[6]["speculative_config"] == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2}
    schedule = expected[8]["speculative_config"]["num_speculative_tokens_per_batch_size"]
    assert schedule == [[1, 2, 8], [3, 8, 4], [9, 1024, 2]]
    # Not vacuous: vLLM refuses a context longer than the tiny target's positions, from a manifest too.
    long = _manifest(BASELINE, target_dir, draft_dir)
    long_args = long["serving"]["vllm"]["args"]
    long_args[long_args.index("--max-model-len") + 1] = "100000"
    long_file = tmp_path / "long.vllm.yaml"
    long_file.write_text(vllm_config_text(long, "long.yaml"))
    checked = check_serve_args_many(vllm_python, [*arg_lists, long_args, ["--config", str(long_file)]])
    assert checked[:-2] == expected
    for refused in checked[-2:]:
        assert "max_model_len" in refused["error"], refused
