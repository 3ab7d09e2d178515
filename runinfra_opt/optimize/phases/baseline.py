"""Phase `baseline`: one timed greedy pass over the planned requests, outputs and timings kept.

Reads `state.requests`, `state.engine`, `state.max_tokens`. Fills `results.profile["baseline"]` (one record
with output ids per request, saved after each: a resume runs only the requests not yet recorded).
"""

from __future__ import annotations

from runinfra_opt.methods import BASELINE
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState


def run(state: RunState) -> None:
    assert state.engine is not None
    engine, results = state.engine, state.results
    done = state.baseline_records()
    todo = [r for r in state.requests if r.id not in done]
    state.reporter.phase("baseline", len(state.requests), "baseline")
    for _ in range(len(state.requests) - len(todo)):
        state.reporter.advance()
    if todo:
        engine.warmup(todo[0], BASELINE, max_tokens=WARMUP_TOKENS)
    stored = results.profile.setdefault("baseline", [])
    for request in todo:
        record = engine.generate(request, BASELINE, max_tokens=state.max_tokens)
        stored.append(record.model_dump())
        state.save()
        state.reporter.advance(request.id)
    state.reporter.end_phase()
