"""`benchmarks/confirm_replay.py` and `predictor_accuracy.py --engine vllm --exhaustive-of`, run as scripts, on a
recorded exhaustive run of the stand-in server's table engine: the replay launches nothing, leaves the recorded run
as it was, and makes its choices from the recorded figures; the predictive-only benchmark compares a new predictive
run with the recorded exhaustive one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.results import load_results
from tests.benchmark_runs import run_benchmark
from tests.test_optimize_vllm_predict import COST, PROMPTS


@pytest.mark.quiet
def test_replay_and_the_predictive_only_benchmark_on_a_recorded_exhaustive_run(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_STEP", "table")
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps(COST))
    workload = tmp_path / "tiny.jsonl"
    rows = [{"id": f"r{i}", "category": "copy", "prompt": f"request {i}: {PROMPTS[i % 4]}"} for i in range(8)]
    workload.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recorded = tmp_path / "recorded"
    run_dir = recorded / "tiny-exhaustive"
    args = ["optimize", "--engine", "vllm", "--vllm-python", fake_vllm, "--target", str(tiny_models[0]),
            "--workload", str(workload), "--methods", "vllm_ngram", "--lookahead", "2,8", "--ngram-max", "3",
            "--load", "none", "--strategy", "exhaustive", "--max-tokens", "12", "--repeats", "1",
            "--run-dir", str(run_dir), "--out", str(tmp_path / "m.yaml")]  # fmt: skip
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    exhaustive = load_results(run_dir / "results.json")
    assert exhaustive.decision is not None
    before = (run_dir / "results.json").read_bytes()
    servers = sorted(p.name for p in (run_dir / "servers").glob("*.log"))
    assert len(servers) == 3  # the baseline and two variants

    work, replays = tmp_path / "work", tmp_path / "replays.json"
    run_benchmark("confirm_replay.py", str(run_dir), "--confirm", "2", "--vllm-python", fake_vllm, "--work", str(work),
               "--out", str(replays), "--out-dir", str(tmp_path / "replay-out"))  # fmt: skip
    at_once, one_by_one = json.loads(replays.read_text())
    assert (at_once["mode"], one_by_one["mode"]) == ("at-once", "sequential")
    assert (run_dir / "results.json").read_bytes() == before
    assert sorted(p.name for p in (run_dir / "servers").glob("*.log")) == servers
    for entry, copy in ((at_once, work / "tiny-exhaustive-at-once"), (one_by_one, work / "tiny-exhaustive-sequential")):
        assert sorted(p.name for p in (copy / "servers").glob("*.log")) == servers  # nothing launched
        replayed = load_results(copy / "results.json")
        assert replayed.plan is not None
        assert replayed.plan.confirm == ["baseline", *entry["candidates"]]
        assert 1 <= len(entry["candidates"]) <= 2
        assert entry["servers"] == 1 + len(entry["candidates"])
        timed = {v.name for v in replayed.variants if v.confirmed}
        assert timed == {"baseline", *entry["candidates"]}
        for name in entry["candidates"]:  # the figures revealed are the recorded ones
            mine, theirs = replayed.variant(name), exhaustive.variant(name)
            assert mine is not None
            assert mine.measured is not None
            assert theirs is not None
            assert theirs.measured is not None
            assert mine.measured.tokens_per_s == pytest.approx(theirs.measured.tokens_per_s)
        assert entry["winner"] in timed
        assert entry["exhaustive_winner"] == exhaustive.decision.winner
        ratio = entry["winner_over_exhaustive_winner_batch1"]
        assert ratio is not None
        assert 0 < ratio <= 1.01
    assert at_once["candidates"][0] == one_by_one["candidates"][0]  # both start from the first ranking's best

    # predictor_accuracy --exhaustive-of: only the predictive run is made; the recorded exhaustive run stands in.
    shutil.copytree(run_dir, tmp_path / "recorded-copy")
    out = tmp_path / "report.json"
    run_benchmark("predictor_accuracy.py", "--engine", "vllm", "--vllm-python", fake_vllm, "--workloads", str(workload),
               "--target", str(tiny_models[0]), "--exhaustive-of", str(recorded), "--requests", "8",
               "--max-tokens", "12", "--repeats", "1", "--h2h-repeats", "0", "--load", "none",
               "--ngram-max", "3", "--lookaheads", "2", "8",
               "--out", str(out), "--raw-dir", str(tmp_path / "raw"), "--out-dir", str(tmp_path / "out"))  # fmt: skip
    assert (run_dir / "results.json").read_bytes() == before
    assert not (tmp_path / "raw" / "tiny-exhaustive").exists()
    entry = json.loads(out.read_text())["workloads"][str(workload)]
    assert entry["exhaustive_of"] == str(recorded)
    assert entry["exhaustive"]["winner"] == exhaustive.decision.winner
    assert entry["exhaustive"]["servers"] == 3
    assert entry["exhaustive"]["wall_s"] == pytest.approx(exhaustive.timings_s["total"], abs=0.1)
    predictive = load_results(tmp_path / "raw" / "tiny-predictive" / "results.json")
    assert predictive.plan is not None
    assert predictive.plan.confirm_slots == 2  # --confirm 3 of two variants
    assert entry["predictive"]["servers"] == [launch["variant"] for launch in predictive.launches]
    assert entry["predictive"]["baseline_tokens_per_s"] > 0
    assert entry["exhaustive"]["baseline_tokens_per_s"] > 0
