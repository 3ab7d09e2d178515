"""The step-cost table: interpolation in tokens per sequence and in batch size, prefill, round trip."""

import pytest

from runinfra_opt.predict.steptable import StepCostTable


def table() -> StepCostTable:
    return StepCostTable(
        batch_sizes=(1, 4),
        tokens=(1, 3, 5),
        seconds=((0.010, 0.016, 0.014), (0.020, 0.040, 0.050)),
        prefill=((16, 0.05), (256, 0.45)),
        context=300,
        method="test",
    )


def test_measured_points_are_returned_as_measured():
    t = table()
    assert t.step_s(1, 3) == pytest.approx(0.016)
    assert t.step_s(4, 5) == pytest.approx(0.050)


def test_non_monotonic_in_tokens_is_kept_and_interpolated():
    t = table()
    assert t.step_s(1, 4) == pytest.approx(0.015)  # between 0.016 (3) and 0.014 (5): not a formula
    assert t.step_s(1, 2) == pytest.approx(0.013)


def test_monotone_pools_the_cells_a_row_falls_at_and_keeps_rising_rows():
    t = table()
    m = t.monotone()
    assert m.seconds[0] == pytest.approx((0.010, 0.015, 0.015))  # 0.016 then 0.014: both their mean
    assert m.seconds[1] == t.seconds[1]  # already rising: as measured
    assert (m.batch_sizes, m.tokens, m.prefill, m.context, m.method) == (
        t.batch_sizes, t.tokens, t.prefill, t.context, t.method,
    )  # fmt: skip
    assert m.step_s(1, 4) == pytest.approx(0.015)
    assert m.monotone() == m


def test_the_serving_predictor_prices_steps_with_the_monotone_table():
    from types import SimpleNamespace

    from runinfra_opt.optimize.serving import step_table
    from runinfra_opt.results import CostModelRecord

    costs = CostModelRecord.model_validate({"serving": {"step_costs": {"table": table().to_dict()}}})
    state = SimpleNamespace(results=SimpleNamespace(cost_model=costs))
    assert step_table(state) == table().monotone()  # type: ignore[arg-type]
    assert costs.serving is not None
    assert costs.serving.step_costs.table.model_dump() == table().to_dict()  # the measured cells are kept


def test_batch_sizes_between_and_beyond_are_linear():
    t = table()
    assert t.step_s(2, 1) == pytest.approx(0.010 + (0.020 - 0.010) / 3)
    assert t.step_s(7, 1) == pytest.approx(0.030)  # along the last segment
    with pytest.raises(ValueError, match="at least one sequence"):
        t.step_s(0, 1)


def test_prefill_points_and_fallback_to_steps():
    assert table().prefill_s(136) == pytest.approx(0.25)
    no_prefill = StepCostTable(batch_sizes=(1,), tokens=(1, 9), seconds=((0.01, 0.03),))
    assert no_prefill.prefill_s(5) == pytest.approx(0.02)


def test_round_trip():
    t = table()
    assert StepCostTable.from_dict(t.to_dict()) == t


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_sizes": (), "tokens": (1,), "seconds": ()}, "at least one"),
        ({"batch_sizes": (4, 1), "tokens": (1,), "seconds": ((1.0,), (1.0,))}, "ascending"),
        ({"batch_sizes": (1,), "tokens": (1, 2), "seconds": ((1.0,),)}, "one column"),
        ({"batch_sizes": (0,), "tokens": (1,), "seconds": ((1.0,),)}, "start at 1"),
    ],
)
def test_malformed_tables_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StepCostTable(**kwargs)
