"""Each option is declared once (`runinfra_opt.options.Option`): `optimize`'s command-line parameters, its
`--print-config` keys, `OptimizeConfig`'s fields and defaults, and `bench`'s shared options all come from the
declarations, so that an option added to them is added everywhere."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from runinfra_opt.cli import bench as bench_cli
from runinfra_opt.cli.app import app, handle_errors
from runinfra_opt.cli.options import declared
from runinfra_opt.cli.settings import SETTINGS_OPTIONS, effective_settings, naming_the_file, settings_yaml
from runinfra_opt.engine import registry as engine_registry
from runinfra_opt.objective import Objective
from runinfra_opt.optimize import config as config_module
from runinfra_opt.optimize.config import DECLARED, NOT_OPTIONS, OptimizeConfig
from runinfra_opt.optimize.options import OPTIONS
from runinfra_opt.options import ENGINE_OPTIONS, OBJECTIVE, SHARED, WORKLOAD, Option, at_least


def _params(command_name: str) -> dict[str, Any]:
    command = get_command(app).commands[command_name]  # type: ignore[attr-defined]
    return {param.name: param for param in command.params if param.name != "help"}


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def test_the_command_line_is_the_declarations() -> None:
    params = _params("optimize")
    assert list(params) == [option.name for option in (*OPTIONS, *SETTINGS_OPTIONS)]
    for option in (*OPTIONS, *SETTINGS_OPTIONS):
        param = params[option.name]
        assert param.opts[0] == option.flag
        assert param.help == option.help
        assert param.rich_help_panel == option.panel
        assert _plain(param.default) == _plain(option.default), option.flag


def test_print_config_prints_every_declared_option_with_its_default(runner: CliRunner) -> None:
    result = runner.invoke(app, ["optimize", "--print-config"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.stdout)
    assert list(printed) == [option.key for option in OPTIONS]
    assert printed == {option.key: _plain(option.default) for option in OPTIONS}


def test_the_config_fields_are_the_declarations() -> None:
    config = OptimizeConfig()
    own = {option.config_field: option for option in OPTIONS if option.config_field}
    assert {f.name for f in fields(OptimizeConfig)} - NOT_OPTIONS == set(own)
    for name, option in own.items():
        assert getattr(config, name) == option.value(None), option.flag
    objective = {
        option.to.removeprefix(OBJECTIVE): option for option in OPTIONS if option.to and option.to.startswith(OBJECTIVE)
    }
    assert {f.name for f in fields(Objective)} == set(objective)
    for name, option in objective.items():
        assert getattr(config.objective, name) == option.value(None), option.flag
    engine_options = {option.name for option in OPTIONS if option.to == ENGINE_OPTIONS}
    classes = [engine_registry.options_class(engine) for engine in engine_registry.names()]
    assert engine_options == {name for cls in classes for name in cls.OPTIONS}
    # what results.json stores: the fields, the objective's flat beside them, the engine's options nested
    assert set(config.to_dict()) == set(own) | set(objective) | (NOT_OPTIONS - {"objective"})


def test_a_config_field_without_its_option_or_an_option_without_its_field_fails_at_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = Option("warmups", "--warmups", int, 2, "Warm-up requests.", WORKLOAD, check=at_least(0), to="warmups")
    monkeypatch.setattr(config_module, "OPTIONS", (extra,))

    class Missing:
        pass

    with pytest.raises(TypeError, match="--warmups fills it"):
        config_module._declared(Missing)

    @dataclass(frozen=True)
    @config_module._declared
    class Declared:
        warmups: int = DECLARED

    assert Declared().warmups == 2

    monkeypatch.setattr(config_module, "OPTIONS", ())

    class Stray:
        warmups: int = DECLARED

    with pytest.raises(TypeError, match="no option in optimize.options fills warmups"):
        config_module._declared(Stray)


def test_a_new_declaration_is_a_flag_a_config_key_and_a_printed_setting(runner: CliRunner, tmp_path: Path) -> None:
    extra = Option("warmups", "--warmups", int, 2, "Warm-up requests.", WORKLOAD, check=at_least(0), to="warmups")
    toy = typer.Typer(add_completion=False)

    @toy.command()
    @handle_errors
    @declared((extra, *SETTINGS_OPTIONS), context=True)
    def run(ctx: typer.Context, **options: Any) -> None:
        values, origins = effective_settings(ctx, options["config_file"])
        with naming_the_file(ctx.command, origins):
            extra.checked(values["warmups"])
        typer.echo(settings_yaml(ctx.command, values), nl=False)

    help_text = runner.invoke(toy, ["--help"], terminal_width=200).stdout
    assert "--warmups" in help_text
    assert "Warm-up requests." in help_text
    assert WORKLOAD in help_text
    assert yaml.safe_load(runner.invoke(toy, []).stdout) == {"warmups": 2}
    assert yaml.safe_load(runner.invoke(toy, ["--warmups", "5"]).stdout) == {"warmups": 5}
    path = tmp_path / "settings.yaml"
    path.write_text("warmups: -1\n", encoding="utf-8")
    result = runner.invoke(toy, ["--config", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {path}:1: key 'warmups': --warmups -1: must be >= 0"


def test_bench_declares_once_what_it_shares_with_optimize() -> None:
    optimize = {option.flag: option for option in OPTIONS}
    bench = {option.flag: option for option in bench_cli.OPTIONS}
    assert list(_params("bench")) == [option.name for option in bench_cli.OPTIONS]
    for shared in SHARED:  # the very same declaration in both commands
        assert optimize[shared.flag] is shared
        assert bench[shared.flag] is shared
    for flag in optimize.keys() & bench.keys():
        mine, theirs = optimize[flag], bench[flag]
        if mine is not theirs:  # two declarations of one flag: they must differ in what the user sees
            assert (mine.type, mine.default, mine.help) != (theirs.type, theirs.default, theirs.help), flag
