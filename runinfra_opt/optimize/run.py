"""The `optimize` pipeline: predict every variant from one profiling pass, confirm the best by timing, decide.

Phases (each recorded in results.json as it finishes; `--resume` skips what is done):
1. load the workload (bundled name or path) and the models; build the engine and the search space;
2. cost: measure (or read from the cache) forward/prefill times of the target, each draft and each
   early-exit sub-model, and fit the cost model;
3. plan: subsample requests, stratified by category, so the run fits `--budget-minutes`;
4. baseline: one timed greedy pass over the planned requests (outputs and timings kept);
5. profile: one teacher-forced pass of each draft, and one target pass for every early-exit layer, over
   prompt + baseline output (agreement per position; acceptance probabilities for sampled requests);
   then a short calibration run per speculative method (the generate loop's per-round overhead);
6. predict: simulate every variant's passes per request and predict TTFT and end-to-end time;
7. confirm: time the top `--confirm` predicted candidates and the baseline end to end, repeated and
   interleaved (A B C D A B C D), checking every output against the baseline's (`--strategy exhaustive`
   times every variant instead);
8. decide on measured figures only, and write the manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runinfra_opt import __version__
from runinfra_opt.engine.protocol import RequestRecord
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.plan import plan_requests, replan_confirmation
from runinfra_opt.optimize.space import build_space
from runinfra_opt.results import (
    ModelInfo,
    QueueSimulation,
    RequestResult,
    RunResults,
    VariantResult,
    WorkloadInfo,
    atomic_write_text,
    load_results,
    save_results,
)
from runinfra_opt.runs import moves_latest
from runinfra_opt.workload.model import Request, Workload

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.engine.hf import HFEngine
    from runinfra_opt.methods.simulation import ExpectedSimResult, SimResult
    from runinfra_opt.models import LoadedModel
    from runinfra_opt.optimize.costmodel import CostModel

RESULTS_FILE = "results.json"
WARMUP_TOKENS = 8
CALIBRATION_REQUESTS = 2
CALIBRATION_LOOKAHEAD = 4
CALIBRATION_TOKENS = 48
"""Calibration runs stop after this many tokens: the per-round overhead does not need whole answers."""


class Reporter(Protocol):
    """Progress of a run (the CLI draws rich progress bars on stderr; tests pass nothing)."""

    def phase(self, name: str, total: int | None, description: str) -> None: ...

    def advance(self, label: str = "") -> None: ...

    def end_phase(self) -> None: ...

    def note(self, text: str) -> None: ...


class _Silent:
    def phase(self, name: str, total: int | None, description: str) -> None:
        pass

    def advance(self, label: str = "") -> None:
        pass

    def end_phase(self) -> None:
        pass

    def note(self, text: str) -> None:
        pass


# ---- run directories ----------------------------------------------------------------------------------------


def new_run_dir(runs_root: Path) -> Path:
    """`<runs_root>/<UTC time>-<short id>/`, created."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = runs_root / f"{stamp}-{secrets.token_hex(3)}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def point_latest(runs_root: Path, run_dir: Path) -> None:
    """Make `<runs_root>/latest` point to `run_dir`: a relative symlink, or a file naming it where symlinks
    are not possible."""
    latest = runs_root / "latest"
    target = os.path.relpath(run_dir.resolve(), runs_root.resolve())
    tmp = runs_root / f".latest-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        if latest.is_dir() and not latest.is_symlink():
            raise OSError("a real directory named latest")
        tmp.replace(latest)
    except OSError:
        tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if latest.is_symlink():
                latest.unlink()
            atomic_write_text(latest, target + "\n")


def resolve_run(spec: str, runs_root: Path) -> Path:
    """A run directory from `--resume RUN`: a path (directory or its results.json), a run id under the runs
    root, or `latest`."""
    candidates = [Path(spec).expanduser(), runs_root / spec]
    for path in candidates:
        if path.name == RESULTS_FILE and path.is_file():
            return path.parent
        if path.is_file() and path.name == "latest":  # a `latest` file naming the run
            named = (path.parent / path.read_text(encoding="utf-8").strip()).resolve()
            if (named / RESULTS_FILE).is_file():
                return named
        if path.is_dir() and (path / RESULTS_FILE).is_file():
            return path.resolve()
    raise UserInputError(f"--resume {spec}: no run with a {RESULTS_FILE} there or under {runs_root}")


# ---- conversions --------------------------------------------------------------------------------------------


def record_to_result(record: RequestRecord, *, keep_ids: bool = True) -> RequestResult:
    """A measured engine record as stored in results.json (output ids kept for losslessness checks)."""
    data: dict[str, Any] = {
        "request_id": record.request_id,
        "category": record.category,
        "greedy": record.greedy,
        "repeat": record.repeat,
        "prompt_tokens": record.prompt_tokens,
        "output_tokens": record.output_tokens,
        "ttft_s": record.ttft_s,
        "e2e_s": record.e2e_s,
        "tpot_s": record.tpot_s,
        "target_passes": record.target_passes,
        "draft_passes": record.draft_passes,
        "drafted_tokens": record.drafted_tokens,
        "accepted_tokens": record.accepted_tokens,
        "accepted_per_pass": list(record.accepted_per_pass),
        "lossless": record.lossless,
        "first_mismatch": record.first_mismatch,
    }
    if keep_ids:
        data["output_ids"] = list(record.output_ids)
    return RequestResult.model_validate(data)


def result_to_record(result: RequestResult, variant: str) -> RequestRecord:
    extra = result.model_extra or {}
    return RequestRecord(
        request_id=result.request_id,
        variant=variant,
        category=result.category,
        greedy=result.greedy,
        prompt_tokens=result.prompt_tokens,
        output_ids=[int(i) for i in extra.get("output_ids", [])],
        ttft_s=result.ttft_s,
        e2e_s=result.e2e_s,
        target_passes=result.target_passes,
        draft_passes=result.draft_passes,
        accepted_per_pass=list(result.accepted_per_pass),
        drafted_tokens=result.drafted_tokens,
        repeat=result.repeat,
        lossless=result.lossless,
        first_mismatch=result.first_mismatch,
    )


def _flags(bits: str) -> list[bool]:
    return [c == "1" for c in bits]


def _bits(flags: Sequence[bool]) -> str:
    return "".join("1" if f else "0" for f in flags)


# ---- the run ------------------------------------------------------------------------------------------------


@dataclass
class _State:
    config: OptimizeConfig
    run_dir: Path
    results: RunResults
    reporter: Reporter
    started: float = field(default_factory=time.perf_counter)
    workload: Workload | None = None
    requests: list[Request] = field(default_factory=list)
    """The planned requests (after subsampling), in file order."""
    target: LoadedModel | None = None
    drafts: dict[str, LoadedModel] = field(default_factory=dict)
    engine: HFEngine | None = None
    space: list[Variant] = field(default_factory=list)
    cost: CostModel | None = None
    max_tokens: int = 0

    @property
    def path(self) -> Path:
        return self.run_dir / RESULTS_FILE

    def save(self) -> None:
        save_results(self.results, self.path)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def budget_left(self) -> float:
        return self.config.budget_minutes * 60.0 - self.elapsed()

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.results.timings_s[phase] = self.results.timings_s.get(phase, 0.0) + spent

    def finish_phase(self, phase: str) -> None:
        self.results.phase = phase
        self.save()

    def variant_result(self, variant: Variant) -> VariantResult:
        found = self.results.variant(variant.name)
        if found is None:
            found = VariantResult(name=variant.name, variant=variant.to_dict())
            self.results.variants.append(found)
        return found

    def request_by_id(self) -> dict[str, Request]:
        return {r.id: r for r in self.requests}


PHASES = ("start", "baseline", "profile", "predict", "confirm", "decide")


def _done(results: RunResults, phase: str) -> bool:
    return PHASES.index(results.phase) >= PHASES.index(phase) if results.phase in PHASES else False


def start_run(config: OptimizeConfig) -> tuple[OptimizeConfig, Path, RunResults, bool]:
    """Create the run directory and results (or reopen them for `--resume`). Returns (config, run dir,
    results, resumed). A resumed run keeps the configuration it started with."""
    runs_root = Path(config.runs_root)
    if config.extra.get("resume"):
        run_dir = resolve_run(str(config.extra["resume"]), runs_root)
        results = load_results(run_dir / RESULTS_FILE)
        stored = OptimizeConfig.from_dict(results.config)
        # Where to write the manifest may change on resume; nothing that decides what is measured may.
        stored = stored.with_changes(out=config.out, runs_root=config.runs_root)
        results.status = "running"
        results.notes.append(f"resumed at {datetime.now(UTC).isoformat(timespec='seconds')}")
        return stored, run_dir, results, True
    if config.run_dir:
        run_dir = Path(config.run_dir)
        if (run_dir / RESULTS_FILE).exists():
            raise UserInputError(f"--run-dir {run_dir}: already holds a run; use --resume {run_dir} to continue it")
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_run_dir(runs_root)
    results = RunResults(
        tool_version=__version__,
        run_id=run_dir.name,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        config=config.to_dict(),
    )
    save_results(results, run_dir / RESULTS_FILE)
    if moves_latest(runs_root, run_dir):  # see runinfra_opt/runs.py
        with contextlib.suppress(OSError):
            runs_root.mkdir(parents=True, exist_ok=True)
            point_latest(runs_root, run_dir)
    return config, run_dir, results, False


def run_optimize(config: OptimizeConfig, *, reporter: Reporter | None = None) -> RunResults:
    """Run (or resume) the whole pipeline and return the final results (also in `<run dir>/results.json`).

    Raises `NoFeasibleVariantError` (exit 3, no manifest) when no variant satisfies the constraints. With
    `require_speedup`, a baseline win sets `decision.exit_code` to 4 (the caller exits with it); the results
    file and the manifest are complete either way."""
    config, run_dir, results, resumed = start_run(config)
    state = _State(config=config, run_dir=run_dir, results=results, reporter=reporter or _Silent())
    try:
        _run(state, resumed)
    except BaseException as exc:
        if state.results.status == "running":
            if isinstance(exc, KeyboardInterrupt):
                state.results.notes.append(f"interrupted after phase {state.results.phase}; resume with --resume")
            else:
                state.results.status = "failed"
                state.results.notes.append(f"failed after phase {state.results.phase}: {exc}")
            with contextlib.suppress(Exception):
                state.save()
        raise
    finally:
        if state.engine is not None:
            state.engine.close()
    return state.results


def _run(state: _State, resumed: bool) -> None:
    _load(state, resumed)
    _cost(state)
    _plan(state)
    if not _done(state.results, "baseline"):
        with state.timed("baseline"):
            _baseline(state)
        state.finish_phase("baseline")
    _check_cost(state)
    if not _done(state.results, "profile"):
        with state.timed("profile"):
            _profile(state)
        state.finish_phase("profile")
    with state.timed("predict"):
        _predict(state)
    if not _done(state.results, "predict"):
        state.finish_phase("predict")
    if not _done(state.results, "confirm"):
        with state.timed("confirm"):
            _confirm(state)
        state.finish_phase("confirm")
    with state.timed("predict"):
        _predict(state, after_confirm=True)
    with state.timed("decide"):
        _decide(state)


# ---- phase 8: decide and write the manifest -----------------------------------------------------------------


def _decide(state: _State) -> None:
    from runinfra_opt.errors import NoFeasibleVariantError
    from runinfra_opt.optimize.select import decide

    config, results = state.config, state.results
    try:
        decision = decide(
            results,
            priority=config.priority,
            percentile=config.percentile,
            max_ttft_ms=config.max_ttft_ms,
            max_ttft_regression=config.max_ttft_regression,
            min_speedup=config.min_speedup,
            require_speedup=config.require_speedup,
            seed=config.seed,
        )
    except NoFeasibleVariantError:
        results.status = "no_feasible"
        results.phase = "decide"
        state.save()
        raise
    decision.queue = _queue(state, decision.winner)
    results.decision = decision
    results.phase = "decide"
    manifest_path = _write_manifest(state)
    results.status = "complete"
    results.notes.append(f"manifest written to {manifest_path}")
    results.timings_s["total"] = sum(v for k, v in results.timings_s.items() if k != "total")
    state.save()


# ---- phase 1: load ------------------------------------------------------------------------------------------


def _load(state: _State, resumed: bool) -> None:
    from runinfra_opt.engine.hf import open_engine
    from runinfra_opt.optimize.drafts import measurable_requests
    from runinfra_opt.workload import DEFAULT_MAX_TOKENS, DEFAULT_WORKLOAD, load_workload

    config, results, reporter = state.config, state.results, state.reporter
    reporter.phase("load", 2 + len(config.drafts), "loading")
    with state.timed("load"):
        workload = load_workload(
            config.workload or DEFAULT_WORKLOAD,
            format=config.workload_format,
            default_max_tokens=config.max_tokens or DEFAULT_MAX_TOKENS,
        )
        if not workload.requests:
            raise UserInputError(f"{workload.path}: the workload has no requests")
        if resumed and results.workload is not None and results.workload.fingerprint != workload.fingerprint:
            raise UserInputError(
                f"--resume: the workload {workload.path} changed since the run started "
                f"(fingerprint {workload.fingerprint[:12]} vs {results.workload.fingerprint[:12]}); start a new run"
            )
        state.workload = workload
        reporter.advance(f"workload {workload.name}")
        engine = open_engine(
            config.target,
            config.drafts,
            device=config.device,
            dtype=config.dtype,
            threads=config.threads,
            allow_tokenizer_mismatch=config.allow_tokenizer_mismatch,
            skip_too_long=config.skip_too_long,
            on_load=reporter.advance,
        )
        target, drafts = engine.target, engine.drafts
        state.target, state.drafts, state.engine = target, drafts, engine
        # Without --max-tokens every request keeps its own max_tokens (load_workload filled the missing ones).
        state.max_tokens = config.max_tokens or max(r.max_tokens or DEFAULT_MAX_TOKENS for r in workload.requests)
        measurable = measurable_requests(
            engine, workload.requests, max_tokens=state.max_tokens, source=workload.path, drafts=config.drafts
        )
        if not resumed:
            if measurable.too_long:
                results.notes.append(f"skipped {len(measurable.too_long)} request(s) too long for the target's context")
            if (note := measurable.trained_on_note()) is not None:
                results.notes.append(note)
        state.requests = measurable.requests
        state.space = build_space(
            num_layers=target.num_layers,
            drafts=config.drafts,
            methods=config.methods,
            lookaheads=config.lookaheads,
            ngram_max=config.ngram_max,
            exit_layers=config.exit_layers,
        )
        results.environment = engine.environment()
        results.target = ModelInfo.model_validate(target.info())
        results.drafts = [ModelInfo.model_validate(d.info()) for d in drafts.values()]
        results.config["space"] = [v.name for v in state.space]
        for variant in state.space:
            state.variant_result(variant)
    reporter.end_phase()
    state.save()


# ---- phase 2: cost model ------------------------------------------------------------------------------------


def _exit_layers(space: Sequence[Variant]) -> list[int]:
    return sorted({v.exit_layer for v in space if v.method == "early_exit" and v.exit_layer is not None})


def _cost(state: _State) -> None:
    from runinfra_opt.engine.hf_cost import measure_costs, planned_steps
    from runinfra_opt.optimize.costmodel import CostModel, fit_cost_model

    results = state.results
    if results.cost_model.get("fitted"):
        state.cost = CostModel.from_dict(results.cost_model["fitted"])
        return
    assert state.target is not None
    assert state.engine is not None
    layers = _exit_layers(state.space)
    quick = bool(state.config.extra.get("quick_cost"))
    state.reporter.phase("cost", planned_steps(len(state.drafts), len(layers), quick=quick), "measuring costs")
    with state.timed("cost"):
        samples, provenance = measure_costs(
            state.target,
            list(state.drafts.values()),
            exit_layers=layers,
            threads=state.engine.threads,
            remeasure=state.config.remeasure_cost,
            quick=quick,
            on_step=lambda role: state.reporter.advance(role),
        )
        state.cost = fit_cost_model(samples)
    state.reporter.end_phase()
    results.cost_model = {
        "fitted": state.cost.to_dict(),
        "provenance": provenance,
        "samples": [s.to_dict() for s in samples],
    }
    atomic_write_text(state.run_dir / "cost_model.json", json.dumps(results.cost_model, indent=1))
    state.save()


COST_MISMATCH = 0.30
"""A cost model whose raw prediction of the measured baseline pass is slower than it by more than this was
probably measured on a busy machine: measure it again (once) when it came from the cache."""


def _baseline_prediction_error(state: _State) -> float | None:
    """Raw cost-model prediction (no fitted overheads) of the baseline pass over its measured time, minus 1."""
    assert state.cost is not None
    base = list(_baseline_records(state.results).values())
    measured = sum(r.e2e_s for r in base)
    if not base or measured <= 0:
        return None
    target = state.cost.target
    predicted = sum(
        target.prefill(r.prompt_tokens)
        + sum(target.forward(1, r.prompt_tokens + i) for i in range(1, max(r.output_tokens, 1)))
        for r in base
    )
    return predicted / measured - 1.0


def _check_cost(state: _State) -> None:
    from runinfra_opt.engine.hf_cost import measure_costs
    from runinfra_opt.optimize.costmodel import fit_cost_model

    results = state.results
    if results.cost_model.get("checked"):
        return
    error = _baseline_prediction_error(state)
    if error is None:
        return
    results.cost_model["baseline_prediction_error"] = error
    cached = bool(results.cost_model.get("provenance", {}).get("cached"))
    # Only a cost model slower than reality is suspect: forwards cannot take longer than the measured steps
    # that contain them (a faster one is the generate loop's overhead, which the baseline calibrates).
    if error > COST_MISMATCH and cached:
        assert state.target is not None
        assert state.engine is not None
        results.notes.append(
            f"the cached cost model predicted the baseline pass {error:+.0%} off its measured time: measured it again"
        )
        with state.timed("cost"):
            samples, provenance = measure_costs(
                state.target,
                list(state.drafts.values()),
                exit_layers=_exit_layers(state.space),
                threads=state.engine.threads,
                remeasure=True,
                quick=bool(state.config.extra.get("quick_cost")),
            )
            state.cost = fit_cost_model(samples)
        results.cost_model.update(
            {"fitted": state.cost.to_dict(), "provenance": provenance, "samples": [s.to_dict() for s in samples]}
        )
        error = _baseline_prediction_error(state)
        results.cost_model["baseline_prediction_error"] = error
    if error is not None and error > COST_MISMATCH:
        results.notes.append(
            f"the cost model's raw prediction of the baseline pass is {error:+.0%} off its measured time (the "
            "machine may have been busy while measuring); overheads fitted to the baseline absorb part of it"
        )
    results.cost_model["checked"] = True
    atomic_write_text(state.run_dir / "cost_model.json", json.dumps(results.cost_model, indent=1))
    state.save()


# ---- phase 3: plan ------------------------------------------------------------------------------------------


def _plan(state: _State) -> None:
    config, results = state.config, state.results
    assert state.workload is not None
    assert state.engine is not None
    assert state.cost is not None
    engine, cost, workload = state.engine, state.cost, state.workload
    stored = results.config.get("plan")
    if stored:
        wanted = set(stored["request_ids"])
        state.requests = [r for r in state.requests if r.id in wanted]
        if len(state.requests) != len(wanted):
            raise UserInputError("--resume: planned requests are missing from the workload; start a new run")
        return

    def estimate(request: Request) -> float:
        prompt = len(engine.prompt_ids(request))
        new = engine.max_new_tokens(request, state.max_tokens)
        return cost.target.prefill(prompt) + new * cost.target.forward(1, prompt + new // 2)

    timed_variants = len(state.space) - 1 if config.strategy == "exhaustive" else None
    plan = plan_requests(
        state.requests,
        estimate,
        budget_s=max(state.budget_left(), 1.0),
        confirm=min(config.confirm, max(len(state.space) - 1, 1)),
        repeats=config.repeats,
        seed=config.seed,
        max_requests=config.max_requests,
        timed_variants=timed_variants,
        budget_minutes=config.budget_minutes,
    )
    state.requests = [r for r in state.requests if r.id in set(plan.request_ids)]
    results.config["plan"] = {
        "request_ids": plan.request_ids,
        "repeats": plan.repeats,
        "estimate_s": round(plan.estimate_s, 1),
        "budget_s": config.budget_minutes * 60.0,
        "max_tokens": state.max_tokens,
    }
    categories: dict[str, int] = {}
    for r in state.requests:
        categories[r.category] = categories.get(r.category, 0) + 1
    results.workload = WorkloadInfo(
        name=workload.name,
        path=workload.path,
        fingerprint=workload.fingerprint,
        requests=len(workload.requests),
        used_requests=len(state.requests),
        categories=categories,
        subsampled=plan.subsampled,
    )
    if plan.subsampled:
        results.notes.append(plan.subsampled)
    if config.strategy == "exhaustive" and plan.estimate_s > config.budget_minutes * 60:
        results.notes.append(
            f"exhaustive: timing all {len(state.space)} variants is estimated at {plan.estimate_s / 60:.1f} min, "
            f"over the {config.budget_minutes:g}-minute budget (the budget only limits the requests)"
        )
    state.save()


# ---- phase 4: baseline --------------------------------------------------------------------------------------


def _baseline_records(results: RunResults) -> dict[str, RequestResult]:
    return {r["request_id"]: RequestResult.model_validate(r) for r in results.profile.get("baseline", [])}


def _baseline(state: _State) -> None:
    assert state.engine is not None
    engine, results = state.engine, state.results
    done = _baseline_records(results)
    todo = [r for r in state.requests if r.id not in done]
    state.reporter.phase("baseline", len(state.requests), "baseline")
    for _ in range(len(state.requests) - len(todo)):
        state.reporter.advance()
    if todo:
        engine.warmup(todo[0], BASELINE, max_tokens=WARMUP_TOKENS)
    stored = results.profile.setdefault("baseline", [])
    for request in todo:
        record = engine.generate(request, BASELINE, max_tokens=state.max_tokens)
        stored.append(record_to_result(record).model_dump())
        state.save()
        state.reporter.advance(request.id)
    state.reporter.end_phase()


# ---- phase 5: profile ---------------------------------------------------------------------------------------


def _sequences(state: _State, requests: Sequence[Request]) -> list[tuple[list[int], list[int]]]:
    assert state.engine is not None
    base = _baseline_records(state.results)
    out = []
    for r in requests:
        ids = (base[r.id].model_extra or {}).get("output_ids", [])
        out.append((state.engine.prompt_ids(r), [int(i) for i in ids]))
    return out


def _profile(state: _State) -> None:
    from runinfra_opt.engine.hf_profile import acceptance_probabilities, early_exit_agreement, teacher_forced_agreement

    assert state.target is not None
    results = state.results
    layers = _exit_layers(state.space)
    draft_specs = sorted({v.draft for v in state.space if v.method == "draft" and v.draft})
    greedy = [r for r in state.requests if r.greedy]
    sampled = [r for r in state.requests if not r.greedy]
    agreement: dict[str, dict[str, str]] = results.profile.setdefault("agreement", {})
    acceptance: dict[str, dict[str, list[float]]] = results.profile.setdefault("acceptance", {})
    state.reporter.phase("profile", len(draft_specs) + (1 if layers else 0) + 1, "profiling")
    if greedy:
        seqs = _sequences(state, greedy)
        for spec in draft_specs:
            role = f"draft:{spec}"
            if role not in agreement:
                flags = teacher_forced_agreement(state.drafts[spec], seqs)
                agreement[role] = {r.id: _bits(f) for r, f in zip(greedy, flags, strict=True)}
                state.save()
            state.reporter.advance(role)
        if layers and not all(f"early_exit:{layer}" in agreement for layer in layers):
            by_layer = early_exit_agreement(state.target, seqs, layers)
            for layer, flags in by_layer.items():
                agreement[f"early_exit:{layer}"] = {r.id: _bits(f) for r, f in zip(greedy, flags, strict=True)}
            state.save()
        if layers:
            state.reporter.advance("early exit")
    if sampled:
        seqs = _sequences(state, sampled)
        temps = [float(r.temperature or 1.0) for r in sampled]
        tops = [r.top_p for r in sampled]
        for spec in draft_specs:
            role = f"draft:{spec}"
            if role not in acceptance:
                probs = acceptance_probabilities(state.drafts[spec], state.target, seqs, temperature=temps, top_p=tops)
                acceptance[role] = {r.id: p for r, p in zip(sampled, probs, strict=True)}
        for layer in layers:
            role = f"early_exit:{layer}"
            if role not in acceptance:
                probs = acceptance_probabilities(
                    None, state.target, seqs, temperature=temps, top_p=tops, exit_layer=layer
                )
                acceptance[role] = {r.id: p for r, p in zip(sampled, probs, strict=True)}
        results.notes.append(
            f"{len(sampled)} sampled request(s): predicted from expected acceptance (sum of min(p, q)); "
            "prompt lookup on them is predicted from the recorded sampled output"
        )
    if state.config.strategy == "predictive":
        # Exhaustive timing does not need the predictor's overheads: it measures every variant anyway.
        _calibrate(state)
    state.reporter.advance("calibration")
    state.reporter.end_phase()


def _calibration_variants(space: Sequence[Variant]) -> list[Variant]:
    """One representative variant per speculative method: the lookahead closest to 4."""
    chosen: dict[str, Variant] = {}
    for v in space:
        if not v.is_speculative:
            continue
        best = chosen.get(v.method)
        if best is None or abs(v.lookahead - CALIBRATION_LOOKAHEAD) < abs(best.lookahead - CALIBRATION_LOOKAHEAD):
            chosen[v.method] = v
    return list(chosen.values())


def _calibrate(state: _State) -> None:
    """Time one representative variant per method on a couple of short requests: the generate loop's extra
    cost per speculative round (candidate generation, the draft's own generate call) is fitted from them."""
    assert state.engine is not None
    assert state.cost is not None
    results = state.results
    stored: list[dict[str, Any]] = results.profile.setdefault("calibration", [])
    base = _baseline_records(results)
    shortest = sorted((r for r in state.requests if r.greedy), key=lambda r: base[r.id].e2e_s)[:CALIBRATION_REQUESTS]
    done = {(c["variant"], c["request_id"]) for c in stored}
    cap = min(state.max_tokens, CALIBRATION_TOKENS)
    for variant in _calibration_variants(state.space):
        todo = [r for r in shortest if (variant.name, r.id) not in done]
        if not todo:
            continue
        state.engine.warmup(todo[0], variant, max_tokens=WARMUP_TOKENS)
        for request in todo:
            record = state.engine.generate(request, variant, max_tokens=cap)
            stored.append(
                {"variant": variant.name, "max_tokens": cap, **record_to_result(record, keep_ids=False).model_dump()}
            )
            state.save()


def _fit_overheads(state: _State, baseline: Sequence[RequestResult]) -> CostModel:
    """The measured cost model with generate-loop overheads fitted to `baseline` (measured baseline requests)
    and the per-round overheads to the calibration runs. `state.cost` itself stays the raw measured model."""
    from runinfra_opt.methods.simulation import SimResult
    from runinfra_opt.optimize.costmodel import Observation, calibrate_overheads, calibrate_round_overhead

    assert state.cost is not None
    base = _baseline_records(state.results)
    observations = [
        Observation(r.prompt_tokens, r.output_tokens, r.ttft_s, r.e2e_s) for r in baseline if r.output_tokens
    ]
    cost = calibrate_overheads(state.cost, observations) if observations else state.cost
    by_name = {v.name: v for v in state.space}
    runs: dict[str, list[tuple[SimResult, int, Variant, float]]] = {}
    requests = state.request_by_id()
    for item in state.results.profile.get("calibration", []):
        variant = by_name.get(item["variant"])
        request = requests.get(item["request_id"])
        if variant is None or request is None or request.id not in base:
            continue
        sim = _simulate(state, variant, request, max_tokens=item.get("max_tokens"))
        if isinstance(sim, SimResult):
            runs.setdefault(variant.method, []).append((sim, int(item["prompt_tokens"]), variant, float(item["e2e_s"])))
    for method, method_runs in runs.items():
        cost = calibrate_round_overhead(cost, method, method_runs)
    return cost


# ---- phase 6: predict ---------------------------------------------------------------------------------------


def _simulate(
    state: _State, variant: Variant, request: Request, *, max_tokens: int | None = None
) -> SimResult | ExpectedSimResult | None:
    """Simulated passes of `request` under `variant` from the profiling pass; `max_tokens` simulates a run
    capped shorter than the baseline's (its greedy output is the baseline's, cut)."""
    from runinfra_opt.methods import get_method
    from runinfra_opt.methods.base import SimInput

    assert state.engine is not None
    base = _baseline_records(state.results).get(request.id)
    if base is None:
        return None
    prompt = state.engine.prompt_ids(request)
    cap = state.engine.max_new_tokens(request, min(max_tokens or state.max_tokens, state.max_tokens))
    output = [int(i) for i in (base.model_extra or {}).get("output_ids", [])][:cap]
    method = get_method(variant.method)
    drafter = method.drafter(variant)
    agreement: list[bool] | None = None
    acceptance: list[float] | None = None
    if drafter is not None:
        bits = state.results.profile.get("agreement", {}).get(drafter.role, {}).get(request.id)
        agreement = _flags(bits) if bits is not None else None
        acceptance = state.results.profile.get("acceptance", {}).get(drafter.role, {}).get(request.id)
    sim = SimInput(
        prompt_ids=prompt,
        output_ids=output,
        eos_token_ids=state.engine.eos_token_ids,
        max_length=len(prompt) + cap,
        greedy=request.greedy,
        agreement=agreement,
        acceptance=acceptance,
    )
    return method.simulate(variant, sim)


def _predicted_result(
    request: Request, sim: SimResult | ExpectedSimResult, prompt_len: int, ttft: float, e2e: float
) -> RequestResult:
    from runinfra_opt.methods.simulation import SimResult

    n = int(sim.output_tokens)
    if isinstance(sim, SimResult):
        target, draft, drafted = sim.target_passes, sim.draft_passes, sim.drafted
        accepted, per_pass = sim.accepted, list(sim.accepted_per_pass)
    else:
        target, draft, drafted = round(sim.target_passes), round(sim.draft_passes), round(sim.drafted)
        accepted, per_pass = round(sim.accepted), []
    return RequestResult(
        request_id=request.id,
        category=request.category,
        greedy=request.greedy,
        prompt_tokens=prompt_len,
        output_tokens=n,
        ttft_s=ttft,
        e2e_s=e2e,
        tpot_s=(e2e - ttft) / (n - 1) if n > 1 else None,
        target_passes=target,
        draft_passes=draft,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        accepted_per_pass=per_pass,
    )


def _predict(state: _State, *, after_confirm: bool = False) -> None:
    """Predict every variant per request. Before confirmation the overheads are fitted to the profiling
    pass's baseline (these predictions rank the candidates); after it, to the confirmation's baseline
    repeats, timed interleaved with the candidates, so that predicted and measured figures come from the same
    stretch of time (a burst of load during the single profiling pass does not skew the comparison). No
    speculative measurement of the confirmation enters either fit."""
    from runinfra_opt.optimize.costmodel import predict_request
    from runinfra_opt.optimize.stats import summarize

    assert state.engine is not None
    results = state.results
    if after_confirm:
        confirmed_baseline = state.variant_result(BASELINE).measured_requests
        if not confirmed_baseline:
            return
        results.profile["ranking_predicted_tokens_per_s"] = {
            v.name: v.predicted.tokens_per_s for v in results.variants if v.predicted is not None
        }
        cost = _fit_overheads(state, confirmed_baseline)
        results.cost_model["calibrated_after_confirm"] = cost.to_dict()
    else:
        cost = _fit_overheads(state, list(_baseline_records(results).values()))
        results.cost_model["calibrated"] = cost.to_dict()
    predicted: dict[str, list[RequestResult]] = {}
    for variant in state.space:
        rows = []
        for request in state.requests:
            sim = _simulate(state, variant, request)
            if sim is None:
                continue
            prompt_len = len(state.engine.prompt_ids(request))
            ttft, e2e = predict_request(sim, prompt_len, cost, variant)
            rows.append(_predicted_result(request, sim, prompt_len, ttft, e2e))
        predicted[variant.name] = rows
    base_rows = predicted.get(BASELINE.name, [])
    for variant in state.space:
        vr = state.variant_result(variant)
        vr.predicted_requests = predicted[variant.name]
        if vr.predicted_requests:
            vr.predicted = summarize(vr.predicted_requests, base_rows if variant.is_speculative else None)


def rank_predicted(results: RunResults, config: OptimizeConfig) -> list[VariantResult]:
    """Speculative variants, best predicted first (throughput: tokens/s; ttft: TTFT at the percentile, then
    tokens/s). Variants predicted to break `--max-ttft-ms` / `--max-ttft-regression` go last."""
    baseline = results.variant(BASELINE.name)
    base_ttft = baseline.predicted.ttft_s.get(config.percentile) if baseline and baseline.predicted else None

    def breaks_constraint(v: VariantResult) -> bool:
        assert v.predicted is not None
        ttft = v.predicted.ttft_s.get(config.percentile)
        if ttft is None:
            return False
        if config.max_ttft_ms is not None and ttft * 1000 > config.max_ttft_ms:
            return True
        return bool(
            config.max_ttft_regression is not None and base_ttft and ttft > base_ttft * (1 + config.max_ttft_regression)
        )

    def key(v: VariantResult) -> tuple[bool, float, float, tuple[int, int, str]]:
        assert v.predicted is not None
        tps = v.predicted.tokens_per_s
        simpler = Variant.from_dict(v.variant).simplicity_key
        if config.priority == "ttft":
            return (breaks_constraint(v), v.predicted.ttft_s.get(config.percentile, float("inf")), -tps, simpler)
        return (breaks_constraint(v), -tps, 0.0, simpler)

    ranked = [v for v in results.variants if v.name != BASELINE.name and v.predicted is not None]
    return sorted(ranked, key=key)


def _behaviour(vr: VariantResult) -> tuple[Any, ...]:
    """What a variant computes, per its simulation: its drafting model and every request's passes. Two
    variants with the same behaviour (e.g. prompt lookup with max match 2 and 3 finding the same candidates)
    cost the same, so timing both would waste the budget."""
    variant = Variant.from_dict(vr.variant)
    per_request = tuple(
        (r.request_id, r.target_passes, r.draft_passes, r.drafted_tokens, tuple(r.accepted_per_pass))
        for r in vr.predicted_requests
    )
    return (variant.method, variant.draft, variant.exit_layer, per_request)


# ---- phase 7: confirm ---------------------------------------------------------------------------------------


def _confirm_variants(state: _State) -> list[Variant]:
    """Baseline + the candidates to time (stored in the plan so a resume times the same ones)."""
    plan = state.results.config.setdefault("plan", {})
    by_name = {v.name: v for v in state.space}
    if "confirm" in plan:
        return [by_name[name] for name in plan["confirm"]]
    config = state.config
    if config.strategy == "exhaustive":
        chosen = [v for v in state.space if v.is_speculative]
        repeats = int(plan.get("repeats", 2))
    else:
        ranked = []
        seen: set[tuple[Any, ...]] = set()
        for vr in rank_predicted(state.results, config):
            behaviour = _behaviour(vr)
            if behaviour in seen:
                continue  # the same passes as a better-ranked (or equally ranked, simpler) candidate
            seen.add(behaviour)
            ranked.append(by_name[vr.name])
            if len(ranked) == config.confirm:
                break
        base = _baseline_records(state.results)
        baseline_s = sum(base[r.id].e2e_s for r in state.requests if r.id in base)
        candidate_s = []
        for v in ranked:
            vr = state.variant_result(v)
            candidate_s.append(sum(r.e2e_s for r in vr.predicted_requests))
        warm = baseline_s / max(len(state.requests), 1) * WARMUP_TOKENS / max(state.max_tokens, 1)
        planned_repeats = int(plan.get("repeats", 2))
        repeats, count = replan_confirmation(
            remaining_s=state.budget_left(),
            baseline_s=baseline_s,
            candidate_s=candidate_s,
            repeats=planned_repeats,
            warmup_s=warm,
        )
        if config.repeats is not None:
            repeats = config.repeats  # an explicit --repeats is kept even over budget
        if (repeats, count) != (planned_repeats, len(ranked)):
            state.results.notes.append(
                f"confirmation reduced to fit the budget: {count} candidate(s) x {repeats} repeat(s) "
                f"(planned {len(ranked)} x {planned_repeats})"
            )
        chosen = ranked[:count]
    plan["confirm"] = [BASELINE.name] + [v.name for v in chosen]
    plan["repeats"] = repeats
    state.save()
    return [BASELINE, *chosen]


def _confirm(state: _State) -> None:
    from runinfra_opt.bench import compare_to_baseline
    from runinfra_opt.optimize.stats import summarize, summarize_by_category

    assert state.engine is not None
    engine, results = state.engine, state.results
    variants = _confirm_variants(state)
    repeats = int(results.config["plan"]["repeats"])
    reference = {rid: result_to_record(r, BASELINE.name) for rid, r in _baseline_records(results).items()}
    done = {
        (vr.name, r.request_id, r.repeat)
        for vr in (state.variant_result(v) for v in variants)
        for r in vr.measured_requests
    }
    total = len(variants) * len(state.requests) * repeats
    state.reporter.phase("confirm", total, f"confirming {len(variants) - 1} candidate(s) x {repeats} repeat(s)")
    for _ in range(len(done)):
        state.reporter.advance()
    if len(done) < total:
        for variant in variants:  # untimed warm-up per variant (first-call costs stay out of the figures)
            engine.warmup(state.requests[0], variant, max_tokens=WARMUP_TOKENS)
    for repeat in range(repeats):
        for request in state.requests:
            changed = False
            for variant in variants:  # A B C D per request and repeat: drift hits every variant alike
                if (variant.name, request.id, repeat) in done:
                    continue
                record = engine.generate(request, variant, max_tokens=state.max_tokens, repeat=repeat)
                if request.id in reference:
                    compare_to_baseline(record, reference[request.id])
                state.variant_result(variant).measured_requests.append(record_to_result(record))
                changed = True
                state.reporter.advance(f"{request.id} {variant.name}")
            if changed:
                state.save()  # after each request's batch of variants
    state.reporter.end_phase()
    baseline_rows = state.variant_result(BASELINE).measured_requests
    for variant in variants:
        vr = state.variant_result(variant)
        vr.confirmed = True
        others = baseline_rows if variant.is_speculative else None
        vr.measured = summarize(vr.measured_requests, others)
        vr.per_category = summarize_by_category(vr.measured_requests, others)
        mismatched = sorted({r.request_id for r in vr.measured_requests if r.lossless is False})
        if mismatched and variant.is_speculative:
            vr.disqualified = f"greedy output differs from the baseline's on request(s) {', '.join(mismatched)}"
        elif mismatched:
            results.notes.append(
                "the baseline's own output changed between runs on request(s) "
                f"{', '.join(mismatched)} (non-deterministic decoding on this device)"
            )


# ---- helpers for renderers ----------------------------------------------------------------------------------


def predicted_vs_measured(results: RunResults) -> list[dict[str, Any]]:
    """For every confirmed variant: predicted and measured tokens/s and their ratio (and TTFT p50)."""
    rows = []
    for vr in results.variants:
        if not vr.confirmed or vr.predicted is None or vr.measured is None:
            continue
        pred, meas = vr.predicted.tokens_per_s, vr.measured.tokens_per_s
        rows.append(
            {
                "variant": vr.name,
                "predicted_tokens_per_s": pred,
                "measured_tokens_per_s": meas,
                "error": (pred / meas - 1.0) if meas else None,
                "predicted_ttft_p50_s": vr.predicted.ttft_s.get("p50"),
                "measured_ttft_p50_s": vr.measured.ttft_s.get("p50"),
            }
        )
    return rows


ProgressCallback = Callable[[str], None]


def _queue(state: _State, winner: str) -> list[QueueSimulation]:
    """TTFT including queueing under the recorded arrivals (simulated single-replica FIFO), for the baseline
    and the winner, from their measured service times. Empty when the workload records no arrivals."""
    from runinfra_opt.optimize.queueing import simulate_variants

    arrivals = {r.id: r.arrival_s for r in state.requests}
    names = [BASELINE.name] + ([winner] if winner != BASELINE.name else [])
    records = {}
    for name in names:
        vr = state.results.variant(name)
        if vr is not None and vr.measured_requests:
            records[name] = vr.measured_requests
    return simulate_variants(arrivals, records)


def _write_manifest(state: _State) -> Path:
    """Build the manifest from the results, validate it against its schema and write it (`--out`)."""
    from runinfra_opt.manifest import build_manifest, write_manifest

    path = Path(state.config.out)
    write_manifest(path, build_manifest(state.results))
    return path
