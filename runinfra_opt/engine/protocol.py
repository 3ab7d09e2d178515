"""The engine contract, and the optional capabilities an engine declares.

Every engine loads once, then runs requests under a variant into typed records
(`runinfra_opt.records.RequestRecord`), tokenizes through one `PromptTokenizer`, describes its environment and
closes. What only some engines can do is a `Capability`, declared in `Engine.capabilities` and checked by
the caller before it uses the matching method:

- `PASS_COUNTS`: records carry target/draft pass counts and accepted tokens per pass;
- `PROFILE`: teacher-forced agreement / acceptance probabilities of drafters (`agreement`, `acceptance`):
  what the predictor simulates from;
- `COST_TABLE`: a measured forward-time table of the target and its drafters (`measure_costs`);
- `EARLY_EXIT`: drafting from the target's own first layers (its hidden states);
- `SERVE_LOAD`: serving many requests at once under a load level (`runinfra_opt.load`: replay, a closed loop,
  a rate) on the variant's own server (`run_load`), the server's draft counters over the level included;
- `STEP_COSTS`: a step-cost table measured on the baseline's own server (`measure_step_costs`: step time by
  batch size and tokens per sequence, prefill by prompt length), what the serving-engine predictor turns
  simulated rounds into time with.

The in-process transformers engine (`runinfra_opt.engine.hf`) has all but `SERVE_LOAD` and `STEP_COSTS` (it runs
one request at a time); the vLLM serving engine has `SERVE_LOAD` and `STEP_COSTS`, and `optimize` then says which
steps it skips and why.
Nothing here imports torch.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from runinfra_opt.methods import Variant
from runinfra_opt.methods.base import CandidateSearch, Drafter
from runinfra_opt.records import RequestRecord
from runinfra_opt.workload.model import Request

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.engine.prompts import PromptTokenizer
    from runinfra_opt.load import LevelRun, LoadLevel
    from runinfra_opt.load.runner import RecordSink
    from runinfra_opt.predict.steptable import StepCostTable

TokenSequence = tuple[list[int], list[int]]
"""(prompt_ids, output_ids): a request's prompt and the target's output, as token ids."""


class Capability(StrEnum):
    PASS_COUNTS = "pass_counts"
    PROFILE = "profile"
    COST_TABLE = "cost_table"
    EARLY_EXIT = "early_exit"
    SERVE_LOAD = "serve_load"
    STEP_COSTS = "step_costs"


class Engine(Protocol):
    """Runs requests under variants and measures them."""

    name: str
    """`transformers`, `vllm`, ...: how results and messages name the engine."""
    capabilities: frozenset[Capability]
    prompts: PromptTokenizer
    """Token ids of requests as the target sees them (also: EOS ids, context length, too-long checks)."""
    interleaves: bool
    """True when switching variants between requests costs nothing (in-process): callers time A B C D per
    request. False when each variant needs its own server: callers time variant by variant."""

    @property
    def target_layers(self) -> int:
        """The target's number of layers (early exit's search space)."""
        ...

    def supports(self, variant: Variant) -> str | None:
        """None when the engine can run `variant`, else why not (one line)."""
        ...

    def generate(self, request: Request, variant: Variant, *, max_tokens: int, repeat: int = 0) -> RequestRecord:
        """Run `request` under `variant` (warm-up is the caller's choice) and return the measured record."""
        ...

    def warmup(self, request: Request, variant: Variant, *, max_tokens: int = 8) -> None:
        """One short untimed run, so first-call costs stay out of the figures."""
        ...

    def model_infos(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(the target's `ModelInfo` fields, each draft's)."""
        ...

    def environment(self) -> dict[str, Any]:
        """Versions, device, CPU, threads, dtype, model hashes: what results record about the machine."""
        ...

    def close(self) -> None: ...


class Profiler(Protocol):
    """`Capability.PROFILE`: per output position of the target's own output, what each drafter would do."""

    def agreement(self, drafters: Sequence[Drafter], sequences: Sequence[TokenSequence]) -> dict[str, list[list[bool]]]:
        """By drafter role, per sequence: does the drafter's greedy prediction equal the target's token."""
        ...

    def acceptance(
        self,
        drafter: Drafter,
        sequences: Sequence[TokenSequence],
        *,
        temperature: Sequence[float],
        top_p: Sequence[float | None],
    ) -> list[list[float]]:
        """Per sequence and position: speculative sampling's acceptance probability sum(min(p, q))."""
        ...


class CostMeter(Protocol):
    """`Capability.COST_TABLE`: forward times of the target and each drafter on this device."""

    def cost_steps(self, drafters: Sequence[Drafter], *, quick: bool = False) -> int:
        """How many progress steps `measure_costs` reports."""
        ...

    def measure_costs(
        self,
        drafters: Sequence[Drafter],
        *,
        remeasure: bool = False,
        quick: bool = False,
        on_step: Callable[[str], None] | None = None,
        searches: Sequence[CandidateSearch] = (),
    ) -> tuple[list[Any], dict[str, Any]]:
        """(cost samples for the target, every drafter and every candidate search the engine can time,
        provenance: measured or cached, cache files)."""
        ...


@dataclass
class LoadMeasurement:
    """One variant under one load level: the raw run and the server's draft counters over it."""

    run: LevelRun
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    preemptions: int | None = None
    """Requests the server preempted during the level (its `/metrics`), None where it does not say."""
    kv_cache_peak: float | None = None
    """The highest KV-cache usage (0-1) sampled during the level, None where it does not say."""


class LoadServer(Protocol):
    """`Capability.SERVE_LOAD`: many requests in flight on the variant's server, offered as `level` says."""

    def run_load(
        self,
        variant: Variant,
        level: LoadLevel,
        requests: Sequence[Request],
        *,
        max_tokens: int,
        sink: RecordSink | None = None,
    ) -> LoadMeasurement:
        """Send `requests` under `level` (a warm-up first, untimed) and return what the runner recorded; with a
        `sink` every record goes to it as it completes and the run keeps none (bounded memory)."""
        ...

    def greedy_continuation(self, request: Request, produced: int, extra: int) -> list[int]:
        """The baseline server's greedy output of `request`, `produced` + `extra` tokens long, past any EOS
        (untimed): what a speculative server's last step may accept past the output's end."""
        ...


class StepCosts(Protocol):
    """A step-cost measurement: the table, and what it was made from (`to_dict`, for the results)."""

    @property
    def table(self) -> StepCostTable: ...

    def to_dict(self) -> dict[str, Any]: ...


class StepCostMeter(Protocol):
    """`Capability.STEP_COSTS`: the target's step-cost table, measured on the baseline's own server."""

    def step_costs(
        self, max_batch: int | None = None, max_tokens: int | None = None, max_prefill: int | None = None
    ) -> StepCosts:
        """Measure on the baseline's server (launched if it is not up; it then serves the baseline as well), no
        further than the run can use: steps of up to `max_batch` sequences carrying up to `max_tokens` tokens each,
        prefills of up to `max_prefill` prompt tokens in one step (None: the engine's full grid)."""
        ...

    def draft_step_costs(
        self, draft: str, max_batch: int | None = None, max_tokens: int | None = None, max_prefill: int | None = None
    ) -> StepCosts:
        """The same measurement for the draft model `draft`, on a server of the draft alone (launched for it and
        stopped after; its launch is named `DRAFT_ALONE:<draft's short name>`)."""
        ...


DRAFT_ALONE = "draft-alone"
"""The name of a server launched to measure a draft model's step costs (`StepCostMeter.draft_step_costs`)."""


class ProfilingEngine(Engine, Profiler, CostMeter, Protocol):
    """An engine with every capability (the in-process transformers engine)."""


def searches_of(variants: Sequence[Variant]) -> list[CandidateSearch]:
    """The candidate searches of `variants`, one per method, at the largest width any of them uses."""
    from runinfra_opt.methods import get_method

    found: dict[str, CandidateSearch] = {}
    for variant in variants:
        search = get_method(variant.method).candidate_search(variant)
        if search is not None and (search.method not in found or search.max_size > found[search.method].max_size):
            found[search.method] = search
    return [found[method] for method in sorted(found)]


def drafters_of(variants: Sequence[Variant]) -> list[Drafter]:
    """The distinct drafters of `variants`, by role (sorted)."""
    from runinfra_opt.methods import get_method

    found: dict[str, Drafter] = {}
    for variant in variants:
        drafter = get_method(variant.method).drafter(variant)
        if drafter is not None:
            found.setdefault(drafter.role, drafter)
    return [found[role] for role in sorted(found)]


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:  # noqa: PTH123 - a pseudo file, read once
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
