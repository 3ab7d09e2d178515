"""Find the drafts distilled for a target, so that `optimize` with no `--draft` still compares real drafts.

`runinfra-opt draft distill --out .runinfra/drafts/NAME` (what `make demo` runs) leaves a transformers
checkpoint with a `distill.json` that records the target's file hash. When `optimize` gets no `--draft`, it
uses every complete draft under `--drafts-dir` (default `.runinfra/drafts`) distilled for the same target.
"""

from __future__ import annotations

import json
from pathlib import Path

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
