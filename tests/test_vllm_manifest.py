"""A written manifest's `serving.vllm.args`, and the `vllm serve --config` file written beside it, read by
vLLM's own argument parser in the vLLM environment (real vLLM, no server): both parse to the same model,
dtype, context length, seed and speculative config, and vLLM builds its engine configuration from them (it
reads the models' config.json files and validates the speculative config, without loading weights).

Needs the vLLM environment, handed over by `make test` in RUNINFRA_OPT_VLLM_PYTHON (as tests/test_vllm_e2e.py);
one process imports vLLM once for every check, so the test takes seconds, not a server start."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runinfra_opt.engine.vllm.environment import verify
from runinfra_opt.engine.vllm.server import ServerError, check_serve_args_many
from runinfra_opt.manifest import build_manifest, write_manifest
from runinfra_opt.methods import BASELINE, Variant
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
    """The vLLM environment's python, handed over by `make test` (tests do not look in the user's cache)."""
    python = os.environ.get("RUNINFRA_OPT_VLLM_PYTHON")
    if not python:
        pytest.fail(
            "no vLLM environment given: run `make test` (it installs one), or set RUNINFRA_OPT_VLLM_PYTHON to "
            "the python of `runinfra-opt engine install vllm --json`"
        )
    verify(python)
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
    ]
    arg_lists, expected = [], []
    for winner in winners:
        results = _results(winner)
        results.config["seed"] = 7
        results.target = ModelInfo(spec=str(target_dir), name="tiny-target", path=str(target_dir), file_sha256=SHA,
                                   dtype="float32", device="cpu")  # fmt: skip
        results.drafts = [ModelInfo(spec=str(draft_dir), name="tiny-draft", path=str(draft_dir))]
        manifest = build_manifest(results)
        config_file = write_manifest(tmp_path / f"{winner.method}.yaml", manifest)
        assert config_file is not None
        assert yaml.safe_load(config_file.read_text())["model"] == str(target_dir)
        arg_lists += [manifest["serving"]["vllm"]["args"], ["--config", str(config_file)]]
        parsed = {"model": str(target_dir), "dtype": "float32", "max_model_len": 2048, "seed": 7,
                  "speculative_config": manifest["serving"]["vllm"]["speculativeConfig"]}  # fmt: skip
        expected += [parsed, parsed]
    assert expected[6]["speculative_config"] == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 2}
    assert check_serve_args_many(vllm_python, arg_lists) == expected


def test_vllm_refuses_a_manifest_whose_arguments_it_cannot_run(
    vllm_python: str, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    """The check is not vacuous: a context longer than the tiny target's positions fails vLLM's own check."""
    target_dir, _ = tiny_models
    results = _results(BASELINE)
    results.target = ModelInfo(spec=str(target_dir), name="tiny-target", path=str(target_dir), file_sha256=SHA,
                               dtype="float32", device="cpu")  # fmt: skip
    results.environment["vllm_serve"] = {"model": str(target_dir), "dtype": "float32", "max_model_len": 100_000}
    config_file = write_manifest(tmp_path / "m.yaml", build_manifest(results))
    assert config_file is not None
    with pytest.raises(ServerError, match="vLLM rejects the serving arguments"):
        check_serve_args_many(vllm_python, [["--config", str(config_file)]])
