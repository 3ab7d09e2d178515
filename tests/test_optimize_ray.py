"""`optimize --executor ray` on a real local Ray cluster (2 CPUs, loopback) with the tiny models and the
in-process engine: same structure and decisions as `--executor local`; a worker killed mid-trial is retried
and the run completes (or, with --max-retries 0, the trial is reported failed and the others go on); a driver
killed mid-run resumes without redoing the trials it had finished. Options are checked through the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.executors.ray_cluster import task_options
from runinfra_opt.optimize.executors.store import TRIALS_DIR, read_trials
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import RunResults, load_results
from runinfra_opt.stats import paired

ray = pytest.importorskip("ray")  # installed by `make install` (the [ray] extra)

WORKLOAD = [
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc abc", "max_tokens": 24},
    {"id": "echo-2", "category": "echo", "prompt": "hello hello hello hello", "max_tokens": 24},
    {"id": "chat-1", "category": "chat", "messages": [{"role": "user", "content": "tell me a story"}]},
]
SPECULATIVE = {"ngram-n2-k2", "early_exit-l2-k2"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster owned by this test process (2 CPUs, on loopback); its address for other drivers."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in WORKLOAD), encoding="utf-8")
    return path


def _args(tiny_models: tuple[Path, Path], workload: Path, run_dir: Path, *extra: str) -> list[str]:
    target, _ = tiny_models
    return [
        "optimize",
        "--workload",
        str(workload),
        "--target",
        str(target),
        "--methods",
        "ngram,early_exit",
        "--lookahead",
        "2",
        "--ngram-max",
        "2",
        "--exit-layers",
        "2",
        "--threads",
        "1",
        "--repeats",
        "2",
        "--confirm",
        "2",
        "--max-tokens",
        "24",
        "--min-speedup",
        "100",  # the decision does not hang on timing: no variant is 100x faster
        "--run-dir",
        str(run_dir),
        "--runs-dir",
        str(run_dir.parent / "runs"),
        "--out",
        str(run_dir.parent / f"{run_dir.name}.yaml"),
        *extra,
    ]


def _driver(args: list[str]) -> tuple[subprocess.Popen[bytes], frozenset[int]]:
    """The CLI as a separate driver process (so that it can be killed), and the trial workers that were
    running before it started (not its own)."""
    before = frozenset(_trial_workers())
    return subprocess.Popen(
        [sys.executable, "-m", "runinfra_opt", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ), before


def _finish(driver: subprocess.Popen[bytes], timeout: float = 300.0) -> tuple[int, str]:
    """Wait for the driver; its exit code and stderr (pipes closed)."""
    _, err = driver.communicate(timeout=timeout)
    return driver.returncode, err.decode(errors="replace")


def _trial_workers(ignore: frozenset[int] = frozenset()) -> list[int]:
    """Pids of Ray workers running a trial now (Ray titles a busy worker `ray::<function>`), but those in
    `ignore` (an earlier test's worker that Ray is still stopping)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if title == b"ray::run_trial" and int(entry.name) not in ignore:
            pids.append(int(entry.name))
    return pids


def _wait_for(condition: Any, process: subprocess.Popen[bytes], timeout: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if process.poll() is not None:
            pytest.fail(f"the driver ended first: {_finish(process)[1]}")
        time.sleep(0.05)
    process.kill()
    _finish(process)
    pytest.fail("timed out")


def _shape(results: RunResults) -> dict[str, Any]:
    """What must not depend on the executor: phases, variants, what was confirmed, request ids per variant and
    repeat, pass counts, losslessness, the decision."""
    assert results.decision is not None
    return {
        "status": results.status,
        "phases": results.phases_done,
        # which variants were confirmed (their order follows predictions from timings taken in each run, and
        # two nearly tied candidates may swap under load)
        "confirm": sorted(results.plan.confirm or []) if results.plan else None,
        "variants": {
            v.name: (
                v.confirmed,
                v.disqualified,
                sorted((r.request_id, r.repeat, r.target_passes, r.lossless) for r in v.measured_requests),
                v.measured.lossless if v.measured else None,
                v.measured.speedup is not None if v.measured else None,
            )
            for v in results.variants
            if v.name != "baseline"
        },
        "winner": results.decision.winner,
        "reason": results.decision.reason.split(":")[0],
    }


def test_ray_results_have_the_local_structure_and_decisions(
    runner: CliRunner, cluster: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    local = runner.invoke(app, _args(tiny_models, workload, tmp_path / "local"), catch_exceptions=False)
    assert local.exit_code == 0, local.output
    on_ray = runner.invoke(
        app, _args(tiny_models, workload, tmp_path / "ray", "--executor", "ray"), catch_exceptions=False
    )
    assert on_ray.exit_code == 0, on_ray.output
    a, b = load_results(tmp_path / "local"), load_results(tmp_path / "ray")
    assert _shape(a) == _shape(b)
    assert a.decision is not None
    assert a.decision.winner == "baseline"
    assert a.trials == []
    assert all(r.trial is None for v in a.variants for r in v.measured_requests)
    # Pinned pairing: each variant's trial times its own baseline repeats, on one node.
    assert {t.id for t in b.trials} == SPECULATIVE
    baseline = b.variant("baseline")
    assert baseline is not None
    assert len(baseline.measured_requests) == len(SPECULATIVE) * len(WORKLOAD) * 2
    for trial in b.trials:
        assert trial.status == "done"
        assert trial.attempts == 1
        assert trial.node["host"]
        assert trial.node["cpu"]
        assert trial.node["ray_node_id"]
        variant = b.variant(trial.variant)
        assert variant is not None
        assert {r.trial for r in variant.measured_requests} == {trial.id}
        pairs = paired(variant.measured_requests, baseline.measured_requests)
        assert len(pairs) == len(variant.measured_requests)
        assert all(base.trial == trial.id for _, base in pairs)
    assert set(read_trials(tmp_path / "ray")) == SPECULATIVE
    assert any("confirmed on Ray" in note.text for note in b.notes)


def test_a_killed_worker_is_retried_and_the_run_completes(
    cluster: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = _args(tiny_models, workload, run_dir, "--executor", "ray", "--ray-address", cluster)
    driver, before = _driver([*args, "--trial-resources", "num_cpus=2", "--max-retries", "1"])  # one trial at a time
    victim = _wait_for(lambda: _trial_workers(before), driver)[0]
    time.sleep(1.0)  # mid-trial: the engine is loading or timing
    os.kill(victim, signal.SIGKILL)
    code, err = _finish(driver)
    assert code == 0, err
    results = load_results(run_dir)
    assert results.status == "complete"
    assert [t.status for t in results.trials] == ["done", "done"]
    retried = [t for t in results.trials if t.attempts == 2]
    assert len(retried) == 1
    assert "died" in retried[0].retried[0].lower() or "crash" in retried[0].retried[0].lower()


def test_a_trial_out_of_retries_fails_with_its_reason_and_the_others_go_on(
    cluster: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = _args(tiny_models, workload, run_dir, "--executor", "ray", "--ray-address", cluster)
    driver, before = _driver([*args, "--trial-resources", "num_cpus=2", "--max-retries", "0"])
    victim = _wait_for(lambda: _trial_workers(before), driver)[0]
    os.kill(victim, signal.SIGKILL)
    code, err = _finish(driver)
    assert code == 0, err
    results = load_results(run_dir)
    assert results.status == "complete"
    failed = [t for t in results.trials if t.status == "failed"]
    assert len(failed) == 1
    assert failed[0].attempts == 1
    assert failed[0].error
    assert any(note.text.startswith(f"trial {failed[0].id} failed after 1 attempt(s)") for note in results.notes)
    lost = results.variant(failed[0].variant)
    assert lost is not None
    assert not lost.confirmed
    assert not lost.measured_requests
    assert [t.status for t in results.trials if t.id != failed[0].id] == ["done"]


def test_a_killed_driver_resumes_without_redoing_finished_trials(
    runner: CliRunner, cluster: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = _args(tiny_models, workload, run_dir, "--executor", "ray", "--ray-address", cluster)
    driver, before = _driver([*args, "--trial-resources", "num_cpus=2"])  # one trial at a time
    trials = run_dir / TRIALS_DIR
    first = _wait_for(lambda: sorted(trials.glob("*.json")) if trials.is_dir() else [], driver)
    driver.send_signal(signal.SIGKILL)
    _finish(driver, 60)
    assert len(first) == 1
    finished = read_trials(run_dir)
    before = first[0].read_bytes()

    resumed = runner.invoke(
        app, [*args[:1], "--resume", str(run_dir), "--runs-dir", str(tmp_path / "runs")], catch_exceptions=False
    )
    assert resumed.exit_code == 0, resumed.output
    results = load_results(run_dir)
    assert results.status == "complete"
    assert first[0].read_bytes() == before  # not run again
    (done_id,) = finished
    by_id = {t.id: t for t in results.trials}
    assert set(by_id) == SPECULATIVE
    assert by_id[done_id].node["pid"] == finished[done_id].node["pid"]
    baseline = results.variant("baseline")
    assert baseline is not None
    assert len(baseline.measured_requests) == len(SPECULATIVE) * len(WORKLOAD) * 2  # nothing merged twice


def test_task_options_declare_resources() -> None:
    cpu = OptimizeConfig(executor="ray", threads=3)
    assert task_options(cpu, {"CPU": 8.0}) == {"max_retries": 0, "num_cpus": 3}
    assert task_options(OptimizeConfig(executor="ray"), {"CPU": 8.0, "GPU": 2.0}) == {
        "max_retries": 0,
        "num_gpus": 1,
        "num_cpus": 1,
    }
    custom = OptimizeConfig(executor="ray", trial_resources="num_cpus=4,num_gpus=0.5,memory=2e9,big_node=1")
    assert task_options(custom, {}) == {
        "max_retries": 0,
        "num_cpus": 4.0,
        "num_gpus": 0.5,
        "memory": 2_000_000_000,
        "resources": {"big_node": 1.0},
    }


def test_paired_records_pair_only_within_their_trial() -> None:
    def record(trial: str | None, e2e: float) -> RequestRecord:
        return RequestRecord(
            request_id="a", category="c", prompt_tokens=1, output_tokens=2, ttft_s=0.1, e2e_s=e2e, target_passes=2
        ).model_copy(update={"trial": trial})

    baseline = [record("x", 1.0), record("y", 2.0)]
    assert paired([record("y", 1.0)], baseline)[0][1].e2e_s == 2.0
    assert paired([record(None, 1.0)], [record(None, 3.0)])[0][1].e2e_s == 3.0
    assert paired([record("z", 1.0)], baseline) == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--ray-address", "auto"], "--ray-address needs --executor ray"),
        (["--executor", "spark"], "--executor spark: expected one of local, ray"),
        (["--executor", "ray", "--trial-resources", "num_cpus"], "--trial-resources num_cpus: expected NAME=AMOUNT"),
        (["--executor", "ray", "--trial-resources", "num_gpus=x"], "'x' is not a number"),
        (["--executor", "ray", "--max-retries", "-1"], "--max-retries -1: must be >= 0"),
    ],
)
def test_bad_executor_options_exit_2(
    runner: CliRunner, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    result = runner.invoke(app, _args(tiny_models, workload, tmp_path / "run", *extra))
    assert result.exit_code == 2
    assert message in result.output


def test_sigterm_on_the_driver_cancels_its_trials(
    cluster: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = _args(tiny_models, workload, run_dir, "--executor", "ray", "--ray-address", cluster)
    driver, before = _driver(args)
    running = _wait_for(lambda: _trial_workers(before), driver)
    driver.send_signal(signal.SIGTERM)
    code, err = _finish(driver, 120)
    assert code == 143, err
    results = load_results(run_dir)
    assert results.status == "interrupted"
    assert any("interrupted" in note.text for note in results.notes)
    deadline = time.monotonic() + 60
    while set(_trial_workers()) & set(running) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(_trial_workers()) & set(running)  # the trials' workers were stopped
