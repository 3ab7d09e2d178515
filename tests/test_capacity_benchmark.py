"""`benchmarks/capacity_search.py` end to end on the stand-in server (tests/fake_vllm, its table engine): the
search, then the dense sweep on the baseline's server with several runs pooled near the knee, and the one-run
sweep read from the same runs, so that a long run on a quiet machine cannot fail at its end. (Figures on the
stand-in mean nothing; the sweep's rule and the summary's arithmetic are checked.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_runs import run_benchmark
from tests.test_capacity import SCALE, _rows, table_server  # noqa: F401 (a fixture)


@pytest.mark.quiet
@pytest.mark.usefixtures("table_server")  # the stand-in's table engine, as tests/test_capacity.py prices it
def test_benchmark_sweeps_near_the_knee_with_pooled_runs(
    fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(_rows())
    run_benchmark(
        "capacity_search.py",
        "--workload", str(workload),
        "--target", str(tiny_models[0]),
        "--vllm-python", fake_vllm,
        "--requests", "12",
        "--capacity-requests", "8",
        "--max-tokens", "16",
        "--slo-ttft-ms", f"{1000 * SCALE:g}",
        "--slo-tpot-ms", f"{60 * SCALE:g}",
        "--from", "0.75", "--to", "1.25", "--step", "0.25",
        "--runs-near-knee", "2", "--near", "1",
        "--out-dir", str(tmp_path / "out"),
    )  # fmt: skip
    kept = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert kept["benchmark"] == "benchmarks/capacity_search.py"
    figures = kept["figures"]
    assert set(figures["variants"]) >= {"baseline"}
    for name, row in figures["variants"].items():
        assert row["predicted_at_search"] is not None, name
        assert row["measured"] is not None, name
    sweep = figures["sweep"]
    knee = sweep["search_knee"]
    assert knee == figures["variants"]["baseline"]["measured"]["value"]
    levels = sweep["levels"]
    rates = [level["rate"] for level in levels]
    assert rates == sorted(rates)
    assert rates[0] == pytest.approx(0.75 * knee, rel=0.01)
    for level in levels:
        runs = len(level["attained"])
        if level["rate"] >= knee:  # from the knee up: two runs, pooled
            assert runs >= 2, level
        elif level["rate"] != sweep["knee"]:  # below it: one, or two where the first was unclear
            assert runs in (1, 2), level
    # the sweep's knee: the highest rate sustained (pooled) below its first miss, resting on two runs at least
    missed = [level["rate"] for level in levels if not level["passed"]]
    below = [level for level in levels if level["passed"] and (not missed or level["rate"] < min(missed))]
    assert sweep["knee"] == (below[-1]["rate"] if below else 0.0)
    assert sweep["first_missed"] == (min(missed) if missed else None)
    if below:
        assert len(below[-1]["attained"]) >= 2
    # the one-run sweep, read from the same runs: a rate offered, its knee one of them, its wall no more than theirs
    assert sweep["runs_near_knee"] == 2
    assert sweep["one_run_knee"] in [*rates, 0.0]
    if sweep["one_run_first_missed"] is not None:
        assert sweep["one_run_first_missed"] in rates
        assert sweep["one_run_knee"] < sweep["one_run_first_missed"]
    assert 0 < sweep["one_run_wall_s"] <= sum(level["wall_s"] for level in levels) + 0.1
    assert sweep["wall_ratio"] == pytest.approx(sweep["search_wall_s"] / sweep["one_run_wall_s"], rel=0.01)
