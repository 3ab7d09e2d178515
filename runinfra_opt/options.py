"""Command-line options declared once: the flag, its type, default, help, help panel and check, and where its
value goes in a command's typed config. A command's parameters (`cli.options.declared`), its `--config` keys
and `--print-config` lines (`cli.settings`, from the parameters) and its config's fields and checks (e.g.
`optimize.config.OptimizeConfig`) all follow from these declarations.

This module holds the declaration type, the help panels, the checks, and the options that several commands
take with the same flag, type, help and check (`SHARED`); a command's own options live beside its config.
Nothing heavy is imported: `--help` reads these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runinfra_opt.engine.registry import DEFAULT_ENGINE
from runinfra_opt.errors import UserInputError

WORKLOAD = "Workload"
SPACE = "Search space"
ENGINE = "Engine"
LOAD = "Load and SLOs"
DECISION = "Decision"
BUDGET = "Budget and outputs"
CLUSTER = "Cluster"

Check = Callable[[str, Any], None]
"""`check(flag, value)`: raise `UserInputError` with one line naming the flag when the value is bad."""
Parse = Callable[[str, Any], Any]
"""`parse(flag, value)`: the config's value from the command line's (e.g. `--lookahead 2,4` -> `(2, 4)`)."""

ENGINE_OPTIONS = "engine_options"
"""`Option.to` of an engine's own option: it reaches the engine's typed options (`EngineOptions.OPTIONS`)."""
OBJECTIVE = "objective."
"""`Option.to` prefix of an option that is a field of the run's `Objective` (`objective.priority`)."""


@dataclass(frozen=True)
class Option:
    """One command-line option."""

    name: str
    """The parameter's name: the key of its value (`max_tokens`)."""
    flags: str
    """Its long name(s) as the command line takes them: `--max-tokens`, `--pair-baseline/--no-pair-baseline`."""
    type: Any
    """Its command-line type (`int | None`, `list[str]` for a repeatable option)."""
    default: Any
    help: str
    panel: str
    check: Check | None = None
    """Checks the config's value (after `parse`; None, an option not given, is not checked); the rules that
    relate two options live in the config."""
    parse: Parse | None = None
    to: str | None = None
    """Where the value goes in the command's config: a field name, `objective.FIELD`, `engine_options`; None:
    the command alone uses it (`--resume`, `--json`)."""

    @property
    def flag(self) -> str:
        """The name errors and `--config` keys use: the first long name."""
        return self.flags.split("/")[0]

    @property
    def config_field(self) -> str | None:
        """The config field this option fills alone (None: the command's alone, part of the objective, or one of
        the engine's options)."""
        if self.to is None or self.to == ENGINE_OPTIONS or self.to.startswith(OBJECTIVE):
            return None
        return self.to

    @property
    def key(self) -> str:
        """Its `--config` key (the flag without its dashes)."""
        return self.flag.removeprefix("--")

    def value(self, given: Any) -> Any:
        """The config's value from the command line's (None: the default's)."""
        value = self.default if given is None else given
        return self.parse(self.flag, value) if self.parse is not None else value

    def checked(self, value: Any) -> None:
        if self.check is not None and value is not None:
            self.check(self.flag, value)


def by_name(options: Iterable[Option]) -> dict[str, Option]:
    return {option.name: option for option in options}


# ---- checks ------------------------------------------------------------------------------------------------


def rule(ok: Callable[[Any], bool], problem: str, *, number: str = "") -> Check:
    """A check that a value satisfies `ok`, else `FLAG VALUE: PROBLEM` (`number`: the format
    the value is shown in, e.g. `g`)."""

    def check(flag: str, value: Any) -> None:
        if not ok(value):
            raise UserInputError(f"{flag} {value:{number}}: {problem}")

    return check


def at_least(minimum: int) -> Check:
    return rule(lambda value: value >= minimum, f"must be >= {minimum}")


def one_of(choices: Sequence[str]) -> Check:
    return rule(lambda value: value in choices, f"expected one of {', '.join(choices)}")


# ---- options several commands share ------------------------------------------------------------------------

TARGET = Option(
    "target", "--target", str, "default", "default, a model directory, a .gguf file or a hub id.", SPACE, to="target"
)
SKIP_TOO_LONG = Option(
    "skip_too_long",
    "--skip-too-long",
    bool,
    False,
    "Skip requests longer than the target's context instead of failing.",
    WORKLOAD,
    to="skip_too_long",
)
ALLOW_TOKENIZER_MISMATCH = Option(
    "allow_tokenizer_mismatch",
    "--allow-tokenizer-mismatch",
    bool,
    False,
    "Run a draft with another tokenizer (universal assisted generation).",
    SPACE,
    to="allow_tokenizer_mismatch",
)
ENGINE_NAME = Option(
    "engine",
    "--engine",
    str,
    DEFAULT_ENGINE,
    "The engine that runs and measures: transformers (in-process) or vllm (a server per variant).",
    ENGINE,
    to="engine",
)
DEVICE = Option("device", "--device", str, "auto", "auto, cpu or cuda[:N].", ENGINE, to="device")
DTYPE = Option("dtype", "--dtype", str, "auto", "auto, float32, bfloat16 or float16.", ENGINE, to="dtype")
THREADS = Option(
    "threads",
    "--threads",
    int | None,
    None,
    "CPU threads for torch (default: torch's).",
    ENGINE,
    check=at_least(1),
    to="threads",
)
VLLM_PYTHON = Option(
    "vllm_python",
    "--vllm-python",
    str | None,
    None,
    "vllm: Python of an existing vLLM environment (default: `engine install vllm`'s).",
    ENGINE,
    to=ENGINE_OPTIONS,
)
VLLM_SERVE_ARGS = Option(
    "vllm_serve_args",
    "--vllm-serve-args",
    str | None,
    None,
    'vllm: further `vllm serve` arguments for every server, quoted as one string (e.g. "--enforce-eager").',
    ENGINE,
    to=ENGINE_OPTIONS,
)
TIE_TOLERANCE = Option(
    "tie_tolerance",
    "--tie-tolerance",
    float | None,
    None,
    "vllm, nats: a greedy divergence where the baseline's top two tokens are this close is a near-tie "
    "(default by dtype: bfloat16 0.25, float16 0.05, float32 0.01).",
    ENGINE,
    to=ENGINE_OPTIONS,
)

SHARED = (
    TARGET,
    SKIP_TOO_LONG,
    ALLOW_TOKENIZER_MISMATCH,
    ENGINE_NAME,
    DEVICE,
    DTYPE,
    THREADS,
    VLLM_PYTHON,
    VLLM_SERVE_ARGS,
    TIE_TOLERANCE,
)
"""The options `optimize` and `bench` both take, with the same flag, type, help and check."""
