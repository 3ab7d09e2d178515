"""Sessions: multi-turn traffic whose later turns carry only their new messages in the workload, their history
(the session's earlier turns and the answers they got) being built when they are sent.

`SessionHistory` builds each turn's full prompt from the answers recorded for the session so far; the load
runner records the answers the server under test gives, `bench` and `optimize` the baseline's (so every variant is
measured on the same prompts). `with_predecessors` keeps a subsample replayable (a turn needs its earlier turns).
Pure Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence

from runinfra_opt.workload.model import Message, Request


class SessionHistory:
    """The conversation so far of every session: each turn's prompt is the previous turn's prompt, its answer
    and the turn's own messages."""

    def __init__(self) -> None:
        self._history: dict[str, tuple[int, tuple[Message, ...]]] = {}

    def ready(self, request: Request) -> bool:
        """Whether the turn before `request` has been answered (always true outside a session's later turns)."""
        if not request.continues_session:
            return True
        assert request.session_id is not None
        assert request.turn is not None
        done = self._history.get(request.session_id)
        return done is not None and done[0] >= request.turn - 1

    def expand(self, request: Request) -> Request:
        """`request` with its session's history before its own messages (unchanged outside a later turn).
        Raises RuntimeError when the previous turn has no answer yet (a caller's ordering bug)."""
        if not request.continues_session or request.history_included:
            return request
        assert request.session_id is not None
        assert request.turn is not None
        done = self._history.get(request.session_id)
        if done is None or done[0] != request.turn - 1:
            raise RuntimeError(
                f"request {request.id}: turn {request.turn} of session {request.session_id!r} sent before turn "
                f"{request.turn - 1} was answered"
            )
        return dataclasses.replace(request, messages=(*done[1], *(request.messages or ())), history_included=True)

    def answer(self, expanded: Request, text: str) -> None:
        """Record the answer to a turn (`expanded`: the request as sent, history included)."""
        if expanded.session_id is None or expanded.turn is None:
            return
        history = (*(expanded.messages or ()), Message("assistant", text))
        self._history[expanded.session_id] = (expanded.turn, history)


def expand_all(requests: Sequence[Request], answers: dict[str, str]) -> list[Request]:
    """Every request with its session's history, built from `answers` (request id -> the answer text it got) in
    file order. A turn whose predecessor has no answer in `answers` is left as it is."""
    history = SessionHistory()
    out = []
    for request in requests:
        full = history.expand(request) if history.ready(request) else request
        out.append(full)
        if request.id in answers:
            history.answer(full, answers[request.id])
    return out


def with_predecessors(requests: Iterable[Request], chosen: Collection[str]) -> set[str]:
    """The ids in `chosen` plus those of every earlier turn of their sessions (a later turn cannot be sent
    without them)."""
    requests = list(requests)
    needed: dict[str, int] = {}
    for request in requests:
        if request.id in chosen and request.session_id is not None and request.turn is not None:
            needed[request.session_id] = max(needed.get(request.session_id, 0), request.turn)
    return set(chosen) | {
        r.id
        for r in requests
        if r.session_id is not None and r.turn is not None and r.turn <= needed.get(r.session_id, 0)
    }


def has_sessions(requests: Iterable[Request]) -> bool:
    return any(r.continues_session for r in requests)
