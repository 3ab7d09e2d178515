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
from pathlib import Path
from typing import TYPE_CHECKING

from runinfra_opt.errors import UserInputError
from runinfra_opt.workload.fingerprint import prompt_digest
from runinfra_opt.workload.model import Request

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.engine.hf import HFEngine

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


def split_unseen(requests: Sequence[Request], drafts: Sequence[str]) -> tuple[list[Request], dict[str, int]]:
    """(requests no draft was trained on, {draft: how many of `requests` it was trained on}); drafts that saw
    none of them are left out of the count."""
    seen_by = {spec: trained_prompts(spec) for spec in drafts}
    kept: list[Request] = []
    counts: dict[str, int] = {}
    for request in requests:
        digest = prompt_digest(request)
        hits = [spec for spec, seen in seen_by.items() if digest in seen]
        for spec in hits:
            counts[spec] = counts.get(spec, 0) + 1
        if not hits:
            kept.append(request)
    return kept, counts


def seen_note(counts: dict[str, int], total: int, kept: int) -> str:
    """One line saying which requests were left out because a draft was trained on them."""
    parts = ", ".join(f"{Path(spec).name} on {n}" for spec, n in sorted(counts.items()))
    return (
        f"left out {total - kept} of {total} requests that drafts were distilled on ({parts}): a draft is measured "
        "only on traffic it has not seen"
    )


def measurable_requests(
    engine: HFEngine, requests: Sequence[Request], *, max_tokens: int, source: str, drafts: Sequence[str]
) -> tuple[list[Request], list[Request], dict[str, int]]:
    """(requests to measure, requests skipped as too long, {draft: requests left out because it trained on them}).

    Raises UserInputError when every request is too long, or when every fitting one trained a draft."""
    kept, skipped = engine.filter_requests(requests, max_tokens=max_tokens, source=source)
    if not kept:
        raise UserInputError(f"{source}: every request is too long for the target's context")
    unseen, counts = split_unseen(kept, drafts)
    if not unseen:
        raise UserInputError(
            f"{source}: every request was used to distil {', '.join(sorted(counts))}; a draft measured on its own "
            "training prompts looks far better than it is: measure it on other traffic (its distill.json lists the "
            "held-out requests)"
        )
    return unseen, skipped, counts
