"""The deployment manifest: what `optimize` chose, the measured evidence, and how to serve it.

`build_manifest` is a pure function of a run's `RunResults`; `validate_manifest` checks a manifest against the
JSON Schema shipped in the package (`schemas/manifest.schema.json`, draft 2020-12) and returns one
`field.path: problem` line per problem; `write_manifest` validates, then writes YAML atomically.

Serving settings come from each method's module (`runinfra_opt/methods/<method>.py`, asked through the registry):
- transformers: `generate()` kwargs, plus the settings that must be put on the assistant's `generation_config`
  (the target's for early exit), because `generate()` ignores them as kwargs.
- vLLM: the `--speculative-config` JSON (`method` `ngram` with `prompt_lookup_min`/`prompt_lookup_max`, or
  `draft_model` with `model`; `num_speculative_tokens`). Early exit (LayerSkip-style self-drafting) has no
  vLLM method: null with a note.
- SGLang: `--speculative-algorithm STANDALONE` with `--speculative-draft-model-path`, `--speculative-num-steps`,
  `--speculative-eagle-topk 1`, `--speculative-num-draft-tokens`; n-gram: `--speculative-algorithm NGRAM`
  (CUDA only) with its match-window flags. Early exit: not supported, null with a note.
Sources are listed in docs/manifest.md.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from runinfra_opt.errors import RuninfraError, UserInputError
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.methods import Variant, draft_short_name, get_method
from runinfra_opt.results import Decision, ModelInfo, RunResults, Summary

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
        },
        "speculative": speculative,
        "serving": {
            "transformers": method.serving_transformers(variant, draft_path),
            "vllm": method.serving_vllm(variant, draft_path),
            "sglang": method.serving_sglang(variant, draft_path),
        },
    }


# --------------------------------------------------------------------------- reading and writing


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Validate `manifest` against the schema, then write it as YAML atomically. An invalid manifest is a bug
    in runinfra-opt (`ManifestInvalidError`, exit 1) and nothing is written."""
    import yaml

    problems = validate_manifest(manifest)
    if problems:
        raise ManifestInvalidError("the manifest failed its schema (nothing written): " + "; ".join(problems[:5]))
    header = f"# {KIND} written by runinfra-opt; validate with `runinfra-opt manifest validate {path.name}`\n"
    atomic_write_text(path, header + yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True, width=100))


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
