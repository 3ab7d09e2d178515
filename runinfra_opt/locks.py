"""File locks on the shared cache, so that two runs on one machine (two pipeline jobs sharing a cache volume)
write each derived artefact once: the first takes the lock and writes it atomically, the second waits for the
lock, then finds the artefact there and reuses it.

Locks are advisory OS locks (`filelock`): the kernel releases them when a process dies, even by SIGKILL, so
a cancelled job never leaves a stale lock behind. The lock file lies beside what it guards
(`<artefact>.lock`); it holds nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def lock_path(artefact: Path) -> Path:
    """The lock file that guards `artefact` (a file or a directory)."""
    return artefact.with_name(artefact.name + ".lock")


@contextmanager
def cache_lock(artefact: Path, what: str, *, note: Callable[[str], None] = _stderr) -> Iterator[None]:
    """Hold the lock that guards `artefact` for the duration of the block. When another process holds it,
    say so once (`note`) and wait: it is writing the same thing, which the caller then re-reads."""
    path = lock_path(artefact)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        note(f"waiting for another runinfra-opt process that is writing {what} ({path})")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
