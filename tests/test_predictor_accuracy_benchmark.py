"""`benchmarks/predictor_accuracy.py` end to end on the tiny models, run as a script: both strategies, the
per-family Kendall tau, the head-to-head of the two winners and the report file, so that a long run on a quiet
machine cannot fail at its end; `repredict.py` on its runs. (Figures on tiny models mean nothing; the structure and
the pairing are checked.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from runinfra_opt.results import load_results
from tests.benchmark_runs import run_benchmark

FIXTURES = Path(__file__).resolve().parent / "fixtures"

WORKLOAD = [
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc", "max_tokens": 12},
    {"id": "echo-2", "category": "echo", "prompt": "hello hello hello", "max_tokens": 12},
    {"id": "chat-1", "category": "chat", "prompt": "tell me a story", "max_tokens": 12},
]


def _recorded_with_other_winners(raw: Path, recorded: Path, workload: str) -> str:
    """Copy the two runs under `raw` into `recorded` (as `--h2h-of` reads them), the exhaustive run's winner changed
    to another confirmed variant than the predictive winner, so that the head-to-head has two winners to time; that
    variant's name."""
    stem = Path(workload).stem
    for strategy in ("predictive", "exhaustive"):
        shutil.copytree(raw / f"{stem}-{strategy}", recorded / f"{stem}-{strategy}")
    predictive = load_results(recorded / f"{stem}-predictive" / "results.json")
    exhaustive_file = recorded / f"{stem}-exhaustive" / "results.json"
    exhaustive = load_results(exhaustive_file)
    assert predictive.decision is not None
    assert exhaustive.decision is not None
    other = next(
        v.name
        for v in exhaustive.variants
        if (v.confirmed or v.measured is not None) and v.name not in (predictive.decision.winner, "baseline")
    )
    data = json.loads(exhaustive_file.read_text(encoding="utf-8"))
    data["decision"]["winner"] = other
    exhaustive_file.write_text(json.dumps(data), encoding="utf-8")
    return other


def test_benchmark_runs_both_strategies_and_the_head_to_head(tiny_models: tuple[Path, Path], tmp_path: Path) -> None:
    workload = tmp_path / "tiny.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in WORKLOAD), encoding="utf-8")
    out, raw = tmp_path / "report.json", tmp_path / "raw"
    run_benchmark(
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
    )  # fmt: skip
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

    # --h2h-of: two different winners are timed against each other on the same requests, interleaved and paired.
    recorded = tmp_path / "recorded"
    other = _recorded_with_other_winners(raw, recorded, str(workload))
    h2h_out = tmp_path / "h2h.json"
    run_benchmark(
        "predictor_accuracy.py", "--workloads", str(workload), "--target", str(tiny_models[0]), "--threads", "1",
        "--max-tokens", "8", "--h2h-repeats", "2", "--exit-layers", "2", "--h2h-of", str(recorded),
        "--out", str(h2h_out), "--raw-dir", str(tmp_path / "raw2"), "--out-dir", str(tmp_path / "out2"),
    )  # fmt: skip
    h2h = json.loads(h2h_out.read_text())["workloads"][str(workload)]["head_to_head"]
    assert h2h["exhaustive_winner"] == other
    assert h2h["requests"] == 2
    assert h2h["repeats"] == 2
    ratio = h2h["ratio"]
    assert 0 < ratio["low"] <= ratio["value"] <= ratio["high"]
    assert h2h["predictive_tokens_per_s"] > 0
    assert h2h["exhaustive_tokens_per_s"] > 0

    # benchmarks/repredict.py on the recorded exhaustive run: resumed on a copy, nothing measured again, and the
    # same predictor gives back the recorded errors (the original directory is left as it was).
    before = (raw / "tiny-exhaustive" / "results.json").read_bytes()
    again_out = tmp_path / "repredict.json"
    run_benchmark(
        "repredict.py", str(raw / "tiny-exhaustive"), "--out", str(again_out), "--out-dir", str(tmp_path / "out3")
    )
    [again] = json.loads(again_out.read_text())
    assert (raw / "tiny-exhaustive" / "results.json").read_bytes() == before
    assert again["now"]["batch1"] == again["recorded"]["batch1"]
    recorded_run = load_results(raw / "tiny-exhaustive" / "results.json")
    assert recorded_run.decision is not None
    assert again["now"]["winner"] == again["recorded"]["winner"] == recorded_run.decision.winner
    assert len(again["now"]["batch1"]) == 17


def test_serving_head_to_head_alternates_fresh_launches(
    runner: Any, fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    """The vLLM head-to-head (`--h2h-of`) on the stand-in server: each winner on fresh launches, A B then B A (the
    second B is a launch of its own, not the server B just had), the same requests on each, paired by request and
    launch; and with one winner, nothing to launch."""
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
    assert exhaustive.decision is not None
    raw = tmp_path / "raw"
    for strategy in ("predictive", "exhaustive"):
        shutil.copytree(run_dir, raw / f"tiny-{strategy}")
    recorded = tmp_path / "recorded"
    other = _recorded_with_other_winners(raw, recorded, str(workload))
    # the copies' roles: the predictive run keeps the real winner, the exhaustive one names `other`
    a, b = exhaustive.decision.winner, other
    out = tmp_path / "h2h.json"
    run_benchmark(
        "predictor_accuracy.py", "--engine", "vllm", "--vllm-python", fake_vllm, "--workloads", str(workload),
        "--target", str(tiny_models[0]), "--max-tokens", "8", "--h2h-repeats", "2", "--h2h-of", str(recorded),
        "--out", str(out), "--raw-dir", str(tmp_path / "raw2"), "--out-dir", str(tmp_path / "out2"),
    )  # fmt: skip
    h2h = json.loads(out.read_text())["workloads"][str(workload)]["head_to_head"]
    assert [(launch["variant"], launch["repeat"]) for launch in h2h["launches"]] == [(a, 0), (b, 0), (b, 1), (a, 1)]
    assert len(list((tmp_path / "raw2" / "tiny-head-to-head").glob("*.log"))) == 4  # every pass on its own server
    assert h2h["requests"] == 3
    ratio = h2h["ratio"]
    assert 0 < ratio["low"] <= ratio["value"] <= ratio["high"]
    assert h2h["predictive_tokens_per_s"] > 0
    assert h2h["exhaustive_tokens_per_s"] > 0

    # one run twice: the same winner, nothing to launch
    same = tmp_path / "same"
    for strategy in ("predictive", "exhaustive"):
        shutil.copytree(run_dir, same / f"tiny-{strategy}")
    out = tmp_path / "same.json"
    run_benchmark(
        "predictor_accuracy.py", "--engine", "vllm", "--vllm-python", fake_vllm, "--workloads", str(workload),
        "--target", str(tiny_models[0]), "--h2h-of", str(same), "--out", str(out),
        "--raw-dir", str(tmp_path / "raw3"), "--out-dir", str(tmp_path / "out3"),
    )  # fmt: skip
    entry = json.loads(out.read_text())["workloads"][str(workload)]
    assert entry["of"] == str(same)
    assert entry["head_to_head"]["note"] == "same winner: nothing to measure"


def test_launch_order_drift_reads_the_recorded_runs() -> None:
    """The drift figure on two recorded exhaustive vLLM runs: one on a host that sped up 25% during the pair (the
    late variants measured 1.21-1.24 of their prediction), one on a steady host. The runs are fixtures cut down
    from the recorded ones to what these functions read (tests/fixtures/README.md)."""
    from runinfra_opt.report.accuracy import launch_order_drift, serving_entry

    sped_up, steady_host = FIXTURES / "vllm-runs-host-sped-up", FIXTURES / "vllm-runs-steady-host"
    fast = launch_order_drift(load_results(sped_up / "summarize-exhaustive" / "results.json"))
    steady = launch_order_drift(load_results(steady_host / "summarize-exhaustive" / "results.json"))
    assert fast is not None
    assert steady is not None
    assert len(fast["launch_order"]) == len(fast["measured_over_predicted"]) == 16  # every variant, no baseline
    assert fast["launch_order"][0] == "vllm_ngram-m1-n1-k1"
    assert fast["kendall_tau"] > 0.4
    assert fast["second_half_median"] - fast["first_half_median"] > 0.1
    assert steady["kendall_tau"] < 0.25
    assert abs(steady["second_half_median"] - steady["first_half_median"]) < 0.02

    # The entry the benchmark wrote for the sped-up pair comes back from its run directories.
    recorded = json.loads((FIXTURES / "vllm-runs-host-sped-up-entry.json").read_text())["workloads"]["summarize"]
    raw = sped_up
    entry = serving_entry(
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
