"""The typed configuration of one `optimize` run: what the CLI parsed, validated, and what a resume restores."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from runinfra_opt.drafts import DEFAULT_DRAFTS_DIR, find_distilled_drafts
from runinfra_opt.engine import registry as engine_registry
from runinfra_opt.engine.registry import EngineOptions, EngineSetup
from runinfra_opt.errors import UserInputError
from runinfra_opt.load.spec import check_burstiness, check_time_scale, parse_load
from runinfra_opt.methods import get_method
from runinfra_opt.methods import registry as method_registry
from runinfra_opt.models import resolve_model
from runinfra_opt.objective import DEFAULT_MIN_SPEEDUP, Objective
from runinfra_opt.results import DEFAULT_MANIFEST

Strategy = Literal["predictive", "exhaustive"]
Executor = Literal["local", "ray"]

STRATEGIES: tuple[Strategy, ...] = ("predictive", "exhaustive")
EXECUTORS: tuple[Executor, ...] = ("local", "ray")
DEFAULT_MAX_RETRIES = 2

DEFAULT_BUDGET_MINUTES = 7.0
"""Planned time for measuring (cost model, baseline, profiling, confirmation). With model loading and the
margins of the plan, `optimize --priority throughput` with no other argument ends in under 10 minutes on a
2-core CPU."""
DEFAULT_CONFIRM = 3
DEFAULT_RUNS_ROOT = Path(".runinfra") / "runs"
DEFAULT_SLO_ATTAINMENT = 0.99


def parse_methods(values: list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Methods from repeatable or comma-separated values; `baseline` is always measured and may be omitted."""
    if not values:
        return None
    out: list[str] = []
    for value in values:
        for item in value.split(","):
            name = item.strip().replace("-", "_")  # `early-exit` and `early_exit` both work
            if not name:
                continue
            try:
                get_method(name)
            except UserInputError as exc:
                raise UserInputError(f"--methods {item.strip()}: {exc}") from None
            if name not in out:
                out.append(name)
    return tuple(out) or None


def parse_repeats(value: str | int | None) -> int | None:
    """`--repeats auto` (None) or a whole number >= 1."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UserInputError(f"--repeats {value}: expected auto or a whole number >= 1") from None
    if number < 1:
        raise UserInputError(f"--repeats {value}: must be >= 1 (or auto)")
    return number


def parse_int_list(
    option: str, values: list[str] | tuple[str, ...] | None, *, minimum: int = 1
) -> tuple[int, ...] | None:
    """Integers from repeatable or comma-separated values (`--lookahead 2,4 --lookahead 8`)."""
    if not values:
        return None
    out: list[int] = []
    for value in values:
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            try:
                number = int(item)
            except ValueError:
                raise UserInputError(f"{option} {item}: expected an integer") from None
            if number < minimum:
                raise UserInputError(f"{option} {number}: must be >= {minimum}")
            if number not in out:
                out.append(number)
    return tuple(sorted(out)) or None


RAY_OPTIONS = ("num_cpus", "num_gpus", "memory")
"""`--trial-resources` keys that are Ray task options; any other key names a custom Ray resource."""


def parse_trial_resources(value: str) -> dict[str, float]:
    """`num_cpus=4,num_gpus=1,memory=8e9,my_resource=1` to a dict of amounts (checked: names, numbers >= 0)."""
    out: dict[str, float] = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, amount = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserInputError(f"--trial-resources {item}: expected NAME=AMOUNT (e.g. num_cpus=4,num_gpus=1)")
        try:
            number = float(amount)
        except ValueError:
            raise UserInputError(f"--trial-resources {item}: {amount.strip()!r} is not a number") from None
        if number < 0:
            raise UserInputError(f"--trial-resources {item}: must be >= 0")
        out[name] = number
    if not out:
        raise UserInputError("--trial-resources: empty (e.g. num_cpus=4,num_gpus=1)")
    return out


@dataclass(frozen=True)
class OptimizeConfig:
    """Everything that decides what an `optimize` run measures and how it picks. Stored in results.json."""

    objective: Objective = field(default_factory=Objective)
    """Priority, TTFT percentile, constraints and minimum speed-up (stored as flat keys: `to_dict`)."""
    workload: str | None = None
    """Bundled workload name or a file path; None: the default bundled workload."""
    workload_format: str | None = None
    target: str = "default"
    drafts: tuple[str, ...] = ()
    engine: str = engine_registry.DEFAULT_ENGINE
    """The engine that runs and measures (`engine.registry`)."""
    engine_options: EngineOptions = field(default_factory=EngineOptions)
    """The engine's own typed options (its class from the registry, e.g. the vllm engine's `VllmOptions`);
    the base `EngineOptions` given for an engine with its own class stands for that class's defaults."""
    methods: tuple[str, ...] | None = None
    """None: every method that applies (draft only with --draft)."""
    lookaheads: tuple[int, ...] | None = None
    """None: each method's default lookaheads (see `space`)."""
    ngram_max: tuple[int, ...] | None = None
    exit_layers: tuple[int, ...] | None = None
    strategy: Strategy = "predictive"
    confirm: int = DEFAULT_CONFIRM
    repeats: int | None = None
    """None (`--repeats auto`): 2 or 3 by budget, then more for the leading candidates until the decision is
    clear (`optimize.phases.extend`); an integer: exactly that many."""
    budget_minutes: float = DEFAULT_BUDGET_MINUTES
    max_requests: int | None = None
    """Hard cap on requests used (after the budget plan), e.g. for tests and benchmarks."""
    max_tokens: int | None = None
    """Cap on output tokens per request (requests keep their own max_tokens when smaller)."""
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    seed: int = 0
    remeasure_cost: bool = False
    allow_tokenizer_mismatch: bool = False
    skip_too_long: bool = False
    run_dir: str | None = None
    out: str = DEFAULT_MANIFEST
    runs_root: str = str(DEFAULT_RUNS_ROOT)
    quick_cost: bool = False
    """Measure the cost model on fewer sizes (for tests and benchmarks on tiny models; not a CLI option)."""
    executor: Executor = "local"
    """Where confirmation trials run: `local` (in this process, interleaved) or `ray` (one Ray task per trial)."""
    ray_address: str | None = None
    """`--ray-address`: the cluster to join (None: start a local one); `ray` executor only."""
    trial_resources: str | None = None
    """`--trial-resources`, e.g. `num_cpus=4,num_gpus=1` (None: one GPU on CUDA, else --threads CPUs)."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """Times a trial whose worker or node died is submitted again before it is reported as failed."""
    load: str = "auto"
    """`--load`: the load levels every measured variant is served under (engines with `serve_load`: vllm), e.g.
    `replay+concurrency:1,4,16`; `auto`: on vllm, the recorded arrivals (when the workload has them) plus a
    concurrency sweep sized to the requests (`optimize.underload.auto_levels`), on transformers nothing; `none`:
    batch 1 only."""
    time_scale: float = 1.0
    """`--time-scale`: replay's gaps multiplied by this (0.5 replays twice as fast)."""
    burstiness: float = 1.0
    """`--burstiness`: rate levels' gamma shape (1: Poisson)."""
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    """`--slo-ttft-ms` / `--slo-tpot-ms`: the service levels goodput counts (under load), and capacity is held to."""
    slo_attainment: float = DEFAULT_SLO_ATTAINMENT
    """`--slo-attainment`: the share of requests that must meet every SLO at a rate one server sustains."""
    target_rate: float | None = None
    """`--target-rate`: the requests/s the deployment must serve (`--priority capacity`; None: the recorded
    traffic's peak rate, when the workload records arrivals)."""
    server_cost_per_hour: float | None = None
    """`--server-cost-per-hour`: one server's price, for the cost per hour and per million output tokens."""
    capacity_requests: int | None = None
    """`--capacity-requests`: requests each offered rate of a capacity search sends, the planned ones cycled
    (`load.cycle`; None: `optimize.capacity.DEFAULT_REQUESTS`, or the planned requests once when more)."""

    def __post_init__(self) -> None:
        self._check_engine()
        if self.strategy not in STRATEGIES:
            raise UserInputError(f"--strategy {self.strategy}: expected one of {', '.join(STRATEGIES)}")
        if self.confirm < 1:
            raise UserInputError(f"--confirm {self.confirm}: must be >= 1")
        if self.repeats is not None and self.repeats < 1:
            raise UserInputError(f"--repeats {self.repeats}: must be >= 1")
        if self.budget_minutes <= 0:
            raise UserInputError(f"--budget-minutes {self.budget_minutes}: must be > 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UserInputError(f"--max-tokens {self.max_tokens}: must be >= 1")
        if self.max_requests is not None and self.max_requests < 1:
            raise UserInputError(f"--max-requests {self.max_requests}: must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise UserInputError(f"--threads {self.threads}: must be >= 1")
        if self.executor not in EXECUTORS:
            raise UserInputError(f"--executor {self.executor}: expected one of {', '.join(EXECUTORS)}")
        if self.executor != "ray" and (self.ray_address is not None or self.trial_resources is not None):
            option = "--ray-address" if self.ray_address is not None else "--trial-resources"
            raise UserInputError(f"{option} needs --executor ray")
        if self.trial_resources is not None:
            parse_trial_resources(self.trial_resources)
        if self.executor == "ray" and not engine_registry.spec(self.engine).runs_in_trial:
            raise UserInputError(
                f"--executor ray runs the {' or '.join(engine_registry.trial_engines())} engine only "
                f"(the {self.engine} engine: --executor local)"
            )
        if self.max_retries < 0:
            raise UserInputError(f"--max-retries {self.max_retries}: must be >= 0")
        if self.methods is not None and "draft" in self.methods and not self.drafts:
            raise UserInputError("--methods draft needs at least one --draft model")
        self._check_load()
        method_registry.check_drafts(self.drafts)  # e.g. --draft eagle3:PATH: PATH/config.json must exist

    def _check_engine(self) -> None:
        cls = engine_registry.options_class(engine_registry.check(self.engine))
        if type(self.engine_options) is not cls:
            if type(self.engine_options) is not EngineOptions:
                raise UserInputError(
                    f"--engine {self.engine}: options of another engine ({type(self.engine_options).__name__})"
                )
            object.__setattr__(self, "engine_options", cls())

    def _check_load(self) -> None:
        check_time_scale(self.time_scale)
        check_burstiness(self.burstiness)
        for option, value in (("--slo-ttft-ms", self.slo_ttft_ms), ("--slo-tpot-ms", self.slo_tpot_ms)):
            if value is not None and not value > 0:
                raise UserInputError(f"{option} {value:g}: must be > 0 (milliseconds)")
        self._check_capacity()
        spec = self.load.strip().lower()
        if spec in ("auto", "none"):
            return
        parse_load(self.load, time_scale=self.time_scale, burstiness=self.burstiness, seed=self.seed)
        if not engine_registry.spec(self.engine).serves_load:
            serving = " or ".join(f"--engine {name}" for name in engine_registry.serving_engines())
            raise UserInputError(
                f"--load {self.load}: the {self.engine} engine runs one request at a time; load levels need a "
                f"serving engine ({serving})"
            )

    def _check_capacity(self) -> None:
        if not 0 < self.slo_attainment <= 1:
            raise UserInputError(f"--slo-attainment {self.slo_attainment:g}: must be a share in (0, 1] (e.g. 0.99)")
        if self.capacity_requests is not None and self.capacity_requests < 1:
            raise UserInputError(f"--capacity-requests {self.capacity_requests}: must be at least 1")
        costs = (("--target-rate", self.target_rate), ("--server-cost-per-hour", self.server_cost_per_hour))
        for option, value in costs:
            if value is not None and not value > 0:
                raise UserInputError(f"{option} {value:g}: must be > 0")
            if value is not None and not self.objective.on_capacity:
                raise UserInputError(f"{option} needs --priority capacity")
        if not self.objective.on_capacity:
            return
        if not engine_registry.spec(self.engine).serves_load:
            serving = " or ".join(f"--engine {name}" for name in engine_registry.serving_engines())
            raise UserInputError(
                f"--priority capacity: the {self.engine} engine runs one request at a time; the rate one server "
                f"sustains needs a serving engine ({serving})"
            )
        if self.slo_ttft_ms is None and self.slo_tpot_ms is None:
            raise UserInputError("--priority capacity needs a service level: --slo-ttft-ms and/or --slo-tpot-ms")

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
        """The config from `optimize`'s option values, keyed by parameter name as the command declares them
        (`priority`, `vllm_python`, `draft`, `lookahead`, `runs_root`, ...; one missing takes the field's
        default). Without `--draft`, drafts distilled for the target in `drafts_dir` are used (`on_note` says
        which)."""
        def value(name: str, default: Any = None) -> Any:
            got = values.get(name)
            return default if got is None else got

        target = str(value("target", "default"))
        drafts = tuple(dict.fromkeys(value("draft", ())))
        methods = parse_methods(value("methods", ()))
        if not drafts and (methods is None or "draft" in methods):
            drafts_dir = Path(value("drafts_dir", DEFAULT_DRAFTS_DIR))
            drafts = tuple(find_distilled_drafts(resolve_model(target).sha256(), drafts_dir))
            if drafts and on_note is not None:
                on_note(
                    f"using {len(drafts)} draft(s) distilled for this target, found in {drafts_dir}: "
                    + ", ".join(Path(d).name for d in drafts)
                )
        engine = engine_registry.check(str(value("engine", engine_registry.DEFAULT_ENGINE)))
        kwargs: dict[str, Any] = {
            name: values[name] for name in {f.name for f in fields(cls)} & set(values) if values[name] is not None
        }
        kwargs.update(
            objective=Objective.parse(
                str(value("priority", "throughput")),
                str(value("percentile", "p95")),
                max_ttft_ms=values.get("max_ttft_ms"),
                max_ttft_regression=values.get("max_ttft_regression"),
                min_speedup=value("min_speedup", DEFAULT_MIN_SPEEDUP),
                require_speedup=bool(value("require_speedup", False)),
            ),
            target=target,
            drafts=drafts,
            methods=methods,
            lookaheads=parse_int_list("--lookahead", value("lookahead", ())),
            ngram_max=parse_int_list("--ngram-max", value("ngram_max", ())),
            exit_layers=parse_int_list("--exit-layers", value("exit_layers", ())),
            repeats=parse_repeats(value("repeats", "auto")),
            engine=engine,
            engine_options=engine_registry.engine_options(engine, values),
            run_dir=str(values["run_dir"]) if values.get("run_dir") else None,
            out=str(value("out", DEFAULT_MANIFEST)),
            runs_root=str(value("runs_root", DEFAULT_RUNS_ROOT)),
        )
        return cls(**kwargs)

    def engine_setup(self, *, threads: int | None = None) -> EngineSetup:
        """What opens this run's engine (`threads`: a trial's own, else the run's)."""
        return EngineSetup(
            engine=self.engine,
            target=self.target,
            drafts=self.drafts,
            options=self.engine_options,
            device=self.device,
            dtype=self.dtype,
            threads=self.threads if threads is None else threads,
            allow_tokenizer_mismatch=self.allow_tokenizer_mismatch,
            skip_too_long=self.skip_too_long,
            seed=self.seed,
        )

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
