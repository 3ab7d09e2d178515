"""A confirmation trial: one variant timed with its own baseline repeats, interleaved, on one machine.

Pairing across machines: hardware differs between nodes, so a variant's ratio to the baseline must come from
one node. Each trial pins the variant with its baseline: per request and repeat the baseline, then the variant
(A B A B), on the same engine in the same process, so drift and the node's speed hit both alike. Every record
carries the trial's id (`RequestRecord.trial`) and `stats.paired` pairs only within a trial (by request and
repeat), so the bootstrap of the ratio resamples pairs timed side by side. The variant's output is checked
against the baseline output of the same request and repeat on its node (a lossless check on the hardware that
ran it); the trial's baseline outputs are checked against the driver's baseline pass, as the local executor
does, so a node whose greedy output differs is reported.

`run_trial` is what a worker runs: it opens the engine there from the run's configuration, measures and
returns the records with a description of the node. It knows nothing of the run directory or of Ray.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from runinfra_opt.engine.registry import EngineSetup
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState
from runinfra_opt.records import RequestRecord, compare_to_baseline
from runinfra_opt.workload.model import Request


@dataclass(frozen=True)
class TrialSpec:
    """What a worker needs to run one trial (picklable: sent to the worker as is)."""

    id: str
    variant: Variant
    """The variant timed; BASELINE for a trial of the baseline alone (when no candidate is confirmed)."""
    requests: tuple[Request, ...]
    reference: dict[str, RequestRecord]
    """The driver's baseline pass (with output ids), by request id."""
    repeats: int
    max_tokens: int
    setup: EngineSetup
    """What opens the engine on the worker (the run's, with the trial's threads)."""


@dataclass
class TrialOutcome:
    """A finished trial: the baseline's records and the variant's, all tagged with the trial id."""

    id: str
    baseline: list[RequestRecord]
    measured: list[RequestRecord]
    node: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    setup_s: float = 0.0
    """Of `wall_s`: opening the engine (and, in a fresh worker, importing torch) and the warm-up."""


def trial_specs(state: RunState, variants: list[Variant], *, threads: int | None) -> list[TrialSpec]:
    """One trial per speculative variant of `variants` (its id: the variant's name); a single baseline trial
    when there is none."""
    config = state.config
    reference = state.baseline_records()
    timed = [v for v in variants if v.is_speculative] or [BASELINE]
    return [
        TrialSpec(
            id=variant.name,
            variant=variant,
            requests=tuple(state.requests),
            reference=reference,
            repeats=state.plan.repeats,
            max_tokens=state.max_tokens,
            setup=config.engine_setup(threads=threads),
        )
        for variant in timed
    ]


def run_trial(spec: TrialSpec) -> TrialOutcome:
    """Open the engine here, warm up, then time baseline and variant per request and repeat (A B A B)."""
    from runinfra_opt.engine.registry import open_engine

    started = time.perf_counter()
    engine = open_engine(spec.setup)
    try:
        speculative = spec.variant.is_speculative
        order = [BASELINE, spec.variant] if speculative else [BASELINE]
        for variant in order:  # untimed warm-up (first-call costs stay out of the figures)
            engine.warmup(spec.requests[0], variant, max_tokens=WARMUP_TOKENS)
        setup_s = time.perf_counter() - started
        baseline: list[RequestRecord] = []
        measured: list[RequestRecord] = []
        for repeat in range(spec.repeats):
            for request in spec.requests:
                base = engine.generate(request, BASELINE, max_tokens=spec.max_tokens, repeat=repeat)
                base.trial = spec.id
                if request.id in spec.reference:
                    compare_to_baseline(base, spec.reference[request.id])
                baseline.append(base)
                if speculative:
                    record = engine.generate(request, spec.variant, max_tokens=spec.max_tokens, repeat=repeat)
                    record.trial = spec.id
                    compare_to_baseline(record, base)
                    measured.append(record)
        node = describe_node(engine.environment())
    finally:
        engine.close()
    return TrialOutcome(spec.id, baseline, measured, node, wall_s=time.perf_counter() - started, setup_s=setup_s)


def describe_node(environment: dict[str, Any]) -> dict[str, Any]:
    """Where a trial ran: host, Ray node id and IP (on a Ray worker), device and its name (the GPU model or
    the CPU model), the GPU driver on CUDA, CPU count, threads and versions."""
    keys = ("device", "device_name", "cpu", "cpu_count", "threads", "dtype", "python", "torch", "runinfra_opt")
    info: dict[str, Any] = {"host": socket.gethostname(), "platform": platform.platform()}
    info.update({key: environment[key] for key in keys if key in environment})
    if str(environment.get("device", "")).startswith("cuda"):
        info["gpu_driver"] = _nvidia_driver()
    try:
        import ray

        if ray.is_initialized():
            info["ray_node_id"] = ray.get_runtime_context().get_node_id()
            info["ip"] = ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover - the local executor without Ray
        pass
    info["pid"] = os.getpid()
    return info


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if lines else None
