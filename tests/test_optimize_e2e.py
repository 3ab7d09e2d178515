"""`optimize` on the bundled SmolLM2 with a tiny budget: 2 requests, a handful of variants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.manifest import check_manifest_file
from runinfra_opt.report.summary import predicted_vs_measured
from runinfra_opt.results import load_results

# The bundled SmolLM2 converts once per session (conftest).
pytestmark = pytest.mark.usefixtures("shared_model_cache")


@pytest.mark.e2e
# It measures SmolLM2's cost table in its own (isolated) cache: a few minutes on a quiet 2-core machine, and
# several times that on a busy one, where the default 900 s limit cut it off.
@pytest.mark.timeout(1800)
def test_optimize_on_smollm2(runner: CliRunner, tmp_path: Path) -> None:
    args = [
        "optimize",
        "--priority",
        "throughput",
        "--workload",
        "mixed",
        "--max-requests",
        "2",
        # A budget far above what 2 short requests need, so that a busy machine (slow cost measurements) cannot
        # make the planner drop one of them.
        "--budget-minutes",
        "60",
        "--max-tokens",
        "16",
        "--methods",
        "ngram,early_exit",
        "--lookahead",
        "2,4",
        "--ngram-max",
        "2",
        "--exit-layers",
        "15",
        "--confirm",
        "2",
        "--repeats",
        "1",
        "--run-dir",
        str(tmp_path / "run"),
        "--out",
        str(tmp_path / "manifest.yaml"),
        "--json",
    ]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    decision = json.loads(result.stdout)["decision"]
    assert decision["winner"]
    results = load_results(tmp_path / "run" / "results.json")
    assert results.workload is not None
    assert results.workload.used_requests == 2
    assert results.workload.subsampled is not None
    assert len(results.variants) == 1 + 2 + 2
    confirmed = [v for v in results.variants if v.confirmed]
    # baseline + up to 2 candidates (a candidate that behaves exactly like a better one is skipped)
    assert 2 <= len(confirmed) <= 3
    for v in confirmed:
        assert v.measured is not None
        assert v.measured.lossless in (True, None)
        # The simulator's target passes equal the real ones on greedy requests.
        predicted = {r.request_id: r.target_passes for r in v.predicted_requests if r.greedy}
        assert {r.request_id: r.target_passes for r in v.measured_requests if r.greedy} == predicted
    assert len(predicted_vs_measured(results)) == len(confirmed)
    assert check_manifest_file(tmp_path / "manifest.yaml") == []
