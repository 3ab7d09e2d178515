"""Phase `baseline`: one timed greedy pass over the planned requests, outputs and timings kept.

Reads `state.requests`, `state.engine`, `state.max_tokens`. Fills `results.profile["baseline"]` (one record
with output ids per request, saved after each: a resume runs only the requests not yet recorded). A session's
later turns are sent with the history the baseline's answers built, and `state.requests` then holds them so
(`restore` rebuilds them on resume): every later phase measures and predicts the same prompts.
"""

from __future__ import annotations

from runinfra_opt.methods import BASELINE
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState
from runinfra_opt.workload.sessions import SessionHistory, expand_all


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
    history = SessionHistory()
    sent = []
    for request in state.requests:
        full = history.expand(request)
        sent.append(full)
        record = done.get(request.id)
        if record is None:
            record = engine.generate(full, BASELINE, max_tokens=state.max_tokens)
            stored.append(record.model_dump())
            state.save()
            state.reporter.advance(request.id)
        if full.session_id is not None:
            history.answer(full, engine.prompts.decode(record.output_ids or []))
    state.requests = sent
    state.reporter.end_phase()


def restore(state: RunState) -> None:
    """The planned requests as the baseline pass sent them (sessions' later turns with their history)."""
    if state.engine is None or not any(r.session_id is not None for r in state.requests):
        return
    answers = {
        request_id: state.engine.prompts.decode(record.output_ids or [])
        for request_id, record in state.baseline_records().items()
    }
    state.requests = expand_all(state.requests, answers)
