"""Drafts distilled for a target are found by the target's hash; others and incomplete ones are not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.drafts import find_distilled_drafts
from runinfra_opt.models import resolve_model
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


def _optimize_args(workload: Path, target: Path, drafts_dir: Path, tmp_path: Path) -> list[str]:
    return [
        "optimize", "--workload", str(workload), "--target", str(target), "--drafts-dir", str(drafts_dir),
        "--methods", "draft", "--lookahead", "2", "--threads", "1", "--repeats", "1", "--confirm", "1",
        "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "m.yaml"),
    ]  # fmt: skip


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
    result = runner.invoke(app, _optimize_args(workload, target, drafts_dir, tmp_path), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "using 1 draft(s) distilled for this target" in result.output
    results = load_results(tmp_path / "run" / "results.json")
    assert [d.spec for d in results.drafts] == [str(drafts_dir / "tiny-distilled")]
    assert any(v.name == "draft:tiny-distilled-k2" for v in results.variants)


def _workload(path: Path, prompts: list[str]) -> Path:
    lines = [json.dumps({"id": f"r{i}", "prompt": p, "max_tokens": 6}) for i, p in enumerate(prompts)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _distilled_on(
    tmp_path: Path, tiny_models: tuple[Path, Path], trained: list[str]
) -> tuple[Path, Path, Path, Path]:
    """(target, drafts dir, draft, workload of PROMPTS): a copy of the tiny draft in the drafts dir whose
    distill.json says it was trained on `trained` (as `draft distill` writes it)."""
    from runinfra_opt.workload import load_workload
    from runinfra_opt.workload.fingerprint import prompt_digest

    target, draft = tiny_models
    drafts_dir = tmp_path / "drafts"
    dest = drafts_dir / "tiny-distilled"
    shutil.copytree(draft, dest)
    train_set = load_workload(str(_workload(tmp_path / "train.jsonl", trained)))
    report = {
        "key": {"target_sha256": resolve_model(str(target)).sha256()},
        "workload": {"train_prompt_digests": [prompt_digest(r) for r in train_set.requests]},
    }
    (dest / "distill.json").write_text(json.dumps(report), encoding="utf-8")
    return target, drafts_dir, dest, _workload(tmp_path / "w.jsonl", PROMPTS)


def _bench_args(workload: Path, target: Path, draft: Path) -> list[str]:
    return [
        "bench", "--workload", str(workload), "--target", str(target), "--draft", str(draft), "--method", "draft",
        "--lookahead", "2", "--max-tokens", "4", "--device", "cpu",
    ]  # fmt: skip


PROMPTS = ["abc abc abc abc", "one two one two", "x y z x y z", "hello hello hello"]


def test_optimize_measures_a_distilled_draft_only_on_prompts_it_was_not_trained_on(
    runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    target, drafts_dir, _draft, workload = _distilled_on(tmp_path, tiny_models, PROMPTS[:3])
    result = runner.invoke(app, _optimize_args(workload, target, drafts_dir, tmp_path), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = load_results(tmp_path / "run" / "results.json")
    assert results.workload is not None
    assert results.workload.used_requests == 1
    assert {r.request_id for v in results.variants for r in v.predicted_requests + v.measured_requests} == {"r3"}
    assert any("left out 3 of 4 requests that drafts were distilled on" in n.text for n in results.notes_of("left_out"))
    assert "Note: left out 3 of 4 requests" in result.output


def test_optimize_refuses_a_workload_the_draft_was_entirely_trained_on(
    runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    target, _dir, dest, workload = _distilled_on(tmp_path, tiny_models, PROMPTS)
    args = [
        "optimize", "--workload", str(workload), "--target", str(target), "--draft", str(dest),
        "--methods", "draft", "--lookahead", "2", "--threads", "1", "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "every request was used to distil" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, _bench_args(workload, target, dest))
    assert result.exit_code == 2, result.output
    assert "every request was used to distil" in result.output


def test_bench_leaves_out_the_prompts_a_draft_was_trained_on(
    runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    target, _dir, dest, workload = _distilled_on(tmp_path, tiny_models, PROMPTS[1:])
    result = runner.invoke(app, [*_bench_args(workload, target, dest), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["seen_by_draft"] == ["r1", "r2", "r3"]
    assert data["workload"]["used_requests"] == 1
