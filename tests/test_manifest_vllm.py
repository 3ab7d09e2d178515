"""The manifest's vLLM side: `serving.vllm.args` is the full `vllm serve` argument list (the one the vLLM engine
launches, from `ServeSettings.server_config`), `optimize` writes it beside the manifest as a `vllm serve
--config` YAML file, and `manifest export --format vllm-config` exports it from a manifest file.

vLLM's own parser reading these back is tested in tests/test_vllm_manifest.py (it needs the vLLM environment);
here the YAML is read back with vLLM's rule for config files (`load_config_file`: a mapping becomes
`--key json.dumps(value)`, a scalar `--key str(value)`, `true` a bare flag), restated in `_vllm_reads`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.vllm.args import ServerConfig, ServeSettings, config_file_mapping
from runinfra_opt.errors import UserInputError
from runinfra_opt.manifest import (
    build_manifest,
    vllm_config_path,
    vllm_config_text,
    vllm_serve_settings,
    write_manifest,
)
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.results import ModelInfo
from tests.test_manifest import DRAFT, EXIT, NGRAM, SHA, _results


def _vllm_reads(text: str) -> list[str]:
    """What vLLM 0.32's `FlexibleArgumentParser.load_config_file` makes of a config file's text."""
    out: list[str] = []
    for key, value in yaml.safe_load(text).items():
        if isinstance(value, bool):
            out += [f"--{key}"] if value else []
        elif isinstance(value, list):
            out += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out


@pytest.mark.parametrize("winner", [BASELINE, NGRAM, DRAFT], ids=lambda v: v.name)
def test_serving_vllm_args_are_the_launched_arguments(winner: Variant) -> None:
    results = _results(winner)
    results.config["seed"] = 7
    vllm = build_manifest(results)["serving"]["vllm"]
    settings = ServeSettings(model="/cache/smol", dtype="float32", seed=7)
    launched = settings.server_config(winner, "/models/smol-draft").serve_args()
    assert vllm["args"] == launched
    assert vllm["args"][:6] == ["--model", "/cache/smol", "--dtype", "float32", "--max-model-len", "2048"]
    assert vllm["args"][-2:] == ["--seed", "7"]
    if winner == BASELINE:
        assert "--speculative-config" not in vllm["args"]
        assert vllm["speculativeConfig"] is None
    else:
        spec = vllm["args"][vllm["args"].index("--speculative-config") + 1]
        assert json.loads(spec) == vllm["speculativeConfig"]


def test_recorded_serve_settings_win_over_derived_ones() -> None:
    """A run on the vLLM engine records what it launched; the manifest carries exactly that."""
    results = _results(NGRAM)
    recorded = ServeSettings("/srv/smol", dtype="bfloat16", max_model_len=1024, seed=3, extra_args=("--enforce-eager",))
    results.environment[ServeSettings.ENVIRONMENT_KEY] = recorded.to_dict()
    assert vllm_serve_settings(results) == recorded
    args = build_manifest(results)["serving"]["vllm"]["args"]
    assert args == recorded.server_config(NGRAM).serve_args()
    assert args[-1] == "--enforce-eager"


def test_a_gguf_target_is_served_from_its_conversion(isolated_cache: Path) -> None:
    results = _results(NGRAM)
    results.target = ModelInfo(spec="default", name="SmolLM2-135M-Instruct", path="/wheel/smollm2.gguf",
                               file_sha256=SHA, dtype="float32", device="cpu")  # fmt: skip
    model = vllm_serve_settings(results).model
    assert model == str(isolated_cache / "models" / f"SmolLM2-135M-Instruct-{SHA[:16]}")


def test_an_unsupported_winner_has_no_arguments_and_no_config_file(tmp_path: Path) -> None:
    manifest = build_manifest(_results(EXIT))
    assert manifest["serving"]["vllm"]["args"] == []
    out = tmp_path / "m.yaml"
    stale = vllm_config_path(out)
    stale.write_text(vllm_config_text(build_manifest(_results(NGRAM)), "old.yaml"))
    assert write_manifest(out, manifest) is None
    assert not stale.exists(), "a config file of an earlier decision is removed"
    mine = "port: 9000\n"
    stale.write_text(mine)  # not ours: left alone
    write_manifest(out, manifest)
    assert stale.read_text() == mine


@pytest.mark.parametrize("winner", [BASELINE, NGRAM, DRAFT], ids=lambda v: v.name)
def test_config_file_reads_back_into_exactly_the_arguments(tmp_path: Path, winner: Variant) -> None:
    manifest = build_manifest(_results(winner))
    out = tmp_path / "runinfra-manifest.yaml"
    written = write_manifest(out, manifest)
    assert written == tmp_path / "runinfra-manifest.vllm.yaml"
    text = written.read_text()
    assert _vllm_reads(text) == manifest["serving"]["vllm"]["args"]
    config = yaml.safe_load(text)
    assert config["model"] == "/cache/smol"
    assert config["max-model-len"] == 2048
    if winner != BASELINE:
        assert config["speculative-config"] == manifest["serving"]["vllm"]["speculativeConfig"]  # a mapping


def test_config_file_mapping_inverts_flags_and_keeps_odd_values() -> None:
    args = ["--model", "0755", "--seed", "-1", "--enforce-eager", "--speculative-config", '{"b":1,"a":2}', "--x=y"]
    mapping = config_file_mapping(args)
    assert mapping == {"model": "0755", "seed": -1, "enforce-eager": True, "speculative-config": '{"b":1,"a":2}',
                       "x": "y"}  # fmt: skip
    # A JSON object in another spelling than json.dumps' stays a string, so that vLLM passes it on unchanged.
    assert _vllm_reads(yaml.safe_dump(mapping, sort_keys=False)) == [*args[:-1], "--x", "y"]
    for bad in (["model", "x"], ["--seed", "1", "--seed", "2"]):
        with pytest.raises(ValueError):  # noqa: PT011 - the message is checked through the CLI below
            config_file_mapping(bad)


def test_config_file_refuses_secrets_and_old_manifests() -> None:
    manifest = build_manifest(_results(NGRAM))
    manifest["serving"]["vllm"]["args"] += ["--api-key", "s3cret"]
    with pytest.raises(UserInputError, match="--api-key; a secret is never exported") as info:
        vllm_config_text(manifest, "m.yaml")
    assert "s3cret" not in str(info.value)
    manifest["serving"]["vllm"]["args"] = ["--speculative-config", "{}"]
    with pytest.raises(UserInputError, match="no --model"):
        vllm_config_text(manifest, "m.yaml")


def test_server_config_refuses_a_method_vllm_cannot_run() -> None:
    with pytest.raises(UserInputError, match="early_exit-l8-k4 cannot be served by vLLM"):
        ServeSettings("/m").server_config(EXIT)
    assert ServeSettings("/m").server_config(BASELINE) == ServerConfig("/m")


# --------------------------------------------------------------------------- CLI


def _manifest_file(tmp_path: Path, winner: Variant) -> tuple[Path, dict[str, Any]]:
    manifest = build_manifest(_results(winner))
    path = tmp_path / "m.yaml"
    write_manifest(path, manifest)
    return path, manifest


def test_cli_export_prints_or_writes_the_config(tmp_path: Path, runner: CliRunner) -> None:
    path, manifest = _manifest_file(tmp_path, NGRAM)
    result = runner.invoke(app, ["manifest", "export", "--format", "vllm-config", str(path)])
    assert result.exit_code == 0, result.output
    assert _vllm_reads(result.stdout) == manifest["serving"]["vllm"]["args"]
    assert result.stdout == vllm_config_path(path).read_text(), "the same file optimize writes"
    out = tmp_path / "serve" / "smol.yaml"
    result = runner.invoke(app, ["manifest", "export", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stderr
    assert result.stdout == ""
    assert _vllm_reads(out.read_text()) == manifest["serving"]["vllm"]["args"]


def test_cli_export_json(tmp_path: Path, runner: CliRunner) -> None:
    path, manifest = _manifest_file(tmp_path, DRAFT)
    result = runner.invoke(app, ["manifest", "export", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["args"] == manifest["serving"]["vllm"]["args"]
    assert data["config"]["speculative-config"]["method"] == "draft_model"
    assert data["format"] == "vllm-config"
    assert data["output"] is None
    assert data["manifest"] == str(path)


def test_cli_export_bad_input_is_one_line_and_exit_2(tmp_path: Path, runner: CliRunner) -> None:
    path, _ = _manifest_file(tmp_path, EXIT)
    result = runner.invoke(app, ["manifest", "export", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {path}: serving.vllm.supported: false (the winner early_exit-l8-k4 has no vLLM equivalent): "
        "nothing to export"
    ]
    result = runner.invoke(app, ["manifest", "export", "--format", "sglang", str(path)])
    assert result.exit_code == 2
    assert "--format sglang: unknown export format; available: vllm-config, helm-values" in result.stderr
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump({"kind": "ServingOptimization"}))
    result = runner.invoke(app, ["manifest", "export", str(invalid)])
    assert result.exit_code == 2
    assert f"error: {invalid}: apiVersion: required field missing" in result.stderr
    result = runner.invoke(app, ["manifest", "export", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such file" in result.stderr
    good, _ = _manifest_file(tmp_path, NGRAM)
    result = runner.invoke(app, ["manifest", "export", str(good), "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert f"--output {tmp_path}: cannot write" in result.stderr
    assert "Traceback" not in result.output
