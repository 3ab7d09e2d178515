"""The typed configuration of one `optimize` run: what the CLI parsed, validated, and what a resume restores."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from runinfra_opt.engine import registry as engine_registry
from runinfra_opt.errors import UserInputError
from runinfra_opt.load.spec import check_burstiness, check_time_scale, parse_load
from runinfra_opt.methods import get_method
from runinfra_opt.methods import registry as method_registry
from runinfra_opt.objective import Objective

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
    engine: str = "transformers"
    """The engine that runs and measures (`engine.registry`)."""
    vllm_python: str | None = None
    """`--vllm-python`: the python of a vLLM environment the user already has (vllm engine only)."""
    tie_tolerance: float | None = None
    """`--tie-tolerance` (nats): a greedy divergence where the baseline's top two candidates were this close is
    a numerical near-tie, reported but not disqualifying (engines that report log-probabilities: vllm). None: by
    the engine's dtype (`records.TIE_TOLERANCES`)."""
    methods: tuple[str, ...] | None = None
    """None: every method that applies (draft only with --draft)."""
    lookaheads: tuple[int, ...] | None = None
    """None: each method's default lookaheads (see `space`)."""
    ngram_max: tuple[int, ...] | None = None
    exit_layers: tuple[int, ...] | None = None
    strategy: Strategy = "predictive"
    confirm: int = DEFAULT_CONFIRM
    pair_baseline: bool = True
    """`--pair-baseline`: on an engine that times a server per variant and can keep the baseline's up beside a
    candidate's (vllm on CPU), time each candidate beside the baseline, requests alternating between the two;
    `--no-pair-baseline`: one server at a time, each variant against the baseline's own repeats."""
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
    out: str = "runinfra-manifest.yaml"
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
    """`--slo-ttft-ms` / `--slo-tpot-ms`: the service levels goodput counts (under load)."""

    def __post_init__(self) -> None:
        engine_registry.check(self.engine)
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
        if self.vllm_python is not None and self.engine != "vllm":
            raise UserInputError("--vllm-python needs --engine vllm")
        if self.tie_tolerance is not None and self.tie_tolerance < 0:
            raise UserInputError(f"--tie-tolerance {self.tie_tolerance}: must be >= 0 (0: only exact ties)")
        if self.engine == "vllm" and self.executor == "ray":
            raise UserInputError("--executor ray runs the transformers engine only (the vllm engine: --executor local)")
        if self.max_retries < 0:
            raise UserInputError(f"--max-retries {self.max_retries}: must be >= 0")
        if self.methods is not None and "draft" in self.methods and not self.drafts:
            raise UserInputError("--methods draft needs at least one --draft model")
        self._check_load()
        method_registry.check_drafts(self.drafts)  # e.g. --draft eagle3:PATH: PATH/config.json must exist

    def _check_load(self) -> None:
        check_time_scale(self.time_scale)
        check_burstiness(self.burstiness)
        for option, value in (("--slo-ttft-ms", self.slo_ttft_ms), ("--slo-tpot-ms", self.slo_tpot_ms)):
            if value is not None and not value > 0:
                raise UserInputError(f"{option} {value:g}: must be > 0 (milliseconds)")
        spec = self.load.strip().lower()
        if spec in ("auto", "none"):
            return
        parse_load(self.load, time_scale=self.time_scale, burstiness=self.burstiness, seed=self.seed)
        if self.engine != "vllm":
            raise UserInputError(
                f"--load {self.load}: the {self.engine} engine runs one request at a time; load levels need a "
                "serving engine (--engine vllm)"
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
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OptimizeConfig:
        """Rebuild from results.json (unknown keys ignored: a newer file stays readable). The objective is read
        from its flat keys, or from an `objective` mapping."""
        known = {f.name for f in fields(cls)} - {"objective"}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            kwargs[key] = tuple(value) if isinstance(value, list) else value
        nested = data.get("objective")
        kwargs["objective"] = Objective.from_dict(nested if isinstance(nested, dict) else data)
        return cls(**kwargs)

    def with_changes(self, **changes: Any) -> OptimizeConfig:
        return replace(self, **changes)
