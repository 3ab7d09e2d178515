"""Atomic file writes: whatever a user already has is never left half-written."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


def safe_name(text: str) -> str:
    """`text` as a file name: every run of characters other than letters, digits, `_`, `.` and `-` becomes `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


@contextmanager
def atomic_open(path: Path) -> Iterator[TextIO]:
    """Open a temp file beside `path` for writing text; on success fsync it and rename it over `path`, with
    the umask's usual permissions (not the 0600 of a temp file). On any error the temp file is removed and
    `path` is left as it was; an OSError names `path` (a full disk's error names no file of its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None  # name the file the write was for
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (see `atomic_open`)."""
    with atomic_open(path) as fh:
        fh.write(text)
