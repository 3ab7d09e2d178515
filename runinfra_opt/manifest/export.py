"""A manifest's winner in another tool's terms: `vllm-config` (a file `vllm serve --config` reads back into
exactly the manifest's `serving.vllm.args`) and `helm-values` (the vLLM production-stack chart's values, with
`replicaCount` from the capacity decision). `manifest export` prints or writes them; `optimize` writes the
`vllm-config` file beside each manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runinfra_opt.engine.vllm.args import config_file_mapping
from runinfra_opt.errors import InputProblems, UserInputError
from runinfra_opt.fsutil import atomic_write_text, safe_name
from runinfra_opt.load.capacity import rate_text
from runinfra_opt.manifest.schema import read_manifest, validate_manifest

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
        f"replicaCount {replicas}: {rate_text(float(capacity['targetRate']))} requests/s at the SLOs"
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
