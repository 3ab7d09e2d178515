"""`optimize --config FILE.yaml` and `--print-config`: every option as a YAML key, the command line over the
file, one-line errors (exit 2) naming the key and the file; the run records its settings. And the engine's
typed options: validated by the engine, carried by the config, read back from old flat results files."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.registry import EngineOptions, EngineSetup
from runinfra_opt.engine.vllm.options import VllmOptions
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.executors.trial import trial_specs
from runinfra_opt.results import load_results
from tests.test_optimize import tiny_workload as tiny_workload  # the fixture, reused

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "optimize.yaml"


def _printed(runner: CliRunner, *args: str) -> dict[str, object]:
    result = runner.invoke(app, ["optimize", *args, "--print-config"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert isinstance(data, dict)
    return data


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_print_config_without_a_file_lists_every_option_with_its_default(runner: CliRunner) -> None:
    data = _printed(runner)
    assert data["engine"] == "transformers"
    assert data["max-tokens"] is None
    assert data["pair-baseline"] is True
    assert data["lookahead"] == []
    assert "config" not in data
    assert "print-config" not in data


def test_file_keys_with_dashes_or_underscores_and_the_command_line_wins(runner: CliRunner, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "max_tokens: 24\nbudget-minutes: 3\nlookahead: [2, 4]\nmethods: ngram\npair_baseline: false\n"
        "require-speedup: yes\nrun-dir: somewhere\nengine: vllm\n",
    )
    data = _printed(runner, "--config", str(path), "--max-tokens", "9", "--lookahead", "8")
    assert data["max-tokens"] == 9  # typed on the command line: over the file
    assert data["lookahead"] == [8]
    assert data["budget-minutes"] == 3.0  # from the file
    assert data["methods"] == ["ngram"]  # a single value for a repeatable option
    assert data["pair-baseline"] is False
    assert data["require-speedup"] is True
    assert data["run-dir"] == "somewhere"


def test_printed_settings_round_trip(runner: CliRunner, tmp_path: Path) -> None:
    first = runner.invoke(
        app, ["optimize", "--config", str(EXAMPLE), "--max-tokens", "9", "--draft", "a", "--print-config"]
    )
    assert first.exit_code == 0, first.output
    path = _write(tmp_path, first.stdout)
    second = runner.invoke(app, ["optimize", "--config", str(path), "--print-config"])
    assert second.exit_code == 0, second.output
    assert second.stdout == first.stdout


def test_the_example_prints(runner: CliRunner) -> None:
    data = _printed(runner, "--config", str(EXAMPLE))
    assert data["workload"] == "mixed"
    assert data["priority"] == "throughput"
    assert data["methods"] == ["ngram", "early_exit"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_tokens: 24\nmax-token: 3\n", "settings.yaml:2: unknown key 'max-token' (did you mean 'max-tokens'?)"),
        ("confirm: many\n", "settings.yaml:1: key 'confirm': Invalid value for '--confirm'"),
        ("threads: [1, 2]\n", "settings.yaml:1: key 'threads': expected a single value, not a list"),
        ("max-tokens: 3\nmax_tokens: 4\n", "settings.yaml:2: key 'max_tokens': max-tokens is given twice"),
        ("- a\n- b\n", "settings.yaml: expected a mapping of option names to values"),
        ("a: [\n", "settings.yaml:2: not valid YAML"),
        # a value the option takes but the run refuses: checked before anything prints, blamed on the file's line
        ("budget-minutes: 5\nmax_tokens: -3\n", "settings.yaml:2: key 'max_tokens': --max-tokens -3: must be >= 1"),
        ("lookahead: [2, 0]\n", "settings.yaml:1: key 'lookahead': --lookahead 0: must be >= 1"),
        ("executor: local\nray-address: auto\n", "settings.yaml:2: key 'ray-address': --ray-address needs --executor"),
    ],
)
def test_a_bad_file_exits_2_with_one_line(runner: CliRunner, tmp_path: Path, text: str, message: str) -> None:
    result = runner.invoke(app, ["optimize", "--config", str(_write(tmp_path, text)), "--print-config"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "Traceback" not in result.output


def test_a_bad_value_typed_on_the_command_line_is_not_blamed_on_the_file(runner: CliRunner, tmp_path: Path) -> None:
    path = _write(tmp_path, "max-tokens: 24\nconfirm: 2\n")
    result = runner.invoke(app, ["optimize", "--config", str(path), "--max-tokens", "0", "--print-config"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "error: --max-tokens 0: must be >= 1"


def test_a_missing_file_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["optimize", "--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2, result.output
    assert f"--config {tmp_path / 'nope.yaml'}: cannot read it" in result.output


def test_the_example_runs_with_flags_that_keep_it_fast(
    runner: CliRunner,
    tiny_models: tuple[Path, Path],
    tiny_workload: Path,
    tmp_path: Path,
) -> None:
    args = ["optimize", "--config", str(EXAMPLE), "--workload", str(tiny_workload), "--target", str(tiny_models[0])]
    args += ["--methods", "ngram", "--lookahead", "2", "--ngram-max", "2", "--max-tokens", "8", "--confirm", "1"]
    args += [
        "--repeats",
        "1",
        "--threads",
        "1",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--run-dir",
        str(tmp_path / "run"),
    ]
    args += ["--out", str(tmp_path / "manifest.yaml"), "--json"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = load_results(tmp_path / "run" / "results.json")
    assert results.status == "complete"
    assert results.config["max_ttft_regression"] == 0.10  # from the file
    assert results.config["max_tokens"] == 8  # from the command line
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text(encoding="utf-8"))
    assert recorded["max-ttft-regression"] == 0.10
    assert recorded["max-tokens"] == 8
    assert recorded["methods"] == ["ngram"]
    # The recorded settings, fed back, are the same settings.
    again = _printed(runner, "--config", str(tmp_path / "run" / "config.yaml"))
    assert again == recorded


def test_an_option_of_another_engine_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["optimize", "--vllm-python", "/x/python", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--vllm-python needs --engine vllm" in result.output
    result = runner.invoke(app, ["optimize", "--no-pair-baseline", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--pair-baseline needs --engine vllm" in result.output
    result = runner.invoke(app, ["optimize", "--vllm-serve-args=--enforce-eager", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--vllm-serve-args needs --engine vllm" in result.output


def test_the_vllm_engine_validates_its_options() -> None:
    with pytest.raises(UserInputError, match="--tie-tolerance -1: must be >= 0"):
        VllmOptions(tie_tolerance=-1)
    with pytest.raises(UserInputError, match="--vllm-serve-args: --port is set by runinfra-opt"):
        VllmOptions(serve_args="--enforce-eager --port=9000")
    with pytest.raises(UserInputError, match="--vllm-serve-args: --speculative-config is set by runinfra-opt"):
        VllmOptions(serve_args="--speculative-config {}")
    with pytest.raises(UserInputError, match="--vllm-serve-args '--x \"y': No closing quotation"):
        VllmOptions(serve_args='--x "y')
    with pytest.raises(UserInputError, match="--vllm-serve-args: --max-num-seqs is given twice"):
        VllmOptions(serve_args="--max-num-seqs 8 --max-num-seqs=16")
    with pytest.raises(UserInputError, match="--vllm-serve-args: 'eager' is not an option"):
        VllmOptions(serve_args="eager")
    assert VllmOptions(serve_args="--enforce-eager --max-num-seqs 8").opener_kwargs() == {
        "serve_args": ("--enforce-eager", "--max-num-seqs", "8")
    }
    with pytest.raises(UserInputError, match="--executor ray runs the transformers engine only"):
        OptimizeConfig(engine="vllm", executor="ray")
    with pytest.raises(UserInputError, match="load levels need a serving engine \\(--engine vllm\\)"):
        OptimizeConfig(load="concurrency:1,4")


def test_the_config_carries_the_engine_and_its_typed_options() -> None:
    config = OptimizeConfig(engine="vllm", engine_options=VllmOptions(python="/v/python", tie_tolerance=0.1))
    assert config.tie_tolerance == 0.1
    assert config.pair_baseline is True
    setup = config.engine_setup()
    assert setup == EngineSetup(engine="vllm", options=VllmOptions(python="/v/python", tie_tolerance=0.1))
    assert setup.options.opener_kwargs() == {"vllm_python": "/v/python"}
    data = config.to_dict()
    assert data["engine_options"] == {
        "python": "/v/python",
        "serve_args": None,
        "pair_baseline": True,
        "tie_tolerance": 0.1,
    }
    assert OptimizeConfig.from_dict(data) == config
    # An engine without options of its own, and a config naming vllm with no options: its defaults.
    assert OptimizeConfig().engine_options == EngineOptions()
    assert OptimizeConfig(engine="vllm").engine_options == VllmOptions()
    assert OptimizeConfig().engine_setup(threads=3).threads == 3


def test_old_flat_results_still_load() -> None:
    old = {"engine": "vllm", "vllm_python": "/v/python", "pair_baseline": False, "tie_tolerance": None, "seed": 2}
    config = OptimizeConfig.from_dict(old)
    assert config.engine_options == VllmOptions(python="/v/python", pair_baseline=False)
    assert config.pair_baseline is False
    old_transformers = {"engine": "transformers", "vllm_python": None, "pair_baseline": True, "tie_tolerance": 0.3}
    assert OptimizeConfig.from_dict(old_transformers).engine_options == EngineOptions()


def test_a_trial_opens_the_engine_as_the_run_does() -> None:
    config = OptimizeConfig(executor="ray", seed=5, threads=2, allow_tokenizer_mismatch=True)
    state = SimpleNamespace(
        config=config, baseline_records=dict, plan=SimpleNamespace(repeats=2), requests=[], max_tokens=8
    )
    (spec,) = trial_specs(state, [BASELINE], threads=3)  # type: ignore[arg-type]
    assert spec.setup == config.engine_setup(threads=3)
    assert (spec.setup.seed, spec.setup.threads, spec.setup.allow_tokenizer_mismatch) == (5, 3, True)


def test_bench_rejects_an_option_of_another_engine(runner: CliRunner) -> None:
    result = runner.invoke(app, ["bench", "--method", "baseline", "--tie-tolerance", "0.1"])
    assert result.exit_code == 2, result.output
    assert "--tie-tolerance needs --engine vllm" in result.output
