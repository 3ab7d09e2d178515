"""The typed configuration of one `optimize` run: what the CLI parsed, validated, and what a resume restores."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from runinfra_opt.drafts import find_distilled_drafts
from runinfra_opt.engine import registry as engine_registry
from runinfra_opt.engine.registry import EngineOptions, EngineSetup
from runinfra_opt.errors import UserInputError
from runinfra_opt.load.spec import parse_load
from runinfra_opt.methods import registry as method_registry
from runinfra_opt.models import resolve_model
from runinfra_opt.objective import Objective
from runinfra_opt.optimize.options import OPTION, OPTIONS, Executor, Strategy
from runinfra_opt.optimize.space import SpaceSettings
from runinfra_opt.options import ENGINE_OPTIONS, OBJECTIVE

DECLARED: Any = object()
"""A config field's default: its option's (`optimize.options.OPTIONS`), set by `_declared`."""
NOT_OPTIONS = frozenset({"objective", "engine_options", "quick_cost"})
"""The fields no one option fills: the objective and the engine's options gather several, `quick_cost` is for
tests and benchmarks."""

_Config = TypeVar("_Config")


def _declared(cls: type[_Config]) -> type[_Config]:
    """Give each field an option fills (`Option.config_field`) that option's default; a field of an option that
    is missing or has a default of its own, or a `DECLARED` field that no option fills, fails at import."""
    for option in OPTIONS:
        name = option.config_field
        if name is None:
            continue
        if vars(cls).get(name) is not DECLARED:
            raise TypeError(f"{cls.__name__}.{name}: {option.flag} fills it; declare it `{name}: TYPE = DECLARED`")
        setattr(cls, name, option.value(None))
    stray = [name for name, value in vars(cls).items() if value is DECLARED]
    if stray:
        raise TypeError(f"{cls.__name__}: no option in optimize.options fills {', '.join(stray)}")
    return cls


def _flag(name: str) -> str:
    return OPTION[name].flag


@dataclass(frozen=True)
@_declared
class OptimizeConfig:
    """Everything that decides what an `optimize` run measures and how it picks. Stored in results.json."""

    objective: Objective = field(default_factory=Objective)
    """Priority, TTFT percentile, constraints and minimum speed-up (stored as flat keys: `to_dict`)."""
    workload: str | None = DECLARED
    """Bundled workload name or a file path; None: the default bundled workload."""
    workload_format: str | None = DECLARED
    target: str = DECLARED
    drafts: tuple[str, ...] = DECLARED
    engine: str = DECLARED
    """The engine that runs and measures (`engine.registry`)."""
    engine_options: EngineOptions = field(default_factory=EngineOptions)
    """The engine's own typed options (its class from the registry, e.g. the vllm engine's `VllmOptions`);
    the base `EngineOptions` given for an engine with its own class stands for that class's defaults."""
    methods: tuple[str, ...] | None = DECLARED
    """None: every method that applies (draft only with --draft)."""
    lookaheads: tuple[int, ...] | None = DECLARED
    """None: each method's default lookaheads (see `space`)."""
    ngram_max: tuple[int, ...] | None = DECLARED
    exit_layers: tuple[int, ...] | None = DECLARED
    strategy: Strategy = DECLARED
    confirm: int = DECLARED
    repeats: int | None = DECLARED
    """None (`--repeats auto`): 2 or 3 by budget, then more for the leading candidates until the decision is
    clear (`optimize.phases.extend`); an integer: exactly that many."""
    budget_minutes: float = DECLARED
    max_requests: int | None = DECLARED
    """Hard cap on requests used (after the budget plan), e.g. for tests and benchmarks."""
    max_tokens: int | None = DECLARED
    """Cap on output tokens per request (requests keep their own max_tokens when smaller)."""
    device: str = DECLARED
    dtype: str = DECLARED
    threads: int | None = DECLARED
    seed: int = DECLARED
    remeasure_cost: bool = DECLARED
    allow_tokenizer_mismatch: bool = DECLARED
    skip_too_long: bool = DECLARED
    run_dir: str | None = DECLARED
    out: str = DECLARED
    runs_root: str = DECLARED
    quick_cost: bool = False
    """Measure the cost model on fewer sizes (for tests and benchmarks on tiny models; not a CLI option)."""
    executor: Executor = DECLARED
    """Where confirmation trials run: `local` (in this process, interleaved) or `ray` (one Ray task per trial)."""
    ray_address: str | None = DECLARED
    """`--ray-address`: the cluster to join (None: start a local one); `ray` executor only."""
    trial_resources: str | None = DECLARED
    """`--trial-resources`, e.g. `num_cpus=4,num_gpus=1` (None: one GPU on CUDA, else --threads CPUs)."""
    max_retries: int = DECLARED
    """Times a trial whose worker or node died is submitted again before it is reported as failed."""
    load: str = DECLARED
    """`--load`: the load levels every measured variant is served under (engines with `serve_load`: vllm), e.g.
    `replay+concurrency:1,4,16`; `auto`: on vllm, the recorded arrivals (when the workload has them) plus a
    concurrency sweep sized to the requests (`optimize.underload.auto_levels`), on transformers nothing; `none`:
    batch 1 only."""
    time_scale: float = DECLARED
    """`--time-scale`: replay's gaps multiplied by this (0.5 replays twice as fast)."""
    burstiness: float = DECLARED
    """`--burstiness`: rate levels' gamma shape (1: Poisson)."""
    slo_ttft_ms: float | None = DECLARED
    slo_tpot_ms: float | None = DECLARED
    """`--slo-ttft-ms` / `--slo-tpot-ms`: the service levels goodput counts (under load), and capacity is held to."""
    slo_attainment: float = DECLARED
    """`--slo-attainment`: the share of requests that must meet every SLO at a rate one server sustains."""
    target_rate: float | None = DECLARED
    """`--target-rate`: the requests/s the deployment must serve (`--priority capacity`; None: the recorded
    traffic's peak rate, when the workload records arrivals)."""
    server_cost_per_hour: float | None = DECLARED
    """`--server-cost-per-hour`: one server's price, for the cost per hour and per million output tokens."""
    capacity_requests: int | None = DECLARED
    """`--capacity-requests`: requests each offered rate of a capacity search sends, the planned ones cycled
    (`load.cycle`; None: `optimize.capacity.DEFAULT_REQUESTS`, or the planned requests once when more)."""

    def __post_init__(self) -> None:
        self._check_engine()
        for option in OPTIONS:  # each option's own check, on its field's value
            if option.config_field:
                option.checked(getattr(self, option.config_field))
        if self.executor != "ray" and (self.ray_address is not None or self.trial_resources is not None):
            flag = _flag("ray_address" if self.ray_address is not None else "trial_resources")
            raise UserInputError(f"{flag} needs {_flag('executor')} ray")
        if self.executor == "ray" and not engine_registry.spec(self.engine).runs_in_trial:
            raise UserInputError(
                f"{_flag('executor')} ray runs the {' or '.join(engine_registry.trial_engines())} engine only "
                f"(the {self.engine} engine: {_flag('executor')} local)"
            )
        if self.methods is not None and "draft" in self.methods and not self.drafts:
            raise UserInputError(f"{_flag('methods')} draft needs at least one {_flag('draft')} model")
        self._check_load()
        method_registry.check_drafts(self.drafts)  # e.g. --draft eagle3:PATH: PATH/config.json must exist

    def _check_engine(self) -> None:
        cls = engine_registry.options_class(engine_registry.check(self.engine))
        if type(self.engine_options) is not cls:
            if type(self.engine_options) is not EngineOptions:
                raise UserInputError(
                    f"{_flag('engine')} {self.engine}: options of another engine "
                    f"({type(self.engine_options).__name__})"
                )
            object.__setattr__(self, "engine_options", cls())

    def _check_load(self) -> None:
        self._check_capacity()
        spec = self.load.strip().lower()
        if spec in ("auto", "none"):
            return
        parse_load(self.load, time_scale=self.time_scale, burstiness=self.burstiness, seed=self.seed)
        if not engine_registry.spec(self.engine).serves_load:
            raise UserInputError(
                f"{_flag('load')} {self.load}: the {self.engine} engine runs one request at a time; load levels "
                f"need a serving engine ({_serving()})"
            )

    def _check_capacity(self) -> None:
        capacity = f"{_flag('priority')} capacity"
        for name in ("target_rate", "server_cost_per_hour"):
            if getattr(self, name) is not None and not self.objective.on_capacity:
                raise UserInputError(f"{_flag(name)} needs {capacity}")
        if not self.objective.on_capacity:
            return
        if not engine_registry.spec(self.engine).serves_load:
            raise UserInputError(
                f"{capacity}: the {self.engine} engine runs one request at a time; the rate one server "
                f"sustains needs a serving engine ({_serving()})"
            )
        if self.slo_ttft_ms is None and self.slo_tpot_ms is None:
            raise UserInputError(
                f"{capacity} needs a service level: {_flag('slo_ttft_ms')} and/or {_flag('slo_tpot_ms')}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The stored form: every field under its own name, the objective's fields flat beside them (the keys
        results.json has always had, and the options' names)."""
        data = asdict(self)
        del data["objective"]
        data.update(self.objective.to_dict())
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        data["engine_options"] = self.engine_options.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizeConfig:
        """Rebuild from results.json (unknown keys ignored: a newer file stays readable; the flat engine options
        of older files, `vllm_python` and the like, are read into the engine's options). The objective is read
        from its flat keys, or from an `objective` mapping."""
        known = {f.name for f in fields(cls)} - {"engine_options", "objective"}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            kwargs[key] = tuple(value) if isinstance(value, list) else value
        nested = data.get("objective")
        kwargs["objective"] = Objective.from_dict(nested if isinstance(nested, dict) else data)
        engine = str(kwargs.get("engine") or engine_registry.DEFAULT_ENGINE)
        kwargs["engine_options"] = engine_registry.options_from_record(engine, data)
        return cls(**kwargs)

    @classmethod
    def from_options(cls, values: Mapping[str, Any], *, on_note: Callable[[str], None] | None = None) -> OptimizeConfig:
        """The config from `optimize`'s option values, keyed by parameter name (`optimize.options.OPTIONS`:
        `priority`, `vllm_python`, `draft`, `lookahead`, `runs_root`, ...; one missing or None takes its
        default), each parsed by its option. Without `--draft`, drafts distilled for the target in `drafts_dir`
        are used (`on_note` says which)."""
        given = {option.name: option.value(values.get(option.name)) for option in OPTIONS}
        engine = engine_registry.check(str(given["engine"]))
        kwargs: dict[str, Any] = {}
        objective: dict[str, Any] = {}
        for option in OPTIONS:
            if option.config_field:
                kwargs[option.config_field] = given[option.name]
            elif option.to is not None and option.to.startswith(OBJECTIVE):
                objective[option.to.removeprefix(OBJECTIVE)] = given[option.name]
        if not kwargs["drafts"] and (kwargs["methods"] is None or "draft" in kwargs["methods"]):
            drafts_dir = Path(given["drafts_dir"])
            kwargs["drafts"] = tuple(find_distilled_drafts(resolve_model(kwargs["target"]).sha256(), drafts_dir))
            if kwargs["drafts"] and on_note is not None:
                on_note(
                    f"using {len(kwargs['drafts'])} draft(s) distilled for this target, found in {drafts_dir}: "
                    + ", ".join(Path(d).name for d in kwargs["drafts"])
                )
        engine_values = {option.name: given[option.name] for option in OPTIONS if option.to == ENGINE_OPTIONS}
        kwargs.update(
            engine=engine,
            objective=Objective.parse(**objective),
            engine_options=engine_registry.engine_options(engine, engine_values),
        )
        return cls(**kwargs)

    def engine_setup(self, *, threads: int | None = None) -> EngineSetup:
        """What opens this run's engine (`threads`: a trial's own, else the run's)."""
        return EngineSetup.of(self, **({} if threads is None else {"threads": threads}))

    def space_settings(self) -> SpaceSettings:
        """What this run asks of the search space (`space.build_space`)."""
        return SpaceSettings(**{f.name: getattr(self, f.name) for f in fields(SpaceSettings)})

    def with_changes(self, **changes: Any) -> OptimizeConfig:
        return replace(self, **changes)

    @property
    def tie_tolerance(self) -> float | None:
        """The engine's near-tie tolerance in nats (`EngineOptions.near_tie_nats`)."""
        return self.engine_options.near_tie_nats

    @property
    def pair_baseline(self) -> bool:
        """Whether the engine's options ask to time each candidate beside the baseline's server."""
        return self.engine_options.pairs_baseline


def _serving() -> str:
    return " or ".join(f"{_flag('engine')} {name}" for name in engine_registry.serving_engines())
