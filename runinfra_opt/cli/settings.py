"""A command's settings as a YAML file: `--config FILE` reads one, `--print-config` writes one.

A key is an option's long name without its dashes, with `-` or `_` (`max-tokens: 24`, `max_tokens: 24`); a
repeatable option takes a list, a flag a boolean. Values go through the option's own conversion (typer's, as
for the command line), so the file and the command line accept the same things. Options typed on the command
line override the file (`ctx.get_parameter_source`). Errors name the key, the file and its line, and exit 2
like any bad input, and so does a value the file gives that the command then refuses (`naming_the_file`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
import yaml

from runinfra_opt.errors import UserInputError
from runinfra_opt.options import BUDGET, Option

CONFIG_FILE = Option(
    "config_file",
    "--config",
    Path | None,
    None,
    "A YAML file of settings: each option's long name as a key (`max-tokens: 24`); options given on the command "
    "line override it.",
    BUDGET,
)
PRINT_CONFIG = Option(
    "print_config",
    "--print-config",
    bool,
    False,
    "Check the effective settings, print them as --config YAML and exit.",
    BUDGET,
)
SETTINGS_OPTIONS = (CONFIG_FILE, PRINT_CONFIG)
"""The options that say where a command's settings come from or go (a command with them declares them last)."""
FILE_OPTIONS = frozenset(option.name for option in SETTINGS_OPTIONS)
"""Parameters that say where settings come from or go: never settings themselves."""
TYPED = frozenset({"COMMANDLINE", "ENVIRONMENT", "PROMPT"})
"""Parameter sources (click's `ParameterSource` names) of a value the user gave: these override the file."""
Command = Any
"""A click command as typer builds it (typer carries its own copy of click)."""
Parameter = Any


def _settings_params(command: Command) -> list[Parameter]:
    return [p for p in command.params if p.name not in FILE_OPTIONS and p.opts and p.opts[0].startswith("--")]


def key_of(param: Parameter) -> str:
    """The YAML key an option is written under: its first long name without the dashes."""
    return param.opts[0].removeprefix("--")


def _keys(command: Command) -> dict[str, Parameter]:
    keys: dict[str, Parameter] = {}
    for param in _settings_params(command):
        for opt in param.opts:
            if opt.startswith("--"):
                name = opt.removeprefix("--")
                keys[name] = keys[name.replace("-", "_")] = param
    return keys


def _lines(text: str) -> dict[str, int]:
    """Each top-level key's line in the file (1-based)."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(key.value): key.start_mark.line + 1 for key, _ in node.value}


def read_settings(path: Path, ctx: typer.Context) -> dict[str, tuple[Any, str]]:
    """The settings in `path`, by parameter name: each value converted as the option converts its command-line
    value, and where the file gives it (`FILE:LINE: key 'KEY'`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserInputError(f"--config {path}: cannot read it ({reason})") from None
    try:
        data = yaml.safe_load(text)
        lines = _lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserInputError(f"{where}: not valid YAML ({problem})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: expected a mapping of option names to values (e.g. `max-tokens: 24`)")
    keys = _keys(ctx.command)
    out: dict[str, tuple[Any, str]] = {}
    for key, value in data.items():
        where = f"{path}:{lines[str(key)]}" if str(key) in lines else str(path)
        param = keys.get(str(key))
        if param is None or param.name is None:
            close = difflib.get_close_matches(str(key), [key_of(p) for p in _settings_params(ctx.command)], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserInputError(f"{where}: unknown key {key!r}{hint}; the keys are the options of --help")
        if param.name in out:
            raise UserInputError(f"{where}: key {key!r}: {key_of(param)} is given twice")
        at = f"{where}: key {key!r}"
        out[param.name] = (_convert(param, value, ctx, at), at)
    return out


def _convert(param: Parameter, value: Any, ctx: typer.Context, where: str) -> Any:
    if value is None:
        return () if param.multiple else None
    if param.multiple and not isinstance(value, list):
        value = [value]
    if isinstance(value, (dict, list)) and not param.multiple:
        raise UserInputError(f"{where}: expected a single value, not a {type(value).__name__}")
    if param.multiple and any(isinstance(item, (dict, list)) for item in value):
        raise UserInputError(f"{where}: expected a list of single values")
    try:
        return param.process_value(ctx, value)
    except typer.BadParameter as exc:
        raise UserInputError(f"{where}: {exc.format_message()}") from None


def effective_settings(ctx: typer.Context, config_file: Path | None) -> tuple[dict[str, Any], dict[str, str]]:
    """(the command's option values (`ctx.params`) with the file's settings under them: an option typed on the
    command line wins over the file, the file over the option's default; where the file gives each value it
    supplied, by parameter name, for `naming_the_file`)."""
    values = {name: value for name, value in ctx.params.items() if name not in FILE_OPTIONS}
    if config_file is None:
        return values, {}
    origins: dict[str, str] = {}
    for name, (value, where) in read_settings(config_file, ctx).items():
        source = ctx.get_parameter_source(name)
        if source is None or source.name not in TYPED:
            values[name], origins[name] = value, where
    return values, origins


@contextmanager
def naming_the_file(command: Command, origins: Mapping[str, str]) -> Iterator[None]:
    """Bad input that names an option (`--max-tokens -3: must be >= 1`) whose value the settings file gave is
    reported at the file's line: `settings.yaml:2: key 'max_tokens': --max-tokens -3: must be >= 1`."""
    try:
        yield
    except UserInputError as exc:
        message = str(exc)
        for param in _settings_params(command):
            if param.name in origins and any(
                message.startswith((f"{opt} ", f"{opt}:")) for opt in param.opts if opt.startswith("--")
            ):
                exc.args = (f"{origins[param.name]}: {message}",)
                break
        raise


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):  # a list option given as text (`--lookahead 2,4`) prints its numbers bare
        return [int(item) if isinstance(item, str) and item.isdigit() else _plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def settings_yaml(command: Command, values: Mapping[str, Any]) -> str:
    """`values` as the YAML `--config` reads, one key per option in the order of `--help`."""
    data = {key_of(p): _plain(values.get(p.name)) for p in _settings_params(command) if p.name is not None}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
