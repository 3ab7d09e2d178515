"""Drafts distilled for a target are found by the target's hash; others and incomplete ones are not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.models import resolve_model
from runinfra_opt.optimize.drafts import find_distilled_drafts
from runinfra_opt.results import load_results


def _draft(root: Path, name: str, target_sha: str, *, complete: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "distill.json").write_text(json.dumps({"key": {"target_sha256": target_sha}}), encoding="utf-8")
    if complete:
        (d / "config.json").write_text("{}", encoding="utf-8")
    return d


def test_finds_only_complete_drafts_of_the_same_target(tmp_path: Path) -> None:
    a = _draft(tmp_path, "b-large", "aaa")
    b = _draft(tmp_path, "a-small", "aaa")
    _draft(tmp_path, "other-target", "bbb")
    _draft(tmp_path, "unfinished", "aaa", complete=False)
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "distill.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "corrupt" / "config.json").write_text("{}", encoding="utf-8")
    assert find_distilled_drafts("aaa", tmp_path) == [str(b), str(a)]
    assert find_distilled_drafts("ccc", tmp_path) == []
    assert find_distilled_drafts(None, tmp_path) == []
    assert find_distilled_drafts("aaa", tmp_path / "missing") == []


def test_optimize_without_draft_uses_the_drafts_distilled_for_its_target(
    runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    target, draft = tiny_models
    drafts_dir = tmp_path / "drafts"
    shutil.copytree(draft, drafts_dir / "tiny-distilled")
    sha = resolve_model(str(target)).sha256()
    (drafts_dir / "tiny-distilled" / "distill.json").write_text(
        json.dumps({"key": {"target_sha256": sha}}), encoding="utf-8"
    )
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "prompt": "abc abc abc abc", "max_tokens": 8}) + "\n", encoding="utf-8")
    args = [
        "optimize", "--workload", str(workload), "--target", str(target), "--drafts-dir", str(drafts_dir),
        "--methods", "draft", "--lookahead", "2", "--threads", "1", "--repeats", "1", "--confirm", "1",
        "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "m.yaml"),
    ]  # fmt: skip
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "using 1 draft(s) distilled for this target" in result.output
    results = load_results(tmp_path / "run" / "results.json")
    assert [d.spec for d in results.drafts] == [str(drafts_dir / "tiny-distilled")]
    assert any(v.name == "draft:tiny-distilled-k2" for v in results.variants)
