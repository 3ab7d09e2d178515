"""Phase `baseline`: one timed greedy pass over the planned requests, outputs and timings kept.

Reads `state.requests`, `state.engine`, `state.max_tokens`. Fills `results.profile["baseline"]` (one record
with output ids per request, saved after each: a resume runs only the requests not yet recorded). A session's
later turns are sent with the history the baseline's answers built, and `state.requests` then holds them so
(`restore` rebuilds them on resume): every later phase measures and predicts the same prompts.

On a serving engine, when the space holds a method that drafts from earlier traffic (suffix decoding), it also
fills `results.profile["continuation"]`: per greedy request, the baseline server's tokens past its output, one
more than the longest lookahead (the engine's `greedy_continuation`, untimed). vLLM's last step of a request may
accept drafted tokens past `max_tokens` (or an EOS); the server counts them and adds them to its suffix cache
before the output is cut, so the simulation needs them to hold exactly what the server's cache holds.
"""

from __future__ import annotations

from typing import cast

from runinfra_opt.methods import BASELINE, get_method
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
    _continuations(state)


def _continuations(state: RunState) -> None:
    """`results.profile["continuation"]`: per greedy request, its tokens past the baseline's output (saved after
    each; a resume fetches the rest). A request whose fetched output does not begin with the timed pass's (a
    server that is not deterministic) gets none, with a note: its simulation then ends at the output."""
    from runinfra_opt.engine.protocol import Capability, LoadServer

    assert state.engine is not None
    extra = max((v.lookahead for v in state.space if get_method(v.method).drafts_from_traffic), default=0)
    if not extra or Capability.SERVE_LOAD not in state.engine.capabilities:
        return
    engine = cast(LoadServer, state.engine)
    stored: dict[str, list[int]] = state.results.profile.setdefault("continuation", {})
    base = state.baseline_records()
    todo = [r for r in state.requests if r.greedy and r.id in base and r.id not in stored]
    if not todo:
        return
    state.reporter.phase("continuation", len(todo), "baseline: tokens past each output")
    differ = []
    for request in todo:
        output = list(base[request.id].output_ids or [])
        ids = engine.greedy_continuation(request, len(output), extra + 1)
        same = ids[: len(output)] == output
        if not same:
            differ.append(request.id)
        stored[request.id] = ids[len(output) :] if same else []
        state.save()
        state.reporter.advance(request.id)
    state.reporter.end_phase()
    if differ:
        state.results.add_note(
            f"the baseline server gave another output the second time for {len(differ)} request(s) "
            f"({', '.join(differ[:5])}): their simulation by suffix decoding ends at the output"
        )


def restore(state: RunState) -> None:
    """The planned requests as the baseline pass sent them (sessions' later turns with their history)."""
    if state.engine is None or not any(r.session_id is not None for r in state.requests):
        return
    answers = {
        request_id: state.engine.prompts.decode(record.output_ids or [])
        for request_id, record in state.baseline_records().items()
    }
    state.requests = expand_all(state.requests, answers)
