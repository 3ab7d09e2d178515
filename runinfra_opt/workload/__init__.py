"""Workloads: recorded traffic samples, read from JSONL/CSV/Parquet/OpenAI logs/ShareGPT and validated.

Public API: `load_workload(spec)` (a bundled name like `mixed` or a path) -> `Workload`; `validate_workload`
(streaming); `stream_workload` (validated, then re-read on every iteration: large recordings);
`convert_workload`; `list_bundled()`; `short_fingerprint`. Statistics: `runinfra_opt.workload.inspect`.
"""

from runinfra_opt.workload.fingerprint import canonical_record, fingerprint, short_fingerprint
from runinfra_opt.workload.loader import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_WORKLOAD,
    BundledInfo,
    ValidationSummary,
    WorkloadSource,
    WorkloadStream,
    bundled_dir,
    convert_workload,
    list_bundled,
    load_workload,
    resolve_workload,
    stream_workload,
    validate_workload,
)
from runinfra_opt.workload.model import Message, Request, Workload
from runinfra_opt.workload.readers import FORMATS

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_WORKLOAD",
    "FORMATS",
    "BundledInfo",
    "Message",
    "Request",
    "ValidationSummary",
    "Workload",
    "WorkloadSource",
    "WorkloadStream",
    "bundled_dir",
    "canonical_record",
    "convert_workload",
    "fingerprint",
    "list_bundled",
    "load_workload",
    "resolve_workload",
    "short_fingerprint",
    "stream_workload",
    "validate_workload",
]
