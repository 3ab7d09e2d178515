"""A workload's fingerprint: sha256 of its canonical content, independent of file format and whitespace.

Canonical content: each request, in file order, as compact sorted-key JSON (UTF-8, no ASCII escaping) of its
normalised fields (id, category, arrival_s, messages or prompt, max_tokens, temperature, top_p, seed, response,
session_id, turn, think_s;
absent optional fields left out, unknown fields not included), one per line with a trailing newline.
`max_tokens` is the effective value (a default filled from the command line counts: it changes what is run).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from runinfra_opt.workload.model import Request


def canonical_record(request: Request) -> dict[str, Any]:
    """The normalised fields of a request, as written by `workload convert` (plus unknown fields there)."""
    record: dict[str, Any] = {"id": request.id, "category": request.category, "max_tokens": request.max_tokens}
    if request.arrival_s is not None:
        record["arrival_s"] = float(request.arrival_s)
    if request.messages is not None:
        record["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
    else:
        record["prompt"] = request.prompt
    for name in ("temperature", "top_p", "seed", "response", "session_id", "turn", "think_s"):
        value = getattr(request, name)
        if value is not None:
            record[name] = value
    return record


def canonical_line(request: Request) -> str:
    return json.dumps(canonical_record(request), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class Fingerprinter:
    """Incremental fingerprint over requests in file order."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, request: Request) -> None:
        self._hash.update(canonical_line(request).encode("utf-8"))
        self._hash.update(b"\n")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def fingerprint(requests: list[Request] | tuple[Request, ...]) -> str:
    """The full hex sha256 of the requests' canonical content."""
    fp = Fingerprinter()
    for request in requests:
        fp.add(request)
    return fp.hexdigest()


def short_fingerprint(fingerprint: str) -> str:
    """How a workload's fingerprint is shown: `sha256:<first 12 hex>`."""
    return f"sha256:{fingerprint.removeprefix('sha256:')[:12]}"


def prompt_digest(request: Request) -> str:
    """sha256 of what a request asks (its messages or prompt), independent of id, timing and file: two
    workloads holding the same prompt give it the same digest (how a draft's training prompts are recognised)."""
    if request.messages is not None:
        content: Any = [{"role": m.role, "content": m.content} for m in request.messages]
    else:
        content = request.prompt
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()
