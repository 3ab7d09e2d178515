"""The `bench` command's core: run variants over a workload through an engine, one request at a time, and
aggregate the raw records.

`run_variants` is engine-agnostic (anything implementing `Engine` plus `warmup`); `run_bench` loads the
workload and opens the configured engine over the models (`engine.registry.open_engine`). Losslessness is checked with
`runinfra_opt.records.compare_to_baseline`, the rule the optimizer shares. `runinfra_opt.report.bench`
renders a `BenchResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from runinfra_opt.engine import registry as engine_registry
from runinfra_opt.engine.protocol import Engine
from runinfra_opt.engine.registry import DEFAULT_ENGINE, EngineOptions, EngineSetup
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE, Variant, get_method
from runinfra_opt.methods.base import MethodOptions
from runinfra_opt.records import RequestRecord, compare_to_baseline, default_tie_tolerance
from runinfra_opt.results import Interval, Summary
from runinfra_opt.stats import speedup, summarize
from runinfra_opt.workload import DEFAULT_MAX_TOKENS, DEFAULT_WORKLOAD
from runinfra_opt.workload.model import Request, Workload
from runinfra_opt.workload.sessions import SessionHistory

WARMUP_TOKENS = 8

ProgressCallback = Callable[[int, int, str], None]
"""Called after each generation with (done, total, label)."""


def run_variants(
    engine: Engine,
    requests: Sequence[Request],
    variants: Sequence[Variant],
    *,
    max_tokens: int,
    repeat: int = 1,
    progress: ProgressCallback | None = None,
    check_lossless: bool = True,
    tie_tolerance: float | None = None,
) -> dict[str, list[RequestRecord]]:
    """Time every variant on every request, `repeat` times, interleaved (A B A B per request and repeat) after
    one untimed warm-up per variant. Returns records per variant name, in run order. On an engine that does not
    interleave (a server per variant), variant by variant instead: all of A, then all of B.

    With `check_lossless`, each speculative record of a greedy request is compared with the baseline's output
    for the same request: the timed baseline's when the baseline is among `variants`, else an untimed baseline
    reference run once per greedy request (not returned).
    """
    if repeat < 1:
        raise UserInputError(f"--repeat {repeat}: must be >= 1")
    if not requests:
        raise UserInputError("no requests to run")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise UserInputError(f"duplicate variants: {', '.join(names)}")
    timed_baseline = any(not v.is_speculative for v in variants)
    needs_reference = check_lossless and not timed_baseline and any(v.is_speculative for v in variants)
    references: dict[str, RequestRecord] = {}
    total = len(variants) * len(requests) * repeat
    total += sum(1 for r in requests if r.greedy) if needs_reference else 0
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    records: dict[str, list[RequestRecord]] = {name: [] for name in names}
    # A session's later turns carry the history the baseline's answers built (the reference's, else the first
    # variant's): every variant is timed on the same prompts.
    history = SessionHistory()
    sent: dict[str, Request] = {}
    answering = BASELINE.name if timed_baseline or needs_reference else min(variants, key=_run_order).name

    def prompt_of(request: Request) -> Request:
        if request.id not in sent:
            sent[request.id] = history.expand(request)
        return sent[request.id]

    def generate(request: Request, variant: Variant, **kwargs: Any) -> RequestRecord:
        full = prompt_of(request)
        record = engine.generate(full, variant, **kwargs)
        if full.session_id is not None and variant.name == answering and kwargs.get("repeat", 0) == 0:
            history.answer(full, engine.prompts.decode(record.output_ids or []))
        return record

    def run_one(request: Request, variant: Variant, rep: int) -> None:
        record = generate(request, variant, max_tokens=max_tokens, repeat=rep)
        records[variant.name].append(record)
        if not variant.is_speculative:
            references.setdefault(request.id, record)
        tick(f"{request.id} {variant.name} ({rep + 1}/{repeat})")

    if getattr(engine, "interleaves", True):
        for variant in variants:
            engine.warmup(requests[0], variant)
        for rep in range(repeat):
            for request in requests:
                if needs_reference and rep == 0 and request.greedy:
                    references[request.id] = generate(request, BASELINE, max_tokens=max_tokens)
                    tick(f"{request.id} baseline (reference)")
                for variant in variants:
                    run_one(request, variant, rep)
    else:
        if needs_reference:  # the reference first, on its own server
            engine.warmup(requests[0], BASELINE)
            for request in requests:
                if request.greedy:
                    references[request.id] = generate(request, BASELINE, max_tokens=max_tokens)
                    tick(f"{request.id} baseline (reference)")
        for variant in sorted(variants, key=_run_order):  # the baseline's server first
            engine.warmup(requests[0], variant)
            for rep in range(repeat):
                for request in requests:
                    run_one(request, variant, rep)
    if check_lossless:
        for variant in variants:
            if not variant.is_speculative:
                continue
            for record in records[variant.name]:
                reference = references.get(record.request_id)
                if reference is not None:
                    compare_to_baseline(record, reference, tie_tolerance=tie_tolerance)
    return records


def _run_order(variant: Variant) -> bool:
    return variant.is_speculative


# ---- the bench command --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """Everything `runinfra-opt bench` was asked to do."""

    variant: Variant
    workload: str = DEFAULT_WORKLOAD
    target: str = "default"
    draft: str | None = None
    engine: str = DEFAULT_ENGINE
    engine_options: EngineOptions = field(default_factory=EngineOptions)
    """The engine's own typed options (`engine_registry.engine_options`); its near-tie tolerance None: by the
    engine's dtype (`records.TIE_TOLERANCES`)."""
    requests: int | None = None
    repeat: int = 1
    vs_baseline: bool = False
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    skip_too_long: bool = False
    allow_tokenizer_mismatch: bool = False

    def __post_init__(self) -> None:
        cls = engine_registry.options_class(engine_registry.check(self.engine))
        if type(self.engine_options) is EngineOptions and cls is not EngineOptions:
            object.__setattr__(self, "engine_options", cls())

    def engine_setup(self) -> EngineSetup:
        return EngineSetup.of(self, drafts=(self.draft,) if self.draft is not None else ())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["engine_options"] = self.engine_options.to_dict()
        data["variant"] = self.variant.to_dict()
        data["variant_name"] = self.variant.name
        return data


def make_variant(
    method: str,
    *,
    lookahead: int | None,
    draft: str | None = None,
    ngram_max: int = 2,
    ngram_min: int = 1,
    exit_layer: int | None = None,
) -> Variant:
    """Build the variant the command line describes, with option-named errors (the method checks its own)."""
    try:
        spec = get_method(method)
    except UserInputError as exc:
        raise UserInputError(f"--method {method}: {exc}") from None
    options = MethodOptions(
        lookahead=lookahead, draft=draft, ngram_max=ngram_max, ngram_min=ngram_min, exit_layer=exit_layer
    )
    return spec.from_options(options)


@dataclass
class BenchResult:
    """What a bench run measured: raw records per variant, their summaries, and the comparison."""

    config: BenchConfig
    variant: str
    workload: dict[str, Any]
    environment: dict[str, Any]
    records: dict[str, list[RequestRecord]]
    summaries: dict[str, Summary]
    speedup: Interval | None = None
    skipped: list[str] = field(default_factory=list)
    """Ids of requests skipped as too long for the target's context."""
    seen_by_draft: list[str] = field(default_factory=list)
    """Ids of requests left out because the draft was distilled on them (see `runinfra_opt.drafts`)."""

    @property
    def lossless(self) -> bool | None:
        return self.summaries[self.variant].lossless

    @property
    def mismatches(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for record in self.records[self.variant]:
            if record.lossless is False and record.request_id not in seen:
                seen[record.request_id] = {
                    "request_id": record.request_id,
                    "first_mismatch": record.first_mismatch,
                    "near_tie": bool(record.near_tie),
                }
        return list(seen.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "config": self.config.to_dict(),
            "workload": self.workload,
            "environment": self.environment,
            "summaries": {name: s.model_dump() for name, s in self.summaries.items()},
            "speedup": self.speedup.model_dump() if self.speedup else None,
            "lossless": self.lossless,
            "mismatches": self.mismatches,
            "skipped": self.skipped,
            "seen_by_draft": self.seen_by_draft,
            "records": {name: [r.to_dict() for r in recs] for name, recs in self.records.items()},
        }


def load_workload_spec(spec: str, *, max_tokens: int) -> Workload:
    """A workload by bundled name or path; requests without their own max_tokens get `max_tokens`."""
    from runinfra_opt.workload import load_workload

    return load_workload(spec, default_max_tokens=max_tokens)


def run_bench(
    config: BenchConfig,
    *,
    progress: ProgressCallback | None = None,
    workload: Workload | None = None,
) -> BenchResult:
    """Load the workload and models, run the variant (and the baseline with `vs_baseline`), summarize."""
    from runinfra_opt.drafts import measurable_requests

    if config.requests is not None and config.requests < 1:
        raise UserInputError(f"--requests {config.requests}: must be >= 1")
    if config.max_tokens < 1:
        raise UserInputError(f"--max-tokens {config.max_tokens}: must be >= 1")
    if config.repeat < 1:
        raise UserInputError(f"--repeat {config.repeat}: must be >= 1")
    if workload is None:
        workload = load_workload_spec(config.workload, max_tokens=config.max_tokens)
    requests = list(workload.requests[: config.requests] if config.requests else workload.requests)
    draft_specs = [config.draft] if config.draft is not None else []
    engine = engine_registry.open_engine(config.engine_setup())
    try:
        measurable = measurable_requests(
            engine.prompts, requests, max_tokens=config.max_tokens, source=workload.path, drafts=draft_specs
        )
        if (reason := engine.supports(config.variant)) is not None:
            raise UserInputError(f"the {engine.name} engine cannot run {config.variant.name}: {reason}")
        kept, skipped = measurable.requests, measurable.too_long
        variants = [config.variant]
        if config.vs_baseline and config.variant.is_speculative:
            variants = [BASELINE, config.variant]
        records = run_variants(
            engine,
            kept,
            variants,
            max_tokens=config.max_tokens,
            repeat=config.repeat,
            progress=progress,
            tie_tolerance=tie_tolerance
            if (tie_tolerance := config.engine_options.near_tie_nats) is not None
            else default_tie_tolerance(engine.environment().get("dtype")),
        )
        environment = engine.environment()
    finally:
        engine.close()
    summaries = {name: summarize(recs) for name, recs in records.items()}
    ratio = None
    if len(variants) == 2:
        ratio = speedup(records[config.variant.name], records[BASELINE.name])
        summaries[config.variant.name].speedup = ratio
    info = {
        "name": workload.name,
        "path": workload.path,
        "fingerprint": workload.fingerprint,
        "requests": len(workload.requests),
        "used_requests": len(kept),
        "categories": sorted({r.category for r in kept}),
    }
    return BenchResult(
        config=config,
        variant=config.variant.name,
        workload=info,
        environment=environment,
        records=records,
        summaries=summaries,
        speedup=ratio,
        skipped=[r.id for r in skipped],
        seen_by_draft=[r.id for r in measurable.trained_on],
    )
