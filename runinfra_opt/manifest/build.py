"""Building the manifest: `build_manifest` is a pure function of a run's `RunResults` (the decision, the measured
evidence, how to serve the winner on each engine); `write_manifest` validates it, then writes the YAML atomically,
with a `vllm serve --config` file beside it (`manifest.export`). Each engine's serving settings come from the
method's module, through the registry; their sources are listed in docs/manifest.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runinfra_opt.engine.vllm.args import ServeSettings
from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.manifest.export import write_vllm_config
from runinfra_opt.manifest.schema import API_VERSION, KIND, ManifestInvalidError, validate_manifest
from runinfra_opt.methods import Variant, draft_short_name, get_method
from runinfra_opt.results import Decision, Interval, ModelInfo, RunResults, Summary


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
    if summary is None or not summary.answered:
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
