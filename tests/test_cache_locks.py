"""Two processes writing the same cache entry at the same moment (two pipeline jobs sharing a cache volume):
both succeed, the entry is written once and intact, and the second process says it waited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WAITED = "waiting for another runinfra-opt process that is writing"


def _two_at_once(tmp_path: Path, job: str, *args: str, timeout_s: float = 600) -> list[tuple[dict[str, Any], str]]:
    """Start two `python -m tests.lock_jobs JOB` processes, release them together once both are set up, and
    return each one's (printed result, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    go = tmp_path / "go"
    procs, ready = [], []
    for i in range(2):
        ready.append(tmp_path / f"ready-{i}")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.lock_jobs", job, str(ready[i]), str(go), *args],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        )
    deadline = time.monotonic() + timeout_s
    while not all(r.exists() for r in ready):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        assert time.monotonic() < deadline, "the jobs did not get ready"
        time.sleep(0.01)
    go.touch()
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, stderr
        out.append((json.loads(stdout.strip().splitlines()[-1]), stderr))
    return out


def _waited(results: list[tuple[dict[str, Any], str]]) -> list[bool]:
    return [WAITED in stderr for _, stderr in results]


def test_cost_model_cache_is_measured_once(
    tmp_path: Path, tiny_models: tuple[Path, Path], isolated_cache: Path
) -> None:
    results = _two_at_once(tmp_path, "costs", str(tiny_models[0]))
    measured = [r["measured"] for r, _ in results]
    # One process measured the model and its early exit; the other waited for the lock and read its samples.
    assert sorted(measured, key=len) == [[], ["target", "early_exit:2"]]
    assert sorted(_waited(results)) == [False, True]
    assert results[0][0]["samples"] == results[1][0]["samples"]
    (cache_file,) = (isolated_cache / "costmodels").glob("*.json")
    entry = json.loads(cache_file.read_text(encoding="utf-8"))
    assert set(entry["roles"]) == {"self", "early_exit:2"}
    assert sorted(p.name for p in cache_file.parent.iterdir()) == sorted([cache_file.name, cache_file.name + ".lock"])


def test_teacher_data_is_generated_once(tmp_path: Path, tiny_models: tuple[Path, Path], isolated_cache: Path) -> None:
    workload = tmp_path / "tiny.jsonl"
    lines = [{"id": f"r{i}", "category": "echo", "prompt": "abc " * (i + 2), "max_tokens": 16} for i in range(6)]
    workload.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    results = _two_at_once(tmp_path, "teacher", str(tiny_models[0]), str(workload))
    stages = sorted((r["stages"] for r, _ in results), key=len)
    assert stages[0] == ["teacher data (cached)"]
    assert "teacher logits" in stages[1]
    assert sorted(_waited(results)) == [False, True]
    assert results[0][0]["fingerprint"] == results[1][0]["fingerprint"]
    (data_dir,) = [p for p in (isolated_cache / "distill").iterdir() if p.is_dir()]
    assert [p.name for p in data_dir.iterdir()] == ["data.pt"]  # no temporary file left


def test_gguf_conversion_is_done_once(tmp_path: Path, isolated_cache: Path) -> None:
    """A GGUF file, converted into a fresh cache by two processes at once: a tiny one made from the bundled
    SmolLM2's (its tokenizer cut to 1,024 tokens, one 64-wide layer), converted in seconds; the bundled file
    itself converts once per suite run, for the tests that use it (`shared_model_cache`)."""
    from runinfra_opt.models import default_gguf_path
    from tests.tiny_models import build_gguf

    gguf = build_gguf(tmp_path / "tiny-smollm2.gguf", default_gguf_path())
    results = _two_at_once(tmp_path, "convert", str(gguf))
    dirs = {r["dir"] for r, _ in results}
    assert len(dirs) == 1
    target = Path(dirs.pop())
    # Written once: the directory both processes saw is the one there now (a second conversion would have
    # replaced it with another directory).
    assert {r["inode"] for r, _ in results} == {target.stat().st_ino}
    assert sorted(_waited(results)) == [False, True]
    assert (target / ".complete").is_file()
    assert json.loads((target / "source.json").read_text(encoding="utf-8"))["sha256"]
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name, target.name + ".lock"]
