"""Draft models predicted on real vLLM (issue 40): `optimize --engine vllm` on the lab pair at its test size
(benchmarks/lab_pair.py: a deeper, slower SmolLM2 as the target, SmolLM2 itself as its draft) over a few short
requests. The draft's variant is predicted from the baseline's server, the draft's in-process profile and its own
step costs, launched as the one confirmed candidate, and measured faster than the baseline, as predicted.

Three launches, one at a time: the baseline, the draft alone (its step costs), the draft variant (beside the
baseline's). Needs the vLLM environment as tests/test_vllm_e2e.py does, whose fixtures it shares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_vllm_e2e import _loud, _no_bytecode, vllm_python  # noqa: F401 (fixtures)

pytestmark = pytest.mark.e2e

DTYPE = "float32"
"""As tests/test_vllm_e2e.py serves (one compiled graph cache): the in-process profile is float32 too."""
LOOKAHEAD = 3
REQUESTS = [
    "Summarize in one sentence: The city council voted on Tuesday to extend the library's opening hours to 9 pm on "
    "weekdays, starting next month, after a survey showed that most students study in the evening.",
    "Summarize in one sentence: A local bakery started delivering bread by bicycle this spring; the owner says "
    "deliveries are faster in the narrow streets of the old town and cost less than a van.",
    "Summarize in one sentence: The museum will close its east wing for three months to repair the roof, and the "
    "paintings there will be shown in the main hall in the meantime.",
]


@pytest.fixture(scope="module")
def lab_pair(tmp_path_factory: pytest.TempPathFactory, _session_models: Path) -> tuple[Path, Path]:
    """The lab pair at its test size, built from the session's converted SmolLM2."""
    from benchmarks.lab_pair import SMALL, build

    cache = tmp_path_factory.mktemp("lab-cache")
    (cache / "models").symlink_to(_session_models, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RUNINFRA_OPT_CACHE", str(cache))
        return build(tmp_path_factory.mktemp("lab-pair"), SMALL)


def test_a_draft_variant_is_predicted_launched_and_faster_than_the_baseline(
    vllm_python: str,  # noqa: F811 (the shared fixture)
    lab_pair: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from runinfra_opt.cli.app import app
    from runinfra_opt.report.answer import launches_line
    from runinfra_opt.results import load_results

    target, draft = lab_pair
    workload = tmp_path / "w.jsonl"
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": text}]} for i, text in enumerate(REQUESTS)]
    workload.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_dir = tmp_path / "run"
    args = ["optimize", "--engine", "vllm", "--vllm-python", vllm_python, "--target", str(target)]
    args += ["--draft", str(draft), "--methods", "draft", "--lookahead", f"2,{LOOKAHEAD}", "--dtype", DTYPE]
    args += ["--workload", str(workload), "--max-tokens", "24", "--load", "none", "--repeats", "1"]
    args += ["--confirm", "1", "--run-dir", str(run_dir), "--out", str(tmp_path / "m.yaml")]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    assert results.status == "complete"
    # predicted: both lookaheads, from the profile (agreement flags for every request) and the draft's own table
    role = f"draft:{draft}"
    assert set(results.profile["agreement"][role]) == {"r0", "r1", "r2"}
    assert results.cost_model["draft_step_costs"][role]["table"]["tokens"][-1] >= LOOKAHEAD + 1
    speculative = [v for v in results.variants if v.name != "baseline"]
    assert len(speculative) == 2
    assert all(v.predicted is not None for v in speculative)
    # launched: the baseline, the draft alone for its step costs, and only the best predicted variant
    launched = [launch["variant"] for launch in results.launches]
    assert launched[:2] == ["baseline", "draft-alone:draft"]
    assert len(launched) == 3
    ranking = results.profile["ranking_predicted_tokens_per_s"]  # the predictions the candidate was chosen by
    best = max(speculative, key=lambda v: ranking[v.name])
    assert launched[2] == best.name
    assert launches_line(results) == (
        "Servers: 3 launched (1 baseline, 1 candidate(s), 1 draft alone) for 3 variants; 2 speculative variant(s) "
        "predicted from the baseline's server."
    )
    # measured faster than the baseline (paired with it), lossless, and near its prediction (3 short requests)
    assert best.measured is not None
    assert best.disqualified is None
    assert best.measured.speedup is not None
    assert best.measured.speedup.value > 1.0
    assert best.predicted is not None
    assert best.predicted.tokens_per_s == pytest.approx(best.measured.tokens_per_s, rel=0.25)
