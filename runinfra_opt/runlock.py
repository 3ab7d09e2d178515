"""The run lock: how `report` and `optimize --resume` tell a live run from one whose process died without a word
(SIGKILL, the kernel's OOM killer, a lost machine).

A running `optimize` holds an exclusive advisory lock (`flock`) on `<run dir>/run.lock` for as long as it runs;
the kernel releases it when the process ends in any way, so a run whose results still say `running` while
nobody holds its lock has died. The lock file holds the owner's host and process id (also written to
results.json); the lock, not those, decides. Locks hold on local file systems and NFSv4.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_LOCK_FILE = "run.lock"


@dataclass(frozen=True)
class Owner:
    """The process that holds (or last held) a run's lock."""

    host: str
    pid: int
    since: str
    """UTC ISO-8601: when it took the lock."""

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "since": self.since}

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host}"


class RunBusy(Exception):
    """Another process holds the run's lock."""

    def __init__(self, owner: Owner | None) -> None:
        self.owner = owner
        super().__init__(str(owner) if owner else "another process")


def _read_owner(path: Path) -> Owner | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Owner(host=str(data["host"]), pid=int(data["pid"]), since=str(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class RunLock:
    """The lock a running `optimize` holds on its run directory (`acquire`, then `release` when it ends)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / RUN_LOCK_FILE
        self.owner: Owner | None = None
        self._fd: int | None = None

    def acquire(self) -> Owner:
        """Take the lock without waiting and write this process into it; raise `RunBusy` if another holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunBusy(_read_owner(self.path)) from None
            raise
        owner = Owner(socket.gethostname(), os.getpid(), datetime.now(UTC).isoformat(timespec="seconds"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner.to_dict()) + "\n").encode(), 0)
        self._fd, self.owner = fd, owner
        return owner

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def holder(run_dir: Path) -> Owner | None:
    """The live process that holds `run_dir`'s lock, or None when nobody does (never run under a lock, finished,
    or died). Reads only: never creates the lock file."""
    path = Path(run_dir) / RUN_LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read_owner(path) or Owner("?", 0, "?")
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
