"""Cancellation as CI systems do it: SIGTERM (then SIGKILL after a grace period), or SIGINT (Ctrl-C).

Both signals raise an exception in the main thread: SIGINT Python's own `KeyboardInterrupt`, SIGTERM
`Terminated`, a subclass of it. Every place that keeps finished work on an interruption (`optimize` writes its
results file with an "interrupted" note; `draft distill` saves a checkpoint; engines close their servers and
workers in `finally`) therefore handles both alike, and the CLI maps them to exit codes 130 and 143
(128 + the signal's number, as shells do). The measurement in flight when the signal arrives is dropped, not
waited for: a grace period is short (GitHub Actions sends SIGINT, SIGTERM 7.5 s later, SIGKILL 2.5 s after),
and everything finished before it is already on disk.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

CANCEL_GRACE_S = 1.0
"""Seconds a child (a vLLM server) gets to stop on SIGTERM once this process is being cancelled, before SIGKILL:
the whole exit must fit a CI grace period (5 s is this tool's promise; docs/optimize.md, Faults). A ready server
stops within it; one still starting up acts on SIGTERM only after its start-up and is killed whatever the grace
(docs/engines.md, "Never a server left behind")."""

_cancelled: list[str] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop now, keeping what is finished (exit 143)."""


def cancelling() -> bool:
    """True once SIGTERM or SIGINT has arrived in this process (children are then stopped with `CANCEL_GRACE_S`)."""
    return bool(_cancelled)


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    _cancelled.append("SIGTERM")
    raise Terminated(f"signal {signum}")


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    _cancelled.append("SIGINT")
    raise KeyboardInterrupt


@contextmanager
def cancellation() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` and SIGINT `KeyboardInterrupt` (unless SIGINT was ignored
    by whoever started this process, e.g. `nohup`). Only the main thread can install handlers: elsewhere
    the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_term = signal.signal(signal.SIGTERM, raise_terminated)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield
    finally:
        _cancelled.clear()
        # getsignal() gives None for a handler not installed from Python: leave that one as it is now.
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
