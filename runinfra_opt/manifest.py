"""The deployment manifest: what `optimize` chose, the measured evidence, and how to serve it on each engine.

`build_manifest` is a pure function of a run's `RunResults`; `validate_manifest` checks a manifest against the
JSON Schema shipped in the package (`schemas/manifest.schema.json`) and returns one `field.path: problem` line
per problem; `write_manifest` validates, then writes the YAML atomically, with a `vllm serve --config` file beside
it (`<stem>.vllm.yaml`). Each engine's serving settings come from the method's module, through the registry;
their sources are listed in docs/manifest.md."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from runinfra_opt.engine.vllm.args import ServeSettings, config_file_mapping
from runinfra_opt.errors import InputProblems, RuninfraError, UserInputError
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.fsutil import atomic_write_text, safe_name
from runinfra_opt.methods import Variant, draft_short_name, get_method
from runinfra_opt.results import Decision, Interval, ModelInfo, RunResults, Summary

API_VERSION = "runinfra.dev/v1"
KIND = "ServingOptimization"


class ManifestInvalidError(RuninfraError):
    """A manifest built by runinfra-opt failed its own schema (a bug: exit 1)."""

    exit_code = ExitCode.INTERNAL


@cache
def manifest_schema() -> dict[str, Any]:
    """The manifest's JSON Schema, from the package data."""
    text = resources.files("runinfra_opt").joinpath("schemas/manifest.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _field_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _describe(error: Any) -> list[tuple[list[Any], str]]:
    """(field path, problem) pairs for one jsonschema error, pointing at the field itself where it can."""
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        return [([*path, name], "required field missing") for name in missing] or [(path, error.message)]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        return [([*path, name], "unknown field") for name in extra] or [(path, error.message)]
    if error.validator in {"oneOf", "anyOf"} and error.context:
        # A branch whose top-level type does not fit says nothing; errors inside a fitting branch do.
        informative = [
            e for e in error.context if e.validator not in {"type", "const"} or len(e.absolute_path) > len(path)
        ]
        if not informative:
            # Every branch wants another type: say which types would do.
            types: list[str] = []
            for e in error.context:
                wanted = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
                types += [str(t) for t in wanted if str(t) not in types]
            return [(path, f"{error.instance!r} is not of type {' or '.join(repr(t) for t in types)}")]
        # The branch that got furthest into the value.
        deepest = max(len(list(e.absolute_path)) for e in informative)
        return [pair for e in informative if len(list(e.absolute_path)) == deepest for pair in _describe(e)]
    return [(path, error.message)]


def validate_manifest(data: Any) -> list[str]:
    """Problems of `data` against the manifest schema, one `field.path: problem` line each (empty: valid).
    A missing required field is reported at its own path."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(manifest_schema())
    problems = {
        f"{_field_path(path)}: {message}" for error in validator.iter_errors(data) for path, message in _describe(error)
    }
    return sorted(problems)


# --------------------------------------------------------------------------- building


def _model_info(results: RunResults, spec: str | None) -> ModelInfo | None:
    if spec is None:
        return None
    return next((m for m in results.drafts if spec in {m.spec, m.path, m.name}), None)


def _percentiles_ms(values: dict[str, float] | None) -> dict[str, float]:
    return {k: round(v * 1000, 3) for k, v in (values or {}).items() if k in {"p50", "p90", "p95", "p99"}}


def _measured(results: RunResults, decision: Decision) -> dict[str, Any]:
    def summary(name: str) -> Summary | None:
        result = results.variant(name)
        return result.measured if result is not None else None

    winner, base = summary(decision.winner), summary("baseline")
    out: dict[str, Any] = {}
    if winner is not None:
        out["tokensPerS"] = winner.tokens_per_s
        out["ttftMs"] = _percentiles_ms(winner.ttft_s)
        out["acceptanceRate"] = winner.acceptance_rate
    if base is not None:
        out["baselineTokensPerS"] = base.tokens_per_s
        out["baselineTtftMs"] = _percentiles_ms(base.ttft_s)
    return out


def _interval(value: Interval | None) -> dict[str, float] | None:
    return {"value": value.value, "low": value.low, "high": value.high} if value is not None else None


def _under_load(results: RunResults) -> dict[str, Any]:
    """`decision.underLoad` when the run measured load levels (nothing otherwise: batch-1 manifests are unchanged)."""
    load = results.load
    if load is None:
        return {}
    schedule = load.schedule
    return {
        "underLoad": {
            "spec": load.spec,
            "timeScale": load.time_scale,
            "sloTtftMs": load.slo_ttft_ms,
            "sloTpotMs": load.slo_tpot_ms,
            "deployLevel": load.deploy_level,
            "levels": [{"level": d.level, "winner": d.winner, "gain": _interval(d.gain)} for d in load.decisions],
            "crossovers": [
                {
                    "variant": c.variant,
                    "method": c.method,
                    "status": c.status,
                    "concurrency": c.concurrency,
                    "low": c.low,
                    "high": c.high,
                }
                for c in load.crossovers
            ],
            "schedule": None
            if schedule is None
            else {
                "variant": schedule.variant,
                "schedule": schedule.schedule,
                "verified": schedule.verified,
                "written": schedule.written,
                "reason": schedule.reason,
            },
        }
    }


def vllm_serve_settings(results: RunResults) -> ServeSettings:
    """What the run's vLLM servers were (or would be) launched with: the `ServeSettings` an engine recorded in
    the run's environment (under `ServeSettings.ENVIRONMENT_KEY`), else derived from the run: the target's
    directory (the vllm engine records the directory it served; a GGUF target's transformers conversion, which
    the run loaded, under the cache directory; a hub id as it is), the dtype it was measured in, the context
    length the environment records (the vllm engine's) or the default, and the run's seed."""
    recorded = results.environment.get(ServeSettings.ENVIRONMENT_KEY)
    if isinstance(recorded, dict) and recorded.get("model"):
        return ServeSettings.from_dict(recorded)
    from runinfra_opt.engine.vllm.args import DEFAULT_DTYPE, DEFAULT_MAX_MODEL_LEN
    from runinfra_opt.models import converted_dir_for

    target = results.target
    assert target is not None
    model = target.path or target.spec
    if model.endswith(".gguf") and target.file_sha256:
        model = str(converted_dir_for(target.name, target.file_sha256))
    elif target.path and "/snapshots/" in target.path:
        model = target.spec  # a hub id, loaded from the Hugging Face cache
    dtype = target.dtype if target.dtype in {"float32", "bfloat16", "float16"} else DEFAULT_DTYPE
    recorded_len = results.environment.get("max_model_len")  # what the vllm engine served with
    max_model_len = recorded_len if isinstance(recorded_len, int) and recorded_len > 0 else DEFAULT_MAX_MODEL_LEN
    return ServeSettings(model, dtype, max_model_len, seed=int(results.config.get("seed") or 0))


def _serving_vllm(results: RunResults, variant: Variant, draft_path: str | None) -> dict[str, Any]:
    """The manifest's `serving.vllm`: the method's block, with `args` the full `vllm serve` argument list."""
    serving = get_method(variant.method).serving_vllm(variant, draft_path)
    if not serving.get("supported"):
        return serving
    config = vllm_serve_settings(results).server_config(variant, draft_path)
    return {**serving, "speculativeConfig": config.speculative_config, "args": config.serve_args()}


def build_manifest(results: RunResults) -> dict[str, Any]:
    """The manifest of a finished run (pure: a function of `results` only)."""
    decision = results.decision
    if decision is None:
        raise UserInputError(f"run {results.run_id}: no decision yet (the run did not finish); nothing to manifest")
    if results.target is None or results.workload is None:
        raise UserInputError(f"run {results.run_id}: results lack the target model or the workload")
    winner = results.variant(decision.winner)
    if winner is None:
        raise UserInputError(f"run {results.run_id}: the decision's winner {decision.winner!r} is not in the results")
    variant = Variant.from_dict(winner.variant)
    method = get_method(variant.method)
    drafter = method.drafter(variant)
    draft_spec = drafter.model if drafter is not None else None
    draft = _model_info(results, draft_spec)
    draft_path = (draft.path or draft.spec) if draft else draft_spec
    config = results.config
    target, workload = results.target, results.workload

    speculative: dict[str, Any] | None = None
    if variant.is_speculative:
        speculative = {
            "method": variant.method,
            "lookahead": variant.lookahead,
            **method.manifest_fields(variant),
            "confidenceThreshold": variant.confidence_threshold,
        }
        if variant.options:
            speculative["options"] = dict(variant.options)
        if draft_spec is not None:
            speculative["draft"] = {
                "spec": draft_spec,
                "name": draft.name if draft else draft_short_name(draft_spec),
                "path": draft.path if draft else None,
                "fileSha256": draft.file_sha256 if draft else None,
                "numParameters": draft.num_parameters if draft else None,
            }

    gain = decision.gain
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "runId": results.run_id,
            "createdAt": results.created_at,
            "tool": "runinfra-opt",
            "toolVersion": results.tool_version,
            "resultsSchemaVersion": results.schema_version,
        },
        "target": {
            "name": target.name,
            "spec": target.spec,
            "path": target.path,
            "fileSha256": target.file_sha256,
            "dtype": target.dtype,
            "device": target.device,
            "numLayers": target.num_layers,
            "numParameters": target.num_parameters,
        },
        "workload": {
            "name": workload.name,
            "path": workload.path,
            "fingerprint": workload.fingerprint,
            "requests": workload.requests,
            "usedRequests": workload.used_requests,
            "categories": dict(workload.categories),
            "subsampled": workload.subsampled,
        },
        "priority": {"objective": decision.priority, "percentile": str(config.get("percentile", "p95"))},
        "constraints": {
            "maxTtftMs": config.get("max_ttft_ms"),
            "maxTtftRegression": config.get("max_ttft_regression"),
            "minSpeedup": float(config.get("min_speedup", 1.05)),
            "requireSpeedup": bool(config.get("require_speedup", False)),
        },
        "decision": {
            "winner": decision.winner,
            "speculation": decision.speculation,
            "gain": {"value": gain.value, "low": gain.low, "high": gain.high} if gain is not None else None,
            "ttftChange": decision.ttft_change,
            "reason": decision.reason,
            "measured": _measured(results, decision),
            "disqualified": list(decision.disqualified),
            "perCategory": [
                {"category": c.category, "best": c.best, "speedup": c.speedup, "requests": c.requests}
                for c in decision.per_category
            ],
            **_under_load(results),
        },
        "speculative": speculative,
        "serving": {
            "transformers": method.serving_transformers(variant, draft_path),
            "vllm": _serving_vllm(results, variant, draft_path),
            "sglang": method.serving_sglang(variant, draft_path),
        },
        **_capacity(results, decision),
    }


def _capacity(results: RunResults, decision: Decision) -> dict[str, Any]:
    """The manifest's `capacity` section: the SLOs, each variant's capacity per server (measured with its interval,
    or predicted), the servers the target rate needs and their cost, how it was measured. Empty without a
    capacity decision."""
    summary = results.capacity
    if summary is None or summary.winner is None:
        return {}
    rows = {row.variant: row for row in summary.rows}
    winner = rows.get(decision.winner)

    def per_server(row: Any) -> dict[str, Any]:
        return {"variant": row.variant, "requestsPerS": row.capacity, "low": row.low, "high": row.high,
                "source": row.source, "servers": row.servers}  # fmt: skip

    return {
        "capacity": {
            "why": summary.why,
            "slo": {"ttftMs": summary.slo_ttft_ms, "tpotMs": summary.slo_tpot_ms, "attainment": summary.attainment},
            "criterion": summary.criterion,
            "perServer": per_server(winner) if winner is not None else None,
            "targetRate": summary.target_rate,
            "targetSource": summary.target_source,
            "servers": winner.servers if winner is not None else None,
            "costPerHour": winner.cost_per_hour if winner is not None else None,
            "costPerMillionOutputTokens": winner.cost_per_million_tokens if winner is not None else None,
            "measuredBy": (
                f"a rate search per launched server: {summary.requests_per_level} requests per offered rate, "
                f"{summary.arrivals} arrivals, up to {summary.max_levels} rates, stopped when the missed rate is "
                f"within {summary.tolerance:.0%} of the sustained one"
            ),
            "variants": [per_server(row) for row in summary.rows],
        }
    }


# --------------------------------------------------------------------------- reading and writing


def write_manifest(path: Path, manifest: dict[str, Any]) -> Path | None:
    """Validate `manifest` against the schema, then write it as YAML atomically, and next to it its vLLM
    serving arguments as a `vllm serve --config` file (`vllm_config_path`; returned, None when the winner has no
    vLLM equivalent). An invalid manifest is a bug in runinfra-opt (`ManifestInvalidError`, exit 1) and nothing
    is written."""
    import yaml

    problems = validate_manifest(manifest)
    if problems:
        raise ManifestInvalidError("the manifest failed its schema (nothing written): " + "; ".join(problems[:5]))
    header = f"# {KIND} written by runinfra-opt; validate with `runinfra-opt manifest validate {path.name}`\n"
    atomic_write_text(path, header + yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True, width=100))
    return write_vllm_config(path, manifest)


# --------------------------------------------------------------------------- exports

VLLM_CONFIG = "vllm-config"
HELM_VALUES = "helm-values"
EXPORT_FORMATS = (VLLM_CONFIG, HELM_VALUES)
_VLLM_CONFIG_MARK = "# vLLM serving arguments exported by runinfra-opt"


def vllm_config_path(manifest_path: Path) -> Path:
    """Where `optimize` writes a manifest's `vllm serve --config` file: `<manifest stem>.vllm.yaml` beside it."""
    name = manifest_path.name
    stem = manifest_path.stem if manifest_path.suffix.lower() in {".yaml", ".yml", ".json"} else name
    return manifest_path.with_name(f"{stem}.vllm.yaml")


def vllm_config_args(manifest: dict[str, Any], source: str) -> list[str]:
    """The manifest's `serving.vllm.args`, checked to be exportable: the winner runs on vLLM, the arguments
    name the model (manifests written before they carried the full list do not), and carry no API key."""
    serving = manifest.get("serving")
    vllm = serving.get("vllm") if isinstance(serving, dict) else None
    if not isinstance(vllm, dict):
        raise UserInputError(f"{source}: serving.vllm: required field missing")
    winner = (manifest.get("decision") or {}).get("winner", "?")
    if not vllm.get("supported"):
        raise UserInputError(
            f"{source}: serving.vllm.supported: false (the winner {winner} has no vLLM equivalent): nothing to export"
        )
    args = vllm.get("args")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise UserInputError(f"{source}: serving.vllm.args: not a list of strings")
    if "--model" not in args:
        raise UserInputError(
            f"{source}: serving.vllm.args: no --model (written by an older runinfra-opt, which recorded only the "
            "speculative arguments); run `runinfra-opt optimize` again"
        )
    if any(a.split("=")[0] in {"--api-key", "--api_key"} for a in args):
        raise UserInputError(f"{source}: serving.vllm.args: carries --api-key; a secret is never exported")
    return list(args)


def vllm_config_text(manifest: dict[str, Any], source: str) -> str:
    """The manifest's vLLM arguments as a `vllm serve --config FILE` YAML file: vLLM reads it back into exactly
    `serving.vllm.args` (`engine.vllm.args.config_file_mapping`). Raises UserInputError as
    `vllm_config_args` does."""
    import yaml

    args = vllm_config_args(manifest, source)
    try:
        mapping = config_file_mapping(args)
    except ValueError as exc:
        raise UserInputError(f"{source}: serving.vllm.args: {exc}") from None
    run_id = (manifest.get("metadata") or {}).get("runId", "?")
    winner = (manifest.get("decision") or {}).get("winner", "?")
    header = (
        f"{_VLLM_CONFIG_MARK} from {Path(source).name} (run {run_id}, winner {winner}).\n"
        "# Serve with: vllm serve --config FILE  (or: python -m vllm.entrypoints.openai.api_server --config FILE),\n"
        "# adding --host/--port and an API key (VLLM_API_KEY) of your own.\n"
    )
    return header + yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True, width=1000)


def write_vllm_config(manifest_path: Path, manifest: dict[str, Any]) -> Path | None:
    """Write `vllm_config_text` beside the manifest (`vllm_config_path`). When the winner has no vLLM
    equivalent nothing is written, and a file left there by an earlier export is removed (it would describe
    another decision). Returns the path written, or None."""
    out = vllm_config_path(manifest_path)
    vllm = (manifest.get("serving") or {}).get("vllm") or {}
    if not vllm.get("supported"):
        try:
            if out.read_text(encoding="utf-8").startswith(_VLLM_CONFIG_MARK):
                out.unlink()
        except (OSError, UnicodeDecodeError):
            pass
        return None
    atomic_write_text(out, vllm_config_text(manifest, str(manifest_path)))
    return out


def export_manifest(path: Path, fmt: str) -> tuple[str, dict[str, Any]]:
    """(the export's text, what it holds) of the manifest file `path` in format `fmt`. A file that is not a
    valid manifest, or one whose winner has nothing to export, raises UserInputError (exit 2)."""
    if fmt not in EXPORT_FORMATS:
        raise UserInputError(f"--format {fmt}: unknown export format; available: {', '.join(EXPORT_FORMATS)}")
    data = read_manifest(path)
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: (root): not a mapping (a manifest is a YAML/JSON object)")
    problems = validate_manifest(data)
    if problems:
        raise InputProblems([f"{path}: {p}" for p in problems[:20]], total=len(problems))
    if fmt == HELM_VALUES:
        return helm_values(data, str(path))
    text = vllm_config_text(data, str(path))
    args = vllm_config_args(data, str(path))
    return text, {"format": fmt, "manifest": str(path), "args": args, "config": config_file_mapping(args)}


HELM_CHART_FIELDS = {"--max-model-len": "maxModelLen", "--dtype": "dtype"}
"""`vllm serve` arguments the production-stack chart's `vllmConfig` names; the rest go to its `extraArgs`."""


def helm_values(manifest: dict[str, Any], source: str) -> tuple[str, dict[str, Any]]:
    """The vLLM production-stack Helm chart's values for the winner (`servingEngineSpec.modelSpec`): the model,
    the winner's `vllm serve` arguments and `replicaCount` = the servers the capacity decision needs (1 without
    one). Raises UserInputError as `vllm_config_args` does."""
    import yaml

    args = vllm_config_args(manifest, source)
    model = args[args.index("--model") + 1]
    config: dict[str, Any] = {}
    extra: list[str] = []
    rest = [a for i, a in enumerate(args) if a != "--model" and (i == 0 or args[i - 1] != "--model")]
    i = 0
    while i < len(rest):
        flag = rest[i]
        value = rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else None
        if flag in HELM_CHART_FIELDS and value is not None:
            config[HELM_CHART_FIELDS[flag]] = int(value) if value.isdigit() else value
        else:
            extra += [flag] if value is None else [flag, value]
        i += 1 if value is None else 2
    if extra:
        config["extraArgs"] = extra
    capacity = manifest.get("capacity") or {}
    replicas = capacity.get("servers") or 1
    name = safe_name(str((manifest.get("target") or {}).get("name") or "model")).lower().replace("_", "-")
    spec = {"name": name, "repository": "vllm/vllm-openai", "tag": "latest", "modelURL": model,
            "replicaCount": replicas, "vllmConfig": config}  # fmt: skip
    values = {"servingEngineSpec": {"modelSpec": [spec]}}
    run_id = (manifest.get("metadata") or {}).get("runId", "?")
    winner = (manifest.get("decision") or {}).get("winner", "?")
    sized = (
        f"replicaCount {replicas}: {capacity.get('targetRate'):g} requests/s at the SLOs"
        if capacity.get("servers") and capacity.get("targetRate")
        else "replicaCount 1: the run made no capacity decision with a target rate"
    )
    header = (
        f"# vLLM production-stack Helm values exported by runinfra-opt from {Path(source).name} (run {run_id}, "
        f"winner {winner}).\n# {sized}. Add requestCPU / requestMemory / requestGPU for your nodes; the image tag "
        "must be a vLLM that accepts these arguments.\n"
    )
    text = header + yaml.safe_dump(values, sort_keys=False, allow_unicode=True, width=1000)
    return text, {"format": HELM_VALUES, "manifest": source, "args": args, "values": values}


def read_manifest(path: Path) -> Any:
    """Parse a manifest file (YAML, or JSON by its `.json` suffix). Unreadable or unparsable: UserInputError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"{path}: is a directory, not a manifest file") from None
    except UnicodeDecodeError:
        raise UserInputError(f"{path}: not a text file (not UTF-8)") from None
    except OSError as exc:
        raise UserInputError(f"{path}: cannot read: {exc.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserInputError(f"{path}{where}: invalid YAML: {problem}") from None


def check_manifest_file(path: Path) -> list[str]:
    """`FILE: field.path: problem` lines for a manifest file (empty: valid). Raises UserInputError when the file
    cannot be read or parsed."""
    data = read_manifest(path)
    if not isinstance(data, dict):
        return [f"{path}: (root): not a mapping (a manifest is a YAML/JSON object)"]
    return [f"{path}: {problem}" for problem in validate_manifest(data)]
