"""The engine registry: what each engine is (how to open it, its typed options, what it can do before it is
opened) and the one function that opens an engine from an `EngineSetup`.

Entries are lazy `"module:object"` strings (an engine's module imports its heavy libraries; `--help` must not).
Adding an engine means one module that implements `engine.protocol.Engine`, its options class (a frozen
`EngineOptions` subclass in a light module) and one entry in `BUILTIN` (or a `register` call). Code outside
`runinfra_opt/engine/` asks the registry what an engine can do; it never compares an engine's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from runinfra_opt.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.engine.protocol import Engine


@dataclass(frozen=True)
class EngineOptions:
    """An engine's own typed options, validated by the engine in `__post_init__` (its messages name the
    option). This base is an engine without options of its own (the transformers engine)."""

    OPTIONS: ClassVar[Mapping[str, str]] = {}
    """Command-line parameter name -> field name (e.g. `vllm_python` -> `python`): how `optimize`/`bench`
    options and old flat results files map onto the fields."""

    def opener_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the engine's opener takes from these options."""
        return {}

    @property
    def near_tie_nats(self) -> float | None:
        """A greedy divergence where the baseline's top two log-probabilities are this close is a near-tie
        (engines that report log-probabilities); None: by dtype (`records.TIE_TOLERANCES`)."""
        return None

    @property
    def pairs_baseline(self) -> bool:
        """Time each candidate beside the baseline's live server (engines with a server per variant)."""
        return False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineOptions:
        """Rebuild from results.json (unknown keys ignored: a newer file stays readable)."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass(frozen=True)
class EngineSpec:
    """What the registry knows about an engine without opening it."""

    opener: str | Callable[..., Engine]
    """`"module:function"` (imported on first use) or the function: `opener(target, drafts, *, device, dtype,
    threads, allow_tokenizer_mismatch, skip_too_long, on_load, log_dir, seed, **options.opener_kwargs())`."""
    options: str | type[EngineOptions] = EngineOptions
    """Its options class, as `"module:Class"` (a module that imports nothing heavy) or the class."""
    serves_load: bool = False
    """Serves many requests at once under load levels (`--load`)."""
    runs_in_trial: bool = False
    """Can be opened inside a Ray trial worker (`--executor ray`)."""


DEFAULT_ENGINE = "transformers"
BUILTIN: dict[str, EngineSpec] = {
    "transformers": EngineSpec("runinfra_opt.engine.hf.engine:open_engine", runs_in_trial=True),
    "vllm": EngineSpec(
        "runinfra_opt.engine.vllm.engine:open_engine", "runinfra_opt.engine.vllm.options:VllmOptions", serves_load=True
    ),
}

_extra: dict[str, EngineSpec] = {}


def register(
    name: str,
    opener: Callable[..., Engine],
    *,
    options: type[EngineOptions] = EngineOptions,
    serves_load: bool = False,
    runs_in_trial: bool = False,
) -> None:
    _extra[name] = EngineSpec(opener, options, serves_load=serves_load, runs_in_trial=runs_in_trial)


def unregister(name: str) -> None:
    _extra.pop(name, None)


def names() -> list[str]:
    return sorted(set(BUILTIN) | set(_extra))


def check(name: str) -> str:
    """`name` when it is a known engine, else UserInputError listing the known ones."""
    if name not in BUILTIN and name not in _extra:
        raise UserInputError(f"--engine {name}: unknown engine; available: {', '.join(names())}")
    return name


def spec(name: str) -> EngineSpec:
    return _extra.get(name) or BUILTIN[check(name)]


def _load(entry: str) -> Any:
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)


def options_class(name: str) -> type[EngineOptions]:
    entry = spec(name).options
    cls: type[EngineOptions] = _load(entry) if isinstance(entry, str) else entry
    return cls


def serving_engines() -> list[str]:
    """The engines that serve load levels."""
    return [name for name in names() if spec(name).serves_load]


def trial_engines() -> list[str]:
    """The engines a Ray trial can open."""
    return [name for name in names() if spec(name).runs_in_trial]


def _default(cls: type[EngineOptions], option: str) -> Any:
    return next(f.default for f in fields(cls) if f.name == cls.OPTIONS[option])


def engine_options(name: str, values: Mapping[str, Any]) -> EngineOptions:
    """The engine `name`'s typed options from command-line parameter values (`vllm_python`, ...). A value for
    another engine's option is an error unless it is that option's default, so an option left alone never
    gets in the way of another engine; the engine validates its own."""
    cls = options_class(check(name))
    for other in names():
        other_cls = options_class(other)
        for option in other_cls.OPTIONS:
            if option in cls.OPTIONS or option not in values or values[option] == _default(other_cls, option):
                continue
            flag = "--" + option.replace("_", "-")
            raise UserInputError(f"{flag} needs --engine {other} (the {name} engine does not take it)")
    return cls(**{attr: values[option] for option, attr in cls.OPTIONS.items() if option in values})


def options_from_record(name: str, data: Mapping[str, Any]) -> EngineOptions:
    """An engine's options from a recorded config: the nested `engine_options` of this version, and the flat
    command-line keys of older files (`vllm_python`, `tie_tolerance`, ...; those of other engines ignored), a
    flat key over a nested one."""
    cls = options_class(check(name))
    nested = data.get("engine_options")
    merged = dict(nested) if isinstance(nested, Mapping) else {}
    merged.update({attr: data[option] for option, attr in cls.OPTIONS.items() if option in data})
    return cls.from_dict(merged)


@dataclass(frozen=True)
class EngineSetup:
    """Everything that opens an engine: which one, over which models, on what device, with its own options.
    Picklable (a Ray trial opens the engine from it on its worker)."""

    engine: str = DEFAULT_ENGINE
    target: str = "default"
    drafts: tuple[str, ...] = ()
    options: EngineOptions = field(default_factory=EngineOptions)
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    allow_tokenizer_mismatch: bool = False
    skip_too_long: bool = False
    seed: int = 0

    @classmethod
    def of(cls, config: object, **overrides: Any) -> EngineSetup:
        """The setup a command's config names: each field from the config's attribute of the same name (`options`
        from its `engine_options`; one it lacks keeps its default), then `overrides`."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            attribute = "engine_options" if f.name == "options" else f.name
            if hasattr(config, attribute):
                values[f.name] = getattr(config, attribute)
        return cls(**(values | overrides))


def open_engine(
    setup: EngineSetup, *, on_load: Callable[[str], None] | None = None, log_dir: Path | None = None
) -> Engine:
    """Open the engine `setup` names; `on_load(label)` after each model, `log_dir` for a serving engine's
    server logs (None: the engine's default)."""
    entry = spec(setup.engine).opener
    opener: Callable[..., Engine] = _load(entry) if isinstance(entry, str) else entry
    return opener(
        setup.target,
        setup.drafts,
        device=setup.device,
        dtype=setup.dtype,
        threads=setup.threads,
        allow_tokenizer_mismatch=setup.allow_tokenizer_mismatch,
        skip_too_long=setup.skip_too_long,
        on_load=on_load,
        log_dir=log_dir,
        seed=setup.seed,
        **setup.options.opener_kwargs(),
    )
