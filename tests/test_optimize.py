"""`runinfra-opt optimize` end to end on the tiny models, through the CLI: results file, manifest, every exit
code, resume after an interruption, predicted vs measured for every confirmed variant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.hf.engine import HFEngine
from runinfra_opt.manifest import check_manifest_file
from runinfra_opt.optimize.pipeline import PHASES
from runinfra_opt.report.summary import predicted_vs_measured
from runinfra_opt.results import load_results

TINY_WORKLOAD = [
    # Longer than the calibration cap (48 tokens): calibration simulates cut outputs.
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc abc", "max_tokens": 60, "arrival_s": 0.0},
    {"id": "echo-2", "category": "echo", "prompt": "hello hello hello hello", "max_tokens": 60, "arrival_s": 0.5},
    {
        "id": "chat-1",
        "category": "chat",
        "messages": [{"role": "user", "content": "tell me a story about a cat"}],
        "max_tokens": 60,
        "arrival_s": 1.0,
    },
    {
        "id": "sampled-1",
        "category": "chat",
        "prompt": "once upon a time",
        "max_tokens": 60,
        "temperature": 0.8,
        "seed": 3,
        "arrival_s": 1.5,
    },
]


@pytest.fixture
def tiny_workload(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TINY_WORKLOAD), encoding="utf-8")
    return path


def _args(tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path, *extra: str) -> list[str]:
    target, draft = tiny_models
    return [
        "optimize",
        "--workload",
        str(workload),
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--lookahead",
        "2",
        "--ngram-max",
        "2",
        "--exit-layers",
        "2",
        "--threads",
        "1",
        "--repeats",
        "1",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "manifest.yaml"),
        *extra,
    ]


def _invoke(runner: CliRunner, args: list[str]) -> Any:
    return runner.invoke(app, args, catch_exceptions=False)


def test_optimize_end_to_end_writes_results_and_manifest(
    runner: CliRunner, tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    result = _invoke(runner, _args(tiny_models, tiny_workload, tmp_path, "--confirm", "2", "--json"))
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["status"] == "complete"
    assert printed["decision"]["winner"]

    runs = tmp_path / "runs"
    latest = runs / "latest"
    assert latest.exists()
    results = load_results(latest / "results.json" if latest.is_dir() else runs / latest.read_text().strip())
    assert results.run_id == printed["run_id"]
    assert results.status == "complete"
    assert results.phase == "write"
    assert results.phases_done == [phase.name for phase in PHASES]
    assert results.plan is not None
    assert results.plan.confirm is not None
    assert len(results.plan.request_ids) == len(TINY_WORKLOAD)
    names = {v.name for v in results.variants}
    assert names == {"baseline", "ngram-n2-k2", "early_exit-l2-k2", "draft:tiny-draft-k2"}
    # Every variant is predicted per request; baseline + 2 candidates are timed end to end.
    for v in results.variants:
        assert v.predicted is not None
        assert len(v.predicted_requests) == len(TINY_WORKLOAD)
    confirmed = [v for v in results.variants if v.confirmed]
    assert len(confirmed) == 3
    assert confirmed[0].name == "baseline" or "baseline" in {v.name for v in confirmed}
    for v in confirmed:
        assert v.measured is not None
        assert len(v.measured_requests) == len(TINY_WORKLOAD)  # 1 repeat
        if v.name != "baseline":
            assert v.measured.lossless is True  # greedy speculative decoding is lossless
            assert v.measured.speedup is not None
    rows = predicted_vs_measured(results)
    assert {r["variant"] for r in rows} == {v.name for v in confirmed}
    assert all(r["predicted_tokens_per_s"] > 0 and r["measured_tokens_per_s"] > 0 for r in rows)
    # Simulated pass counts equal measured ones for greedy requests (the predictor's foundation).
    for v in confirmed:
        predicted = {r.request_id: r.target_passes for r in v.predicted_requests if r.greedy}
        assert {r.request_id: r.target_passes for r in v.measured_requests if r.greedy} == predicted
        sampled = [r for r in v.measured_requests if not r.greedy]
        assert len(sampled) == 1
        assert sampled[0].lossless is None  # sampled outputs are not compared
    # The sampled request is predicted from expected acceptance (speculative sampling).
    assert set(results.profile["acceptance"]) == {"draft:" + str(tiny_models[1]), "early_exit:2"}
    assert all(0.0 <= p <= 1.0 for p in results.profile["acceptance"]["early_exit:2"]["sampled-1"])
    costs = results.cost_model.in_process
    assert costs is not None
    assert results.cost_model.serving is None
    assert costs.fitted.roles.keys() >= {"target", "early_exit:2"}
    # Candidates were ranked on the profiling pass's fit; the reported predictions use the confirmation's
    # baseline repeats (same stretch of time as the measured candidates).
    assert costs.calibrated is not None
    assert costs.calibrated_after_confirm is not None
    assert set(results.profile["ranking_predicted_tokens_per_s"]) == names
    assert results.decision is not None
    assert results.decision.queue  # the workload records arrivals
    assert check_manifest_file(tmp_path / "manifest.yaml") == []
    # Beside the manifest: its vLLM arguments as a `vllm serve --config` file, when the winner runs on vLLM.
    vllm = yaml.safe_load((tmp_path / "manifest.yaml").read_text())["serving"]["vllm"]
    assert (tmp_path / "manifest.vllm.yaml").is_file() == vllm["supported"]
    if vllm["supported"]:
        assert vllm["args"][:2] == ["--model", str(tiny_models[0])]
        assert yaml.safe_load((tmp_path / "manifest.vllm.yaml").read_text())["model"] == str(tiny_models[0])
    assert (Path(results.config["runs_root"]) / results.run_id / "cost_model.json").is_file()


def test_optimize_table_output(
    runner: CliRunner, tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    result = _invoke(runner, _args(tiny_models, tiny_workload, tmp_path, "--methods", "ngram", "--confirm", "1"))
    assert result.exit_code == 0, result.output
    assert "ngram-n2-k2" in result.stdout
    assert "Keep the baseline" in result.stdout or "Use ngram-n2-k2" in result.stdout
    assert "Manifest written to" in result.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--priority", "fastest"], "unknown priority"),
        (["--strategy", "random"], "--strategy random"),
        (["--lookahead", "0"], "--lookahead 0: must be >= 1"),
        (["--methods", "magic"], "unknown method"),
        (["--exit-layers", "9"], "the target has 4 layers"),
        (["--percentile", "p42"], "--percentile p42"),
        (["--repeats", "0"], "--repeats 0: must be >= 1"),
        (["--repeats", "lots"], "--repeats lots: expected auto or a whole number"),
        (["--target", "no/such-model-here"], "not in the local Hugging Face cache"),
    ],
)
def test_bad_input_exits_2(
    runner: CliRunner,
    tiny_models: tuple[Path, Path],
    tiny_workload: Path,
    tmp_path: Path,
    extra: list[str],
    message: str,
) -> None:
    result = runner.invoke(app, _args(tiny_models, tiny_workload, tmp_path, *extra))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "manifest.yaml").exists()


def test_missing_workload_exits_2(runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path) -> None:
    result = runner.invoke(app, _args(tiny_models, tmp_path / "nope.jsonl", tmp_path))
    assert result.exit_code == 2, result.output
    assert "nope.jsonl" in result.output


def test_impossible_ttft_exits_3_without_manifest(
    runner: CliRunner, tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    args = _args(tiny_models, tiny_workload, tmp_path, "--methods", "ngram", "--confirm", "1")
    result = runner.invoke(app, [*args, "--max-ttft-ms", "0.001"])
    assert result.exit_code == 3, result.output
    assert "no variant satisfies the constraints" in result.output
    assert not (tmp_path / "manifest.yaml").exists()
    results = load_results(next((tmp_path / "runs").glob("*/results.json")))
    assert results.status == "no_feasible"


def test_require_speedup_exits_4_when_the_baseline_wins(
    runner: CliRunner, tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    # No variant can be 1000x faster: the baseline wins and the gate fails.
    args = _args(tiny_models, tiny_workload, tmp_path, "--methods", "ngram", "--confirm", "1")
    result = runner.invoke(app, [*args, "--min-speedup", "1000", "--require-speedup"])
    assert result.exit_code == 4, result.output
    assert "--require-speedup" in result.output
    assert check_manifest_file(tmp_path / "manifest.yaml") == []  # the manifest is still written
    results = load_results(next((tmp_path / "runs").glob("*/results.json")))
    assert results.decision is not None
    assert results.decision.winner == "baseline"


@pytest.mark.parametrize("interrupt_after", [1, 12])  # 1: in the baseline pass; 12: in confirmation
def test_resume_after_interruption_finishes_without_redoing_work(
    interrupt_after: int,
    runner: CliRunner,
    tiny_models: tuple[Path, Path],
    tiny_workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, str, int]] = []
    original = HFEngine.generate
    limit = {"n": interrupt_after}

    def counting(self: HFEngine, request: Any, variant: Any, *, max_tokens: int, repeat: int = 0) -> Any:
        if max_tokens > 8 and len(calls) >= limit["n"]:  # warm-ups (8 tokens) are never interrupted
            raise KeyboardInterrupt
        record = original(self, request, variant, max_tokens=max_tokens, repeat=repeat)
        if max_tokens > 8:
            calls.append((variant.name, request.id, repeat))
        return record

    monkeypatch.setattr(HFEngine, "generate", counting)
    args = _args(tiny_models, tiny_workload, tmp_path, "--confirm", "2", "--run-dir", str(tmp_path / "run"))
    first = runner.invoke(app, args)
    assert first.exit_code == 130, first.output
    partial = load_results(tmp_path / "run" / "results.json")
    assert partial.status == "interrupted"
    done_before = list(calls)
    measured_before = {(v.name, r.request_id, r.repeat): r.e2e_s for v in partial.variants for r in v.measured_requests}
    assert partial.phase == ("plan" if interrupt_after == 1 else "predict")
    assert partial.phases_done[-1] == partial.phase
    assert len(partial.profile.get("baseline", [])) == min(interrupt_after, len(TINY_WORKLOAD))
    assert bool(measured_before) == (interrupt_after == 12)

    limit["n"] = 10**6
    calls.clear()
    second = runner.invoke(app, ["optimize", "--resume", str(tmp_path / "run"), "--out", str(tmp_path / "m.yaml")])
    assert second.exit_code == 0, second.output
    final = load_results(tmp_path / "run" / "results.json")
    assert final.status == "complete"
    # Nothing finished before the interruption was timed again: every timed generation of the whole run
    # (baseline pass, method calibration, confirmation) happened exactly once across the two invocations.
    timed_in_results = (
        len(final.profile["baseline"])
        + len(final.profile["calibration"])
        + sum(len(v.measured_requests) for v in final.variants)
    )
    assert len(done_before) + len(calls) == timed_in_results
    assert calls  # the resume did the rest
    measured_after = {(v.name, r.request_id, r.repeat): r.e2e_s for v in final.variants for r in v.measured_requests}
    assert all(measured_after[key] == value for key, value in measured_before.items())
    confirmed = [v for v in final.variants if v.confirmed]
    assert len(confirmed) == 3
    assert all(len(v.measured_requests) == len(TINY_WORKLOAD) for v in confirmed)
    assert check_manifest_file(tmp_path / "m.yaml") == []


def test_resume_of_unknown_run_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["optimize", "--resume", "no-such-run", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "--resume no-such-run" in result.output


def test_inflated_cached_cost_model_is_measured_again(
    runner: CliRunner, tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    """Cost samples cached on a busy machine (slower than the measured baseline) are measured again once."""
    import os

    args = _args(tiny_models, tiny_workload, tmp_path, "--methods", "ngram", "--confirm", "1")
    first = runner.invoke(app, [*args, "--run-dir", str(tmp_path / "r1")])
    assert first.exit_code == 0, first.output
    cache = Path(os.environ["RUNINFRA_OPT_CACHE"]) / "costmodels"
    files = list(cache.glob("*.json"))
    assert files
    for path in files:
        entry = json.loads(path.read_text())
        for samples in entry["roles"].values():
            for sample in samples:
                sample["seconds"] *= 1000.0
        path.write_text(json.dumps(entry))
    second = runner.invoke(app, [*args, "--run-dir", str(tmp_path / "r2")])
    assert second.exit_code == 0, second.output
    results = load_results(tmp_path / "r2" / "results.json")
    assert any("measured it again" in note.text for note in results.notes)
    costs = results.cost_model.in_process
    assert costs is not None
    assert costs.baseline_prediction_error is not None
    assert costs.baseline_prediction_error < 0.30


def test_exhaustive_times_every_variant(
    runner: CliRunner, tiny_models: tuple[Path, Path], tiny_workload: Path, tmp_path: Path
) -> None:
    args = _args(tiny_models, tiny_workload, tmp_path, "--strategy", "exhaustive", "--run-dir", str(tmp_path / "ex"))
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    results = load_results(tmp_path / "ex" / "results.json")
    assert all(v.confirmed and v.measured is not None for v in results.variants)
    assert len(predicted_vs_measured(results)) == len(results.variants) == 4
    # The exhaustive run checks the predictor that predictive ships: the same per-method calibration.
    calibrated = {c["variant"] for c in results.profile["calibration"]}
    assert calibrated == {"ngram-n2-k2", "early_exit-l2-k2", "draft:tiny-draft-k2"}
    costs = results.cost_model.in_process
    assert costs is not None
    assert costs.calibrated is not None
    assert set(costs.calibrated.round_overhead_s) == {"ngram", "early_exit", "draft"}
    # Prompt lookup's candidate search is measured on this CPU and charged per round.
    assert costs.fitted.search["ngram"].scan_s


def test_resume_of_a_run_with_an_older_results_schema_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    """A results file of schema 1 kept the plan in its config: `report` reads it, `--resume` refuses it."""
    from runinfra_opt.results import save_results
    from tests.report_fixtures import build_results

    old = build_results()
    old.schema_version = 1
    save_results(old, tmp_path / "old" / "results.json")
    result = runner.invoke(app, ["optimize", "--resume", str(tmp_path / "old"), "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "results schema 1" in result.output
    assert "start a new run" in result.output
    assert "Traceback" not in result.output
    shown = runner.invoke(app, ["report", str(tmp_path / "old")])
    assert shown.exit_code == 0, shown.output
