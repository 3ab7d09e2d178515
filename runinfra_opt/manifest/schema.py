"""The manifest file: what it is (`API_VERSION`, `KIND`), its JSON Schema shipped in the package
(`schemas/manifest.schema.json`), and reading and checking a file against it: `validate_manifest` returns one
`field.path: problem` line per problem."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from runinfra_opt.errors import RuninfraError, UserInputError
from runinfra_opt.exitcodes import ExitCode

API_VERSION = "runinfra.dev/v1"
KIND = "ServingOptimization"


class ManifestInvalidError(RuninfraError):
    """A manifest built by runinfra-opt failed its own schema (a bug: exit 1)."""

    exit_code = ExitCode.INTERNAL


@cache
def manifest_schema() -> dict[str, Any]:
    """The manifest's JSON Schema, from the package data."""
    text = resources.files("runinfra_opt").joinpath("schemas/manifest.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _field_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _describe(error: Any) -> list[tuple[list[Any], str]]:
    """(field path, problem) pairs for one jsonschema error, pointing at the field itself where it can."""
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        return [([*path, name], "required field missing") for name in missing] or [(path, error.message)]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        return [([*path, name], "unknown field") for name in extra] or [(path, error.message)]
    if error.validator in {"oneOf", "anyOf"} and error.context:
        # A branch whose top-level type does not fit says nothing; errors inside a fitting branch do.
        informative = [
            e for e in error.context if e.validator not in {"type", "const"} or len(e.absolute_path) > len(path)
        ]
        if not informative:
            # Every branch wants another type: say which types would do.
            types: list[str] = []
            for e in error.context:
                wanted = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
                types += [str(t) for t in wanted if str(t) not in types]
            return [(path, f"{error.instance!r} is not of type {' or '.join(repr(t) for t in types)}")]
        # The branch that got furthest into the value.
        deepest = max(len(list(e.absolute_path)) for e in informative)
        return [pair for e in informative if len(list(e.absolute_path)) == deepest for pair in _describe(e)]
    return [(path, error.message)]


def validate_manifest(data: Any) -> list[str]:
    """Problems of `data` against the manifest schema, one `field.path: problem` line each (empty: valid).
    A missing required field is reported at its own path."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(manifest_schema())
    problems = {
        f"{_field_path(path)}: {message}" for error in validator.iter_errors(data) for path, message in _describe(error)
    }
    return sorted(problems)


def read_manifest(path: Path) -> Any:
    """Parse a manifest file (YAML, or JSON by its `.json` suffix). Unreadable or unparsable: UserInputError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"{path}: is a directory, not a manifest file") from None
    except UnicodeDecodeError:
        raise UserInputError(f"{path}: not a text file (not UTF-8)") from None
    except OSError as exc:
        raise UserInputError(f"{path}: cannot read: {exc.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserInputError(f"{path}{where}: invalid YAML: {problem}") from None


def check_manifest_file(path: Path) -> list[str]:
    """`FILE: field.path: problem` lines for a manifest file (empty: valid). Raises UserInputError when the file
    cannot be read or parsed."""
    data = read_manifest(path)
    if not isinstance(data, dict):
        return [f"{path}: (root): not a mapping (a manifest is a YAML/JSON object)"]
    return [f"{path}: {problem}" for problem in validate_manifest(data)]
