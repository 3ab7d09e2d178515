"""When `.runinfra/runs/latest` moves (runinfra_opt/optimize/rundir.py): to every run made inside the runs directory,
never to a `--run-dir` elsewhere, which says so on stderr; `report` with no run shows `latest`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.results import load_results

REQUEST = {"id": "r1", "category": "echo", "prompt": "abc abc abc abc", "max_tokens": 12}


def _optimize(runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path, *extra: str) -> str:
    workload = tmp_path / "one.jsonl"
    workload.write_text(json.dumps(REQUEST) + "\n", encoding="utf-8")
    args = [
        "optimize", "--workload", str(workload), "--target", str(tiny_models[0]), "--methods", "ngram",
        "--lookahead", "2", "--ngram-max", "1", "--confirm", "1", "--repeats", "1", "--threads", "1",
        "--out", str(tmp_path / "m.yaml"), *extra,
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stderr


def _latest_run_id(runner: CliRunner, runs: str) -> str:
    result = runner.invoke(app, ["report", "--format", "json", "--runs-dir", runs])
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["run_id"])


def test_latest_moves_only_for_runs_inside_the_runs_directory(
    runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    # The default runs directory, relative to the working directory (the test's own).
    stderr = _optimize(runner, tiny_models, tmp_path)
    assert "left as it is" not in stderr
    runs = Path(".runinfra/runs")
    (first,) = [p for p in runs.iterdir() if p.name != "latest"]
    assert (runs / "latest").resolve() == first.resolve()
    assert _latest_run_id(runner, str(runs)) == first.name

    # A --run-dir elsewhere: `latest` stays, and the run says so and how to report it.
    elsewhere = tmp_path / "ci-workspace" / "run"
    stderr = _optimize(runner, tiny_models, tmp_path, "--run-dir", str(elsewhere))
    assert f"--run-dir {elsewhere} lies outside the runs directory .runinfra/runs" in stderr
    assert f"runinfra-opt report {elsewhere}" in stderr
    assert load_results(elsewhere / "results.json").status == "complete"
    assert (runs / "latest").resolve() == first.resolve()
    assert _latest_run_id(runner, str(runs)) == first.name

    # A --run-dir inside the runs directory is a run of the project: it becomes `latest`.
    inside = runs / "nightly"
    stderr = _optimize(runner, tiny_models, tmp_path, "--run-dir", str(inside))
    assert "left as it is" not in stderr
    assert (runs / "latest").resolve() == inside.resolve()
    assert _latest_run_id(runner, str(runs)) == "nightly"
