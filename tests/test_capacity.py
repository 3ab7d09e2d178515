"""`--priority capacity`: the requests/s one server sustains within the SLOs, searched on the stand-in server
(tests/fake_vllm) and predicted by the serving predictor; the decision by servers needed; the option checks."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--priority", "capacity", "--slo-ttft-ms", "500"], "--priority capacity: the transformers engine runs one"),
        (["--priority", "capacity", "--engine", "vllm"], "--priority capacity needs a service level: --slo-ttft-ms"),
        (["--target-rate", "3"], "--target-rate needs --priority capacity"),
        (
            ["--priority", "capacity", "--engine", "vllm", "--slo-tpot-ms", "50", "--slo-attainment", "0"],
            "--slo-attainment 0: must be a share in (0, 1]",
        ),
        (
            ["--priority", "capacity", "--engine", "vllm", "--slo-tpot-ms", "50", "--server-cost-per-hour", "-1"],
            "--server-cost-per-hour -1: must be > 0",
        ),
    ],
)
def test_capacity_options_exit_2_with_one_line(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["optimize", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert message in lines[0], result.output
