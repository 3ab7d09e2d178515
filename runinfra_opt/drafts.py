"""Find the drafts distilled for a target, so that `optimize` with no `--draft` still compares real drafts.

`runinfra-opt draft distill --out .runinfra/drafts/NAME` (what `make demo` runs) leaves a transformers
checkpoint with a `distill.json` that records the target's file hash. When `optimize` gets no `--draft`, it
uses every complete draft under `--drafts-dir` (default `.runinfra/drafts`) distilled for the same target.

A distilled draft has seen its training prompts: on them it agrees with the target far more often than on new
traffic (it memorises them), so `bench` and `optimize` measure a draft only on requests it was not trained on
(`distill.json` lists the digests of its training prompts).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from runinfra_opt.errors import UserInputError
from runinfra_opt.workload.fingerprint import prompt_digest
from runinfra_opt.workload.model import Request

DEFAULT_DRAFTS_DIR = Path(".runinfra") / "drafts"


def find_distilled_drafts(target_sha256: str | None, root: Path) -> list[str]:
    """Draft directories under `root` (one level) whose distill.json names this target's hash, sorted by name."""
    if not target_sha256 or not root.is_dir():
        return []
    found = []
    for report in sorted(root.glob("*/distill.json")):
        draft_dir = report.parent
        if not (draft_dir / "config.json").is_file():
            continue
        try:
            saved = json.loads(report.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        key = saved.get("key") if isinstance(saved, dict) else None
        if isinstance(key, dict) and key.get("target_sha256") == target_sha256:
            found.append(str(draft_dir))
    return found


def trained_prompts(draft_spec: str) -> set[str]:
    """Digests of the prompts a draft was distilled on (empty for a draft that has no distill.json)."""
    report = Path(draft_spec) / "distill.json"
    if not report.is_file():
        return set()
    try:
        saved = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return set()
    digests = saved.get("workload", {}).get("train_prompt_digests") if isinstance(saved, dict) else None
    return {str(d) for d in digests} if isinstance(digests, list) else set()


class RequestFilter(Protocol):
    """What `measurable_requests` needs of an engine's `PromptTokenizer`: which requests fit the context."""

    def filter_requests(
        self, requests: Sequence[Request], *, max_tokens: int, source: str
    ) -> tuple[list[Request], list[Request]]: ...


@dataclass
class Measurable:
    """What bench and optimize may measure of a workload, and what they leave out."""

    requests: list[Request]
    too_long: list[Request]
    """Skipped: longer than the target's context (only with --skip-too-long; otherwise an error)."""
    trained_on: list[Request]
    """Left out: a draft was distilled on their prompts."""
    per_draft: dict[str, int] = field(default_factory=dict)
    """Draft -> how many of the fitting requests it was distilled on (drafts that saw none are absent)."""

    def trained_on_note(self) -> str | None:
        """One line saying which requests were left out because a draft was trained on them."""
        if not self.trained_on:
            return None
        parts = ", ".join(f"{Path(spec).name} on {n}" for spec, n in sorted(self.per_draft.items()))
        total = len(self.requests) + len(self.trained_on)
        return (
            f"left out {len(self.trained_on)} of {total} requests that drafts were distilled on ({parts}): a draft "
            "is measured only on traffic it has not seen"
        )


def measurable_requests(
    prompts: RequestFilter, requests: Sequence[Request], *, max_tokens: int, source: str, drafts: Sequence[str]
) -> Measurable:
    """The requests to measure: those that fit the target's context and that no draft was distilled on.

    Raises UserInputError when every request is too long, or when every fitting one trained a draft."""
    fitting, too_long = prompts.filter_requests(requests, max_tokens=max_tokens, source=source)
    if not fitting:
        raise UserInputError(f"{source}: every request is too long for the target's context")
    seen_by = {spec: trained_prompts(spec) for spec in drafts}
    result = Measurable([], too_long, [])
    for request in fitting:
        digest = prompt_digest(request)
        hits = [spec for spec, seen in seen_by.items() if digest in seen]
        for spec in hits:
            result.per_draft[spec] = result.per_draft.get(spec, 0) + 1
        (result.trained_on if hits else result.requests).append(request)
    if not result.requests:
        raise UserInputError(
            f"{source}: every request was used to distil {', '.join(sorted(result.per_draft))}; a draft measured on "
            "its own training prompts looks far better than it is: measure it on other traffic (its distill.json "
            "lists the held-out requests)"
        )
    return result
