"""The deployment manifest: what `optimize` chose, the measured evidence, and how to serve it on each engine.

- `manifest.schema`: the file's kind and JSON Schema; reading a file and checking it (`validate_manifest`,
  `check_manifest_file`).
- `manifest.build`: `build_manifest`, a pure function of a run's `RunResults`, and `write_manifest`.
- `manifest.export`: the winner as a `vllm serve --config` file or the production-stack chart's Helm values.

The names below are the package's interface; its users import them from here."""

from runinfra_opt.manifest.build import build_manifest, vllm_serve_settings, write_manifest
from runinfra_opt.manifest.export import (
    EXPORT_FORMATS,
    export_manifest,
    helm_values,
    vllm_config_path,
    vllm_config_text,
)
from runinfra_opt.manifest.schema import (
    API_VERSION,
    KIND,
    ManifestInvalidError,
    check_manifest_file,
    manifest_schema,
    read_manifest,
    validate_manifest,
)

__all__ = [
    "API_VERSION",
    "EXPORT_FORMATS",
    "KIND",
    "ManifestInvalidError",
    "build_manifest",
    "check_manifest_file",
    "export_manifest",
    "helm_values",
    "manifest_schema",
    "read_manifest",
    "validate_manifest",
    "vllm_config_path",
    "vllm_config_text",
    "vllm_serve_settings",
    "write_manifest",
]
