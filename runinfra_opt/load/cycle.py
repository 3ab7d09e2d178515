"""A load level's requests when it needs more than the sample holds (`--capacity-requests`): the planned requests
sent again, in order, as copies, until the level holds the count asked for.

- A copy is the recorded request with `copy` = n (its n-th repetition), id `<id>+<n>` and, in a session,
  session id `<session>+<n>` (a session is copied whole, turn order kept). The serving engine gives each
  repetition a prefix-cache salt of its own, so a copy's prompt is never served from its original's cache.
- Recorded arrival times repeat with a period of the sample's span plus one mean gap between arrivals, so the
  cycled schedule keeps the recorded rate and pattern.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from runinfra_opt.workload.model import Request


def _period(requests: Sequence[Request]) -> float | None:
    """The recorded schedule's repeat period (its span x n / (n - 1)); None without arrival times on all."""
    arrivals = [r.arrival_s for r in requests]
    if len(arrivals) < 2 or any(a is None for a in arrivals):
        return None
    times = [a for a in arrivals if a is not None]
    span = max(times) - min(times)
    return span * len(times) / (len(times) - 1) if span > 0 else None


def cycle(requests: Sequence[Request], count: int | None) -> list[Request]:
    """`requests` followed by as many copies, in order, as make `count` (None or at most the sample: the sample)."""
    out = list(requests)
    if not count or count <= len(out) or not out:
        return out
    period = _period(requests)
    repetition = 0
    while len(out) < count:
        repetition += 1
        for request in requests[: count - len(out)]:
            arrival = request.arrival_s
            if arrival is not None:
                arrival += repetition * (period or 0.0)
            out.append(
                dataclasses.replace(
                    request,
                    id=f"{request.id}+{repetition}",
                    session_id=f"{request.session_id}+{repetition}" if request.session_id is not None else None,
                    arrival_s=arrival,
                    copy=repetition,
                )
            )
    return out


def cache_salt(salt: str, request: Request) -> str:
    """The prefix-cache salt of `request` in a level salted `salt`: a repetition of the sample caches apart."""
    return f"{salt}-c{request.copy}" if request.copy else salt


def original_id(request: Request) -> str:
    """The id of the recorded request `request` copies (its own for the recorded one)."""
    return request.id.removesuffix(f"+{request.copy}") if request.copy else request.id
