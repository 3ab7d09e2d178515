"""Manifest: built from results, valid against the shipped schema, written atomically, validated by the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.errors import UserInputError
from runinfra_opt.manifest import (
    ManifestInvalidError,
    build_manifest,
    manifest_schema,
    validate_manifest,
    write_manifest,
)
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.results import (
    CategoryDecision,
    Decision,
    Interval,
    ModelInfo,
    RunResults,
    Summary,
    VariantResult,
    WorkloadInfo,
)

SHA = "a" * 64
NGRAM = Variant("ngram", lookahead=4, ngram_max=2)
DRAFT = Variant("draft", lookahead=6, draft="/models/smol-draft")
EXIT = Variant("early_exit", lookahead=4, exit_layer=8)


def _results(winner: Variant) -> RunResults:
    variants = [BASELINE] if winner == BASELINE else [BASELINE, winner]
    speculation = winner != BASELINE
    return RunResults(
        run_id="20260101T000000Z-abcd",
        created_at="2026-01-01T00:00:00Z",
        tool_version="0.1.0",
        config={"percentile": "p95", "max_ttft_ms": None, "max_ttft_regression": 0.1, "min_speedup": 1.05},
        workload=WorkloadInfo(
            name="summarize", path="workloads/summarize.jsonl", fingerprint="f" * 16, requests=24, used_requests=12,
            categories={"summarize": 6, "chat": 6}, subsampled="12 of 24 requests, stratified by category",
        ),
        target=ModelInfo(spec="default", name="SmolLM2-135M-Instruct", path="/cache/smol", file_sha256=SHA,
                         num_layers=30, num_parameters=134_515_008, dtype="float32", device="cpu"),
        drafts=[ModelInfo(spec="/models/smol-draft", name="smol-draft", path="/models/smol-draft", file_sha256=SHA,
                          num_parameters=9_000_000)],
        variants=[
            VariantResult(
                name=v.name,
                variant=v.to_dict(),
                measured=Summary(tokens_per_s=30.0 if v != BASELINE else 15.0, ttft_s={"p50": 0.1, "p95": 0.12},
                                 acceptance_rate=0.6 if v != BASELINE else None),
                confirmed=True,
            )
            for v in variants
        ],
        decision=Decision(
            winner=winner.name,
            speculation=speculation,
            priority="throughput",
            reason="ngram-n2-k4 is 2.00x (95% CI 1.90-2.10) the baseline's throughput." if speculation
            else "speculation does not pay on this traffic: within noise.",
            gain=Interval(value=2.0, low=1.9, high=2.1) if speculation else Interval(value=1.0, low=1.0, high=1.0),
            ttft_change=0.05,
            per_category=[CategoryDecision(category="summarize", best=winner.name, speedup=2.4, requests=6)],
        ),
    )  # fmt: skip


@pytest.mark.parametrize("winner", [BASELINE, NGRAM, DRAFT, EXIT], ids=lambda v: v.name)
def test_built_manifest_is_valid(winner: Variant) -> None:
    manifest = build_manifest(_results(winner))
    assert validate_manifest(manifest) == []
    assert manifest["apiVersion"] == "runinfra.dev/v1"
    assert manifest["kind"] == "ServingOptimization"
    assert manifest["decision"]["winner"] == winner.name
    assert manifest["target"]["fileSha256"] == SHA
    assert manifest["workload"]["categories"] == {"summarize": 6, "chat": 6}
    assert manifest["constraints"]["maxTtftRegression"] == 0.1
    assert (manifest["speculative"] is None) == (winner == BASELINE)
    json.dumps(manifest)  # plain data only


def test_ngram_serving_settings() -> None:
    serving = build_manifest(_results(NGRAM))["serving"]
    assert serving["transformers"]["generateKwargs"] == {
        "do_sample": False, "prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 2,
    }  # fmt: skip
    config = serving["vllm"]["speculativeConfig"]
    assert config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    args = serving["vllm"]["args"]
    assert json.loads(args[args.index("--speculative-config") + 1]) == config
    args = serving["sglang"]["args"]
    assert args[args.index("--speculative-algorithm") + 1] == "NGRAM"
    assert args[args.index("--speculative-ngram-max-match-window-size") + 1] == "2"


def test_draft_serving_settings() -> None:
    manifest = build_manifest(_results(DRAFT))
    serving = manifest["serving"]
    assert serving["transformers"]["generateKwargs"]["assistant_model"] == "/models/smol-draft"
    assert serving["transformers"]["assistantGenerationConfig"] == {
        "num_assistant_tokens": 6, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0,
    }  # fmt: skip
    assert serving["transformers"]["appliesTo"] == "assistant_model"
    assert serving["vllm"]["speculativeConfig"] == {
        "method": "draft_model", "model": "/models/smol-draft", "num_speculative_tokens": 6,
    }  # fmt: skip
    args = serving["sglang"]["args"]
    assert args[args.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert args[args.index("--speculative-draft-model-path") + 1] == "/models/smol-draft"
    assert args[args.index("--speculative-num-steps") + 1] == "6"
    assert args[args.index("--speculative-eagle-topk") + 1] == "1"
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "7"
    assert manifest["speculative"]["draft"]["numParameters"] == 9_000_000


def test_early_exit_is_transformers_only() -> None:
    serving = build_manifest(_results(EXIT))["serving"]
    assert serving["transformers"]["generateKwargs"]["assistant_early_exit"] == 8
    assert serving["transformers"]["appliesTo"] == "target_model"
    assert serving["vllm"]["supported"] is False
    assert serving["vllm"]["speculativeConfig"] is None
    assert "no early-exit" in serving["vllm"]["note"]
    assert serving["sglang"] == {"supported": False, "args": [], "note": serving["sglang"]["note"]}


def test_unfinished_run_has_no_manifest() -> None:
    results = _results(NGRAM)
    results.decision = None
    with pytest.raises(UserInputError, match="no decision"):
        build_manifest(results)


def test_validation_names_field_paths() -> None:
    manifest: dict[str, Any] = build_manifest(_results(NGRAM))
    del manifest["kind"]
    manifest["decision"]["gain"] = {"value": 2.0, "low": 1.9}
    manifest["workload"]["requests"] = "many"
    manifest["serving"]["sglang"]["args"][1] = 5
    manifest["target"]["surprise"] = 1
    problems = validate_manifest(manifest)
    assert "kind: required field missing" in problems
    assert "decision.gain.high: required field missing" in problems
    assert any(p.startswith("workload.requests: 'many' is not of type 'integer'") for p in problems)
    assert any(p.startswith("serving.sglang.args[1]: 5 is not of type 'string'") for p in problems)
    assert "target.surprise: unknown field" in problems


def test_validation_explains_one_of_fields() -> None:
    manifest: dict[str, Any] = build_manifest(_results(NGRAM))
    manifest["decision"]["gain"] = 5
    manifest["speculative"]["ngramMax"] = None
    assert validate_manifest(manifest) == [
        "decision.gain: 5 is not of type 'null' or 'object'",
        "speculative.ngramMax: None is not of type 'integer'",
    ]


def test_schema_ships_as_package_data_and_is_draft_2020_12() -> None:
    from jsonschema import Draft202012Validator

    schema = manifest_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_write_manifest_validates_then_writes_yaml(tmp_path: Path) -> None:
    manifest = build_manifest(_results(DRAFT))
    out = tmp_path / "sub" / "runinfra-manifest.yaml"
    assert write_manifest(out, manifest) == out.with_name("runinfra-manifest.vllm.yaml")
    assert yaml.safe_load(out.read_text()) == manifest
    assert set(out.parent.iterdir()) == {out, out.with_name("runinfra-manifest.vllm.yaml")}, "no temp files left"
    broken = dict(manifest, apiVersion="v0")
    other = tmp_path / "broken.yaml"
    with pytest.raises(ManifestInvalidError, match="apiVersion"):
        write_manifest(other, broken)
    assert not other.exists()


# --------------------------------------------------------------------------- CLI


def test_cli_validate_ok_yaml_and_json(tmp_path: Path, runner: CliRunner) -> None:
    manifest = build_manifest(_results(NGRAM))
    good = tmp_path / "m.yaml"
    write_manifest(good, manifest)
    result = runner.invoke(app, ["manifest", "validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "valid runinfra.dev/v1 ServingOptimization manifest" in result.output
    as_json = tmp_path / "m.json"
    as_json.write_text(json.dumps(manifest))
    assert runner.invoke(app, ["manifest", "validate", str(as_json)]).exit_code == 0


def test_cli_validate_reports_each_problem_with_file_and_field(tmp_path: Path, runner: CliRunner) -> None:
    manifest = build_manifest(_results(NGRAM))
    del manifest["kind"]
    manifest["priority"]["objective"] = "speed"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(manifest))
    result = runner.invoke(app, ["manifest", "validate", str(bad)])
    assert result.exit_code == 2
    assert f"error: {bad}: kind: required field missing" in result.output
    enum = "['throughput', 'ttft', 'capacity']"
    assert f"error: {bad}: priority.objective: 'speed' is not one of {enum}" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("- just\n- a list\n", "(root): not a mapping"),
        ("kind: [unclosed\n", "invalid YAML"),
    ],
)
def test_cli_validate_rejects_non_manifests(tmp_path: Path, runner: CliRunner, content: str, expected: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(content)
    result = runner.invoke(app, ["manifest", "validate", str(path)])
    assert result.exit_code == 2
    assert expected in result.output
    assert str(path) in result.output


def test_cli_validate_missing_and_bad_json(tmp_path: Path, runner: CliRunner) -> None:
    result = runner.invoke(app, ["manifest", "validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such file" in result.output
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    result = runner.invoke(app, ["manifest", "validate", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:1: invalid JSON" in result.output
