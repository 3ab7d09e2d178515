"""Jobs for the two-process cache tests (tests/test_cache_locks.py), run as `python -m tests.lock_jobs JOB
READY GO ARGS...`: each process sets up (imports, loads its model), touches READY, waits for GO so that both
reach the shared cache at the same moment, does its job and prints what it did as one JSON line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _barrier(ready: Path, go: Path) -> None:
    ready.touch()
    while not go.exists():
        time.sleep(0.002)


def convert(ready: Path, go: Path, spec: str) -> dict[str, Any]:
    """Convert a GGUF model into the cache (`ensure_converted`)."""
    from runinfra_opt.models import ensure_converted, resolve_model

    resolved = resolve_model(spec)
    _barrier(ready, go)
    target = ensure_converted(resolved)
    return {"dir": str(target), "inode": target.stat().st_ino}


def costs(ready: Path, go: Path, target: str) -> dict[str, Any]:
    """Measure (or read from the cache) a model's forward costs, with one early-exit layer."""
    from runinfra_opt.engine.hf.cost import measure_costs
    from runinfra_opt.models import load_model

    loaded = load_model(target, device="cpu", dtype="float32")
    _barrier(ready, go)
    samples, provenance = measure_costs(loaded, exit_layers=(2,), threads=1)
    return {"samples": len(samples), **provenance}


def teacher(ready: Path, go: Path, target: str, workload: str) -> dict[str, Any]:
    """Generate (or read from the cache) the teacher data of a workload."""
    from runinfra_opt.distill.data import build_teacher_data
    from runinfra_opt.engine.prompts import PromptTokenizer
    from runinfra_opt.models import load_model
    from runinfra_opt.workload import load_workload

    loaded = load_model(target, device="cpu", dtype="float32")
    prompts = PromptTokenizer.for_model(loaded.model, loaded.tokenizer, label=loaded.name)
    requests = load_workload(workload)
    stages: list[str] = []
    _barrier(ready, go)
    data = build_teacher_data(
        loaded, requests, prompts.prompt_ids, max_tokens=16, top_k=4, progress=lambda s, d, t: stages.append(s)
    )
    return {"fingerprint": data.fingerprint, "stages": sorted(set(stages))}


JOBS = {"convert": convert, "costs": costs, "teacher": teacher}

if __name__ == "__main__":
    job, ready_file, go_file, *args = sys.argv[1:]
    print(json.dumps(JOBS[job](Path(ready_file), Path(go_file), *args)))
