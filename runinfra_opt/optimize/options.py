"""The options of `optimize`, each declared once (`runinfra_opt.options.Option`): its flag, type, default,
help, panel and check, and the `OptimizeConfig` field it fills. The command's parameters, `--config` keys and
`--print-config` lines, and the config's fields, defaults and checks, all follow from `OPTIONS`; the order
is `--help`'s. The rules that relate two options (`--ray-address needs --executor ray`) are the config's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from runinfra_opt.drafts import DEFAULT_DRAFTS_DIR
from runinfra_opt.errors import UserInputError
from runinfra_opt.load.spec import check_burstiness, check_time_scale
from runinfra_opt.methods import get_method
from runinfra_opt.objective import DEFAULT_MIN_SPEEDUP
from runinfra_opt.options import (
    ALLOW_TOKENIZER_MISMATCH,
    BUDGET,
    CLUSTER,
    DECISION,
    DEVICE,
    DTYPE,
    ENGINE,
    ENGINE_NAME,
    ENGINE_OPTIONS,
    LOAD,
    SKIP_TOO_LONG,
    SPACE,
    TARGET,
    THREADS,
    TIE_TOLERANCE,
    VLLM_PYTHON,
    VLLM_SERVE_ARGS,
    WORKLOAD,
    Option,
    at_least,
    by_name,
    one_of,
    rule,
)
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


def _methods(flag: str, values: list[str]) -> tuple[str, ...] | None:
    return parse_methods(values)


def _repeats(flag: str, value: str) -> int | None:
    return parse_repeats(value)


def _drafts(flag: str, values: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def _path(flag: str, value: Path | str) -> str:
    return str(value)


def _path_or_none(flag: str, value: Path | str | None) -> str | None:
    return str(value) if value else None


def _trial_resources(flag: str, value: str) -> None:
    parse_trial_resources(value)


def _time_scale(flag: str, value: float) -> None:
    check_time_scale(value, flag)


def _burstiness(flag: str, value: float) -> None:
    check_burstiness(value, flag)


OPTIONS: tuple[Option, ...] = (
    # ---- workload
    Option(
        "workload",
        "--workload",
        str | None,
        None,
        "Bundled workload name or a workload file (default: the bundled `mixed`).",
        WORKLOAD,
        to="workload",
    ),
    Option(
        "workload_format",
        "--format",
        str | None,
        None,
        "Workload file format (default: by suffix).",
        WORKLOAD,
        to="workload_format",
    ),
    Option(
        "max_requests",
        "--max-requests",
        int | None,
        None,
        "Use at most N requests (after the plan).",
        WORKLOAD,
        check=at_least(1),
        to="max_requests",
    ),
    Option(
        "max_tokens",
        "--max-tokens",
        int | None,
        None,
        "Cap on new tokens per request (default: each request's own max_tokens).",
        WORKLOAD,
        check=at_least(1),
        to="max_tokens",
    ),
    SKIP_TOO_LONG,
    # ---- search space
    TARGET,
    Option(
        "draft",
        "--draft",
        list[str],
        [],
        "A draft model to consider (repeatable), or eagle3:PATH / eagle:PATH for an EAGLE-3 / EAGLE head. "
        "Default: the drafts distilled for the target in --drafts-dir.",
        SPACE,
        parse=_drafts,
        to="drafts",
    ),
    Option(
        "drafts_dir",
        "--drafts-dir",
        Path,
        DEFAULT_DRAFTS_DIR,
        "Where drafts made by `draft distill` are found when no --draft is given (only those for this target).",
        SPACE,
    ),
    Option(
        "methods",
        "--methods",
        list[str],
        [],
        "Methods: ngram, early_exit, draft, vllm_ngram, suffix, eagle, eagle3 (repeatable or comma-separated).",
        SPACE,
        parse=_methods,
        to="methods",
    ),
    Option(
        "lookahead",
        "--lookahead",
        list[str],
        [],
        "Lookaheads for every method, replacing the defaults (e.g. 2,4,8).",
        SPACE,
        parse=parse_int_list,
        to="lookaheads",
    ),
    Option(
        "ngram_max",
        "--ngram-max",
        list[str],
        [],
        "Prompt lookup max n-gram sizes (default 1,2,3).",
        SPACE,
        parse=parse_int_list,
        to="ngram_max",
    ),
    Option(
        "exit_layers",
        "--exit-layers",
        list[str],
        [],
        "Early-exit layers (default: L/4, L/2, 3L/4 of the target's L layers).",
        SPACE,
        parse=parse_int_list,
        to="exit_layers",
    ),
    ALLOW_TOKENIZER_MISMATCH,
    # ---- engine
    ENGINE_NAME,
    DEVICE,
    DTYPE,
    THREADS,
    VLLM_PYTHON,
    VLLM_SERVE_ARGS,
    Option(
        "pair_baseline",
        "--pair-baseline/--no-pair-baseline",
        bool,
        True,
        "vllm (CPU): time each candidate beside the baseline, requests alternating between the two servers.",
        ENGINE,
        to=ENGINE_OPTIONS,
    ),
    TIE_TOLERANCE,
    Option(
        "remeasure_cost",
        "--remeasure-cost",
        bool,
        False,
        "Measure forward costs again (no cache).",
        ENGINE,
        to="remeasure_cost",
    ),
    # ---- load and SLOs
    Option(
        "load",
        "--load",
        str,
        "auto",
        "Load levels each variant is served under (vllm): replay, concurrency:1,4,16, rate:0.5,2 joined with "
        "+; auto: replay (if the workload records arrivals) + a concurrency sweep; none: batch 1 only.",
        LOAD,
        to="load",
    ),
    Option(
        "time_scale",
        "--time-scale",
        float,
        1.0,
        "Replay: multiply the recorded gaps (0.5: 2x as fast).",
        LOAD,
        check=_time_scale,
        to="time_scale",
    ),
    Option(
        "burstiness",
        "--burstiness",
        float,
        1.0,
        "Rate levels: gamma shape of the gaps (1: Poisson).",
        LOAD,
        check=_burstiness,
        to="burstiness",
    ),
    Option(
        "slo_ttft_ms",
        "--slo-ttft-ms",
        float | None,
        None,
        "Under load: the TTFT goodput counts.",
        LOAD,
        check=rule(lambda value: value > 0, "must be > 0 (milliseconds)", number="g"),
        to="slo_ttft_ms",
    ),
    Option(
        "slo_tpot_ms",
        "--slo-tpot-ms",
        float | None,
        None,
        "Under load: the TPOT goodput counts.",
        LOAD,
        check=rule(lambda value: value > 0, "must be > 0 (milliseconds)", number="g"),
        to="slo_tpot_ms",
    ),
    Option(
        "slo_attainment",
        "--slo-attainment",
        float,
        DEFAULT_SLO_ATTAINMENT,
        "Share of requests that must meet every SLO at a sustained rate (capacity).",
        LOAD,
        check=rule(lambda value: 0 < value <= 1, "must be a share in (0, 1] (e.g. 0.99)", number="g"),
        to="slo_attainment",
    ),
    Option(
        "capacity_requests",
        "--capacity-requests",
        int | None,
        None,
        "Capacity: requests per offered rate, the sample cycled (default: 48, or the planned requests if more).",
        LOAD,
        check=rule(lambda value: value >= 1, "must be at least 1"),
        to="capacity_requests",
    ),
    # ---- decision
    Option(
        "target_rate",
        "--target-rate",
        float | None,
        None,
        "--priority capacity: requests/s to serve (default: the recorded peak rate).",
        DECISION,
        check=rule(lambda value: value > 0, "must be > 0", number="g"),
        to="target_rate",
    ),
    Option(
        "server_cost_per_hour",
        "--server-cost-per-hour",
        float | None,
        None,
        "--priority capacity: one server's price per hour (cost per hour and per million tokens).",
        DECISION,
        check=rule(lambda value: value > 0, "must be > 0", number="g"),
        to="server_cost_per_hour",
    ),
    Option(
        "priority",
        "--priority",
        str,
        "throughput",
        "throughput, ttft, first-token-latency (an alias of ttft) or capacity (requests/s per server at the "
        "SLOs; vllm).",
        DECISION,
        to="objective.priority",
    ),
    Option(
        "percentile",
        "--percentile",
        str,
        "p95",
        "TTFT percentile for --priority ttft: p50/p90/p95/p99.",
        DECISION,
        to="objective.percentile",
    ),
    Option(
        "max_ttft_ms",
        "--max-ttft-ms",
        float | None,
        None,
        "Rule out variants whose TTFT exceeds this.",
        DECISION,
        to="objective.max_ttft_ms",
    ),
    Option(
        "max_ttft_regression",
        "--max-ttft-regression",
        float | None,
        None,
        "Rule out variants whose TTFT exceeds the baseline's by this (0.10 = 10%).",
        DECISION,
        to="objective.max_ttft_regression",
    ),
    Option(
        "min_speedup",
        "--min-speedup",
        float,
        DEFAULT_MIN_SPEEDUP,
        "A speculative winner must be at least this much faster.",
        DECISION,
        to="objective.min_speedup",
    ),
    Option(
        "require_speedup",
        "--require-speedup",
        bool,
        False,
        "Exit 4 when the baseline wins (for CI gates).",
        DECISION,
        to="objective.require_speedup",
    ),
    Option(
        "strategy",
        "--strategy",
        str,
        "predictive",
        "predictive (profile, predict, confirm the best) or exhaustive (time all).",
        DECISION,
        check=one_of(STRATEGIES),
        to="strategy",
    ),
    Option(
        "confirm",
        "--confirm",
        int,
        DEFAULT_CONFIRM,
        "Predicted-best candidates to time end to end.",
        DECISION,
        check=at_least(1),
        to="confirm",
    ),
    Option(
        "repeats",
        "--repeats",
        str,
        "auto",
        "Timed repeats per request in confirmation: auto (2 or 3 by budget, more for the leaders until the "
        "decision is clear) or a number.",
        DECISION,
        check=at_least(1),
        parse=_repeats,
        to="repeats",
    ),
    Option("seed", "--seed", int, 0, "Seed for subsampling and bootstrap intervals.", DECISION, to="seed"),
    # ---- budget and outputs
    Option(
        "budget_minutes",
        "--budget-minutes",
        float,
        DEFAULT_BUDGET_MINUTES,
        "Plan measuring to fit this many minutes (subsamples).",
        BUDGET,
        check=rule(lambda value: value > 0, "must be > 0"),
        to="budget_minutes",
    ),
    Option(
        "run_dir",
        "--run-dir",
        Path | None,
        None,
        "Run directory (default: .runinfra/runs/<time>-<id>).",
        BUDGET,
        parse=_path_or_none,
        to="run_dir",
    ),
    Option(
        "resume",
        "--resume",
        str | None,
        None,
        "Continue an interrupted run: its directory, run id or `latest`.",
        BUDGET,
    ),
    Option(
        "out", "--out", Path, Path(DEFAULT_MANIFEST), "Where to write the manifest.", BUDGET, parse=_path, to="out"
    ),
    Option("as_json", "--json", bool, False, "Print the decision as JSON on stdout.", BUDGET),
    Option(
        "runs_root",
        "--runs-dir",
        Path,
        DEFAULT_RUNS_ROOT,
        "Where run directories are created.",
        BUDGET,
        parse=_path,
        to="runs_root",
    ),
    # ---- cluster
    Option(
        "executor",
        "--executor",
        str,
        "local",
        "Where confirmation trials run: local (this process) or ray (one task each).",
        CLUSTER,
        check=one_of(EXECUTORS),
        to="executor",
    ),
    Option(
        "ray_address",
        "--ray-address",
        str | None,
        None,
        "Ray cluster to join, e.g. auto or ray://head:10001 (default: start a local one).",
        CLUSTER,
        to="ray_address",
    ),
    Option(
        "trial_resources",
        "--trial-resources",
        str | None,
        None,
        "Ray resources per trial, e.g. num_cpus=4,num_gpus=1 (default: see docs).",
        CLUSTER,
        check=_trial_resources,
        to="trial_resources",
    ),
    Option(
        "max_retries",
        "--max-retries",
        int,
        DEFAULT_MAX_RETRIES,
        "Resubmissions of a trial whose worker or node died (ray).",
        CLUSTER,
        check=at_least(0),
        to="max_retries",
    ),
)
"""Every option of `optimize` but `--config` and `--print-config` (`cli.settings.FILE_OPTIONS`), in `--help`'s
order."""

OPTION = by_name(OPTIONS)
