"""Run directories written before the cost model was typed (`results.cost`): one by each predictor, recorded at
e14cd7e (tests/fixtures/README.md). `report` renders them, `load_results` reads the flat dict into the typed record,
and `optimize --resume` continues them, predicting every variant again from the recorded costs as they were
predicted when the run was made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.results import CostModelRecord, RunResults, load_results

FIXTURES = Path(__file__).parent / "fixtures" / "results-before-typed-cost-model"
RECORDED_MODELS = "/tmp/pytest-of-root/pytest-2/tiny0"
"""Where the tiny models were when the runs were recorded (the draft's path is part of its variants' names)."""
RECORDED_ROOT = "/tmp/fixgen"


def _flat(kind: str) -> dict[str, object]:
    raw = json.loads((FIXTURES / kind / "results.json").read_text(encoding="utf-8"))
    cost_model = raw["cost_model"]
    assert isinstance(cost_model, dict)
    return cost_model


def test_the_in_process_predictors_flat_dict_reads_into_its_part() -> None:
    flat = _flat("in-process")
    results = load_results(FIXTURES / "in-process" / "results.json")
    costs = results.cost_model.in_process
    assert costs is not None
    assert results.cost_model.serving is None
    assert costs.fitted.model_dump() == flat["fitted"]
    assert costs.calibrated is not None
    assert costs.calibrated.model_dump() == flat["calibrated"]
    assert costs.calibrated_after_confirm is not None
    assert costs.calibrated_after_confirm.model_dump() == flat["calibrated_after_confirm"]
    assert [s.model_dump() for s in costs.samples] == flat["samples"]
    assert costs.provenance.model_dump() == flat["provenance"]
    assert (costs.baseline_prediction_error, costs.checked) == (flat["baseline_prediction_error"], flat["checked"])


def test_the_serving_predictors_flat_dict_reads_into_its_part() -> None:
    flat = _flat("serving")
    results = load_results(FIXTURES / "serving" / "results.json")
    costs = results.cost_model.serving
    assert costs is not None
    assert results.cost_model.in_process is None
    step_costs = flat["step_costs"]
    assert isinstance(step_costs, dict)
    assert costs.step_costs.table.model_dump() == step_costs["table"]
    assert [t.model_dump() for t in costs.step_costs.trials] == step_costs["trials"]
    for key in ("batch1_corrections", "capacity_corrections", "spec_overhead", "capacity_spec_overheads"):
        part = getattr(costs, key)
        assert part is not None, key
        recorded = flat[key]
        assert isinstance(recorded, dict)
        assert {k: v for k, v in part.model_dump().items() if k in recorded} == recorded, key
    # written back, it is the typed record (the flat dict's `kind` is the part's name now)
    again = RunResults.model_validate_json(results.model_dump_json())
    assert again.cost_model == results.cost_model


def test_a_draft_models_step_costs_read_into_the_serving_part() -> None:
    """No stand-in run measures a draft model's table (the real servers' test does: tests/test_vllm_e2e.py)."""
    step_costs = _flat("serving")["step_costs"]
    record = CostModelRecord.model_validate({"step_costs": step_costs, "kind": "serving step costs",
                                             "draft_step_costs": {"draft:d": step_costs}})  # fmt: skip
    assert record.serving is not None
    assert record.serving.draft_step_costs["draft:d"] == record.serving.step_costs
    assert CostModelRecord.model_validate({}) == CostModelRecord()  # no predictor ran


@pytest.mark.parametrize("kind", ["in-process", "serving"])
def test_report_renders_a_run_written_before_the_typed_cost_model(runner: CliRunner, kind: str) -> None:
    result = runner.invoke(app, ["report", str(FIXTURES / kind)])
    assert result.exit_code == 0, result.output
    winner = load_results(FIXTURES / kind / "results.json").decision
    assert winner is not None
    assert winner.winner.split("-")[0] in result.output


def _copy(kind: str, tmp_path: Path, models: Path) -> Path:
    """The fixture's run directory under `tmp_path`, its recorded paths moved to this session's (text: the draft's
    path is in variant names), without its predictions."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / kind, run)
    text = (run / "results.json").read_text(encoding="utf-8")
    text = text.replace(RECORDED_MODELS, str(models)).replace(f"{RECORDED_ROOT}/{kind}/run", str(run))
    text = text.replace(f"{RECORDED_ROOT}/{kind}/workload.jsonl", str(run / "workload.jsonl"))
    raw = json.loads(text.replace(RECORDED_ROOT, str(tmp_path)))
    for variant in raw["variants"]:  # the resumed run predicts them again (phases `predict` and `repredict`)
        variant["predicted_requests"], variant["load_predicted"] = [], []
        if variant.get("capacity"):
            variant["capacity"]["predicted"] = None
    (run / "results.json").write_text(json.dumps(raw), encoding="utf-8")
    return run


def _predicted(results: RunResults) -> dict[str, float]:
    """Every predicted figure of every variant: per request TTFT and end-to-end seconds, per load level output
    tokens/s, and the capacity (a variant by its place: a draft's path is in its name)."""
    out: dict[str, float] = {}
    for i, v in enumerate(results.variants):
        for r in v.predicted_requests:
            out[f"{i} {r.request_id} ttft"], out[f"{i} {r.request_id} e2e"] = r.ttft_s, r.e2e_s
        for level in v.load_predicted:
            tps = level.metrics.output_tokens_per_s
            out[f"{i} {level.level} tokens/s"] = tps.value if tps else -1.0
        if v.capacity is not None and v.capacity.predicted is not None:
            out[f"{i} capacity"] = v.capacity.predicted
    return out


def test_resume_reads_an_in_process_run_and_predicts_it_as_recorded(
    runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    run = _copy("in-process", tmp_path, tiny_models[0].parent)
    before, copied = load_results(FIXTURES / "in-process" / "results.json"), load_results(run / "results.json")
    result = runner.invoke(app, ["optimize", "--resume", str(run), "--out", str(tmp_path / "m.yaml")])
    assert result.exit_code == 0, result.output
    after = load_results(run / "results.json")
    assert after.status == "complete"
    assert after.cost_model == copied.cost_model  # `repredict` fits the same overheads to the same repeats
    assert _predicted(after) == pytest.approx(_predicted(before), rel=1e-9)
    assert after.decision is not None
    assert before.decision is not None
    assert after.decision.winner == before.decision.winner


@pytest.mark.quiet
def test_resume_reads_a_serving_run_and_predicts_it_as_recorded(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    run = _copy("serving", tmp_path, tiny_models[0].parent)
    raw = json.loads((run / "results.json").read_text(encoding="utf-8"))
    raw["config"]["vllm_python"] = fake_vllm
    (run / "results.json").write_text(json.dumps(raw), encoding="utf-8")
    before, copied = load_results(FIXTURES / "serving" / "results.json"), load_results(run / "results.json")
    result = runner.invoke(app, ["optimize", "--resume", str(run), "--out", str(tmp_path / "m.yaml")])
    assert result.exit_code == 0, result.output
    after = load_results(run / "results.json")
    assert after.status == "complete"
    assert after.cost_model == copied.cost_model
    predicted = _predicted(before)
    assert any(key.endswith("capacity") for key in predicted)
    assert any(key.endswith("tokens/s") for key in predicted)
    assert _predicted(after) == pytest.approx(predicted, rel=1e-9)
    assert after.decision is not None
    assert before.decision is not None
    assert after.decision.winner == before.decision.winner
