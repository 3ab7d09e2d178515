"""`benchmarks/predictor_accuracy.py` end to end on the tiny models: both strategies, the per-family Kendall tau,
the head-to-head of the two winners and the report file, so that a long run on a quiet machine cannot fail
at its end. (Figures on tiny models mean nothing; the structure and the pairing are checked.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import predictor_accuracy
from runinfra_opt.results import load_results

FIXTURES = Path(__file__).resolve().parent / "fixtures"

WORKLOAD = [
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc", "max_tokens": 12},
    {"id": "echo-2", "category": "echo", "prompt": "hello hello hello", "max_tokens": 12},
    {"id": "chat-1", "category": "chat", "prompt": "tell me a story", "max_tokens": 12},
]


def test_benchmark_runs_both_strategies_and_the_head_to_head(
    tiny_models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = tmp_path / "tiny.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in WORKLOAD), encoding="utf-8")
    out, raw = tmp_path / "report.json", tmp_path / "raw"
    argv = [
        "predictor_accuracy.py",
        "--workloads", str(workload),
        "--target", str(tiny_models[0]),
        "--requests", "2",
        "--max-tokens", "8",
        "--repeats", "1",
        "--h2h-repeats", "2",
        "--threads", "1",
        "--exit-layers", "2",
        "--out", str(out),
        "--raw-dir", str(raw),
        "--out-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    assert predictor_accuracy.main() == 0
    report = json.loads(out.read_text())
    entry = report["workloads"][str(workload)]
    assert entry["requests"] == 2
    families = {f["method"]: f for f in entry["exhaustive"]["family_rankings"]}
    assert set(families) == {"ngram", "early_exit"}
    assert families["ngram"]["variants"] == 12
    assert families["early_exit"]["variants"] == 4
    assert len(entry["exhaustive"]["all_errors"]) == 17  # every variant, the baseline included
    assert entry["head_to_head"]["ratio"]["low"] <= entry["head_to_head"]["ratio"]["value"]
    assert (raw / "tiny-predictive" / "results.json").is_file()
    assert (raw / "tiny-exhaustive" / "results.json").is_file()
    kept = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert kept["benchmark"] == "benchmarks/predictor_accuracy.py"
    assert kept["figures"]["workloads"][str(workload)]["wall_time_ratio"] == entry["wall_time_ratio"]

    # Two different winners are timed against each other on the same requests, interleaved and paired.
    predictive = load_results(raw / "tiny-predictive" / "results.json")
    exhaustive = load_results(raw / "tiny-exhaustive" / "results.json")
    assert predictive.decision is not None
    assert exhaustive.decision is not None
    other = next(v.name for v in exhaustive.variants if v.confirmed and v.name != predictive.decision.winner)
    exhaustive.decision = exhaustive.decision.model_copy(update={"winner": other})  # frozen: a copy
    args = predictor_accuracy.argparse.Namespace(target=str(tiny_models[0]), threads=1, max_tokens=8, h2h_repeats=2)
    h2h = predictor_accuracy.head_to_head(str(workload), predictive, exhaustive, args)
    assert h2h["exhaustive_winner"] == other
    assert h2h["requests"] == 2
    assert h2h["repeats"] == 2
    ratio = h2h["ratio"]
    assert 0 < ratio["low"] <= ratio["value"] <= ratio["high"]
    assert h2h["predictive_tokens_per_s"] > 0
    assert h2h["exhaustive_tokens_per_s"] > 0

    # benchmarks/repredict.py on the recorded exhaustive run: resumed on a copy, nothing measured again, and the
    # same predictor gives back the recorded errors (the original directory is left as it was).
    from benchmarks import repredict

    before = (raw / "tiny-exhaustive" / "results.json").read_bytes()
    (tmp_path / "work").mkdir()
    again = repredict.repredict(raw / "tiny-exhaustive", tmp_path / "work", None)
    assert (raw / "tiny-exhaustive" / "results.json").read_bytes() == before
    assert again["now"]["batch1"] == again["recorded"]["batch1"]
    recorded = load_results(raw / "tiny-exhaustive" / "results.json")
    assert recorded.decision is not None
    assert again["now"]["winner"] == again["recorded"]["winner"] == recorded.decision.winner
    assert len(again["now"]["batch1"]) == 17


def test_serving_head_to_head_alternates_fresh_launches(
    runner: Any, fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    """The vLLM head-to-head on the stand-in server: each winner on fresh launches, A B then B A (the second B is
    a launch of its own, not the server B just had), the same requests on each, paired by request and launch."""
    from runinfra_opt.cli.app import app

    workload = tmp_path / "tiny.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in WORKLOAD), encoding="utf-8")
    run_dir = tmp_path / "run"
    args = ["optimize", "--engine", "vllm", "--vllm-python", fake_vllm, "--target", str(tiny_models[0]),
            "--workload", str(workload), "--methods", "vllm_ngram", "--lookahead", "2,4", "--ngram-max", "3",
            "--load", "none", "--strategy", "exhaustive", "--max-tokens", "8", "--repeats", "1",
            "--run-dir", str(run_dir), "--out", str(tmp_path / "m.yaml"), "--json"]  # fmt: skip
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code in (0, 4), result.output
    exhaustive = load_results(run_dir / "results.json")
    predictive = load_results(run_dir / "results.json")
    assert exhaustive.decision is not None
    assert predictive.decision is not None
    other = next(v.name for v in exhaustive.variants if v.measured is not None and v.name != exhaustive.decision.winner)
    predictive.decision = predictive.decision.model_copy(update={"winner": other})  # frozen: a copy
    h2h_args = predictor_accuracy.argparse.Namespace(
        target=str(tiny_models[0]), max_tokens=8, h2h_repeats=2, vllm_python=fake_vllm
    )
    logs = tmp_path / "h2h"
    h2h = predictor_accuracy.serving_head_to_head(str(workload), predictive, exhaustive, h2h_args, logs)
    a, b = other, exhaustive.decision.winner
    assert [(launch["variant"], launch["repeat"]) for launch in h2h["launches"]] == [(a, 0), (b, 0), (b, 1), (a, 1)]
    assert len(list(logs.glob("*.log"))) == 4  # every pass on a server of its own
    assert h2h["requests"] == 3
    ratio = h2h["ratio"]
    assert 0 < ratio["low"] <= ratio["value"] <= ratio["high"]
    assert h2h["predictive_tokens_per_s"] > 0
    assert h2h["exhaustive_tokens_per_s"] > 0

    # --h2h-of: the head-to-head alone, of two runs recorded under an earlier --raw-dir (here one run twice: the
    # same winner, nothing to launch), written into the report.
    import shutil

    recorded = tmp_path / "recorded"
    for strategy in ("predictive", "exhaustive"):
        shutil.copytree(run_dir, recorded / f"tiny-{strategy}")
    out = tmp_path / "h2h.json"
    argv = ["predictor_accuracy.py", "--engine", "vllm", "--vllm-python", fake_vllm, "--workloads", str(workload),
            "--target", str(tiny_models[0]), "--h2h-of", str(recorded), "--out", str(out),
            "--raw-dir", str(tmp_path / "raw2"), "--out-dir", str(tmp_path / "out2")]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", argv)
        assert predictor_accuracy.main() == 0
    entry = json.loads(out.read_text())["workloads"][str(workload)]
    assert entry["of"] == str(recorded)
    assert entry["head_to_head"]["note"] == "same winner: nothing to measure"


def test_launch_order_drift_reads_the_recorded_runs() -> None:
    """The drift figure on two recorded exhaustive vLLM runs: 2026-12-04f, on a host that sped up 25% during the
    pair (the late variants measured 1.21-1.24 of their prediction), and 2026-12-04e, on a steady one. The runs
    are fixtures cut down from the recorded ones to what these functions read (tests/fixtures/README.md)."""
    results = FIXTURES
    fast = predictor_accuracy.launch_order_drift(
        load_results(results / "predictor_accuracy-vllm-2026-12-04f" / "summarize-exhaustive" / "results.json")
    )
    steady = predictor_accuracy.launch_order_drift(
        load_results(results / "predictor_accuracy-vllm-2026-12-04e" / "summarize-exhaustive" / "results.json")
    )
    assert fast is not None
    assert steady is not None
    assert len(fast["launch_order"]) == len(fast["measured_over_predicted"]) == 16  # every variant, no baseline
    assert fast["launch_order"][0] == "vllm_ngram-m1-n1-k1"
    assert fast["kendall_tau"] > 0.4
    assert fast["second_half_median"] - fast["first_half_median"] > 0.1
    assert steady["kendall_tau"] < 0.25
    assert abs(steady["second_half_median"] - steady["first_half_median"]) < 0.02

    # The entry the benchmark wrote for 2026-12-04f (the figures checked here) comes back from its run directories.
    recorded = json.loads((results / "predictor_accuracy-vllm-2026-12-04f.json").read_text())["workloads"]["summarize"]
    raw = results / "predictor_accuracy-vllm-2026-12-04f"
    entry = predictor_accuracy.serving_entry(
        load_results(raw / "summarize-predictive" / "results.json"),
        load_results(raw / "summarize-exhaustive" / "results.json"),
        recorded["predictive"]["wall_s"],
        recorded["exhaustive"]["wall_s"],
    )
    assert entry["exhaustive"]["drift"] == fast
    for key in ("confirmed_batch1_errors", "confirmed_highest_level_errors", "max_batch1_error", "servers"):
        assert entry["predictive"][key] == recorded["predictive"][key], key
    assert entry["exhaustive"]["batch1_within_10pct"] == recorded["exhaustive"]["batch1_within_10pct"] == "13/16"
    assert entry["wall_time_ratio"] == recorded["wall_time_ratio"] == 0.29
    assert entry["predictive_winner_inside_exhaustive"] == recorded["predictive_winner_inside_exhaustive"]
