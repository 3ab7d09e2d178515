"""EAGLE / EAGLE-3 heads given by path (`--draft eagle3:PATH`): validated on the way in (one line, exit 2),
kept apart from draft models, refused by the transformers engine in one line, and passed through into the
manifest's vLLM speculative config and SGLang arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.errors import UserInputError
from runinfra_opt.manifest import build_manifest, validate_manifest
from runinfra_opt.methods import Variant, parse_variant_name
from runinfra_opt.methods.registry import check_drafts, draft_owner
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.space import SpaceSettings, build_space
from runinfra_opt.results import ModelInfo
from tests.test_manifest import _results


@pytest.fixture
def head(tmp_path: Path) -> Path:
    """A directory that looks like an EAGLE-3 head (what is validated: a directory with a config.json)."""
    path = tmp_path / "smol-eagle3"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return path


def test_head_specs_belong_to_their_method_and_draft_models_to_none(head: Path) -> None:
    assert draft_owner(f"eagle3:{head}").name == "eagle3"  # type: ignore[union-attr]
    assert draft_owner(f"eagle:{head}").name == "eagle"  # type: ignore[union-attr]
    for model in (str(head), "HuggingFaceTB/SmolLM2-135M", "default", "/models/a:b"):
        assert draft_owner(model) is None


def test_variant_names_round_trip(head: Path) -> None:
    spec = f"eagle3:{head}"
    variant = Variant("eagle3", lookahead=4, draft=spec)
    assert variant.name == "eagle3:smol-eagle3-k4"
    assert parse_variant_name(variant.name, {"smol-eagle3": spec}) == variant
    assert Variant("eagle", lookahead=2, draft=f"eagle:{head}").name == "eagle:smol-eagle3-k2"
    with pytest.raises(UserInputError, match="method eagle3 needs a head"):
        Variant("eagle3", lookahead=4)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("eagle3:{missing}", "{missing} does not exist (an EAGLE-3 head directory)"),
        ("eagle3:{file}", "{file} is not a directory (an EAGLE-3 head directory)"),
        ("eagle:{empty}", "{empty} has no config.json, so it is not an EAGLE head"),
        ("eagle3:", "no path after eagle3: (expected --draft eagle3:PATH)"),
    ],
)
def test_bad_heads_are_one_clear_line(tmp_path: Path, spec: str, problem: str) -> None:
    paths = {"missing": tmp_path / "nope", "file": tmp_path / "f.json", "empty": tmp_path / "empty"}
    paths["file"].write_text("{}")
    paths["empty"].mkdir()
    spec, problem = spec.format(**paths), problem.format(**paths)
    with pytest.raises(UserInputError) as info:
        check_drafts([spec])
    assert str(info.value) == f"--draft {spec}: {problem}"


def test_space_keeps_heads_apart_from_draft_models(head: Path, tiny_models: tuple[Path, Path]) -> None:
    _, draft_dir = tiny_models
    space = build_space(SpaceSettings(drafts=[str(draft_dir), f"eagle3:{head}"], lookaheads=[3]), num_layers=4)
    names = [v.name for v in space]
    assert "draft:tiny-draft-k3" in names
    assert "eagle3:smol-eagle3-k3" in names
    assert not any(n.startswith("draft:smol-eagle3") for n in names)
    only = build_space(SpaceSettings(drafts=[f"eagle:{head}"], methods=["eagle"]), num_layers=4)
    assert [v.name for v in only] == ["baseline", *(f"eagle:smol-eagle3-k{k}" for k in (2, 3, 4, 5))]


def test_optimize_config_validates_heads(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"--draft eagle3:\S+: \S+ does not exist"):
        OptimizeConfig(drafts=(f"eagle3:{tmp_path / 'nope'}",))


def test_optimize_and_bench_reject_a_bad_head_before_loading_anything(tmp_path: Path, runner: CliRunner) -> None:
    missing = tmp_path / "nope"
    result = runner.invoke(app, ["optimize", "--draft", f"eagle3:{missing}"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --draft eagle3:{missing}: {missing} does not exist (an EAGLE-3 head directory)"
    ]
    result = runner.invoke(app, ["bench", "--method", "draft", "--draft", f"eagle:{tmp_path}", "--lookahead", "3"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --draft eagle:{tmp_path}: {tmp_path} has no config.json, so it is not an EAGLE head"
    ]
    result = runner.invoke(app, ["bench", "--method", "eagle3", "--lookahead", "3"])
    assert result.exit_code == 2
    assert "--method eagle3 needs --draft eagle3:PATH, the head's directory" in result.stderr
    result = runner.invoke(app, ["bench", "--method", "eagle3", "--draft", f"eagle:{tmp_path}", "--lookahead", "3"])
    assert result.exit_code == 2
    assert f"--method eagle3 needs --draft eagle3:PATH, the head's directory (got --draft eagle:{tmp_path})" in (
        result.stderr
    )


def test_transformers_engine_loads_no_head_and_says_why_it_cannot_run_one(
    head: Path, tiny_models: tuple[Path, Path]
) -> None:
    from runinfra_opt.engine.hf.engine import open_engine

    target_dir, draft_dir = tiny_models
    spec = f"eagle3:{head}"
    loaded: list[str] = []
    engine = open_engine(str(target_dir), [str(draft_dir), spec], dtype="float32", on_load=loaded.append)
    try:
        assert list(engine.drafts) == [str(draft_dir)]
        assert loaded[-1] == f"draft {spec} (not loaded: serving engines only)"
        reason = engine.supports(Variant("eagle3", lookahead=3, draft=spec))
        assert reason is not None
        assert reason.splitlines() == [reason]
        assert "transformers' generate() cannot run" in reason
        assert "--engine vllm" in reason
        assert engine.supports(Variant("draft", lookahead=3, draft=str(draft_dir))) is None
    finally:
        engine.close()


def test_bench_on_transformers_refuses_a_head_in_one_line(
    head: Path, tiny_models: tuple[Path, Path], runner: CliRunner, tmp_path: Path
) -> None:
    target_dir, _ = tiny_models
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "r1", "prompt": "Repeat: a b c a b c", "max_tokens": 4}) + "\n")
    args = ["bench", "--target", str(target_dir), "--workload", str(workload), "--dtype", "float32"]
    result = runner.invoke(app, [*args, "--method", "draft", "--draft", f"eagle3:{head}", "--lookahead", "3"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: the transformers engine cannot run eagle3:smol-eagle3-k3: an EAGLE-3 head")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_manifest_passes_a_head_through_to_vllm_and_sglang(head: Path, method: str) -> None:
    spec = f"{method}:{head}"
    winner = Variant(method, lookahead=3, draft=spec)
    results = _results(winner)
    results.drafts = [ModelInfo(spec=spec, name="smol-eagle3", path=str(head))]
    manifest = build_manifest(results)
    assert validate_manifest(manifest) == []
    assert manifest["speculative"]["method"] == method
    assert manifest["speculative"]["draft"]["path"] == str(head)
    vllm = manifest["serving"]["vllm"]
    expected = {"method": method, "model": str(head), "num_speculative_tokens": 3}
    assert vllm["speculativeConfig"] == expected
    assert json.loads(vllm["args"][vllm["args"].index("--speculative-config") + 1]) == expected
    sglang = manifest["serving"]["sglang"]["args"]
    assert sglang[sglang.index("--speculative-algorithm") + 1] == {"eagle": "EAGLE", "eagle3": "EAGLE3"}[method]
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == str(head)
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == "4"
    assert manifest["serving"]["transformers"]["generateKwargs"] == {"do_sample": False}


def test_manifest_of_a_head_without_model_info_uses_its_path(head: Path) -> None:
    spec = f"eagle3:{head}"
    manifest = build_manifest(_results(Variant("eagle3", lookahead=2, draft=spec)))
    assert validate_manifest(manifest) == []
    assert manifest["serving"]["vllm"]["speculativeConfig"]["model"] == str(head)
    assert manifest["speculative"]["draft"]["spec"] == spec
    assert manifest["speculative"]["draft"]["name"] == "smol-eagle3"
