"""What the test suite must leave untouched, as a comparable snapshot (see conftest and the guard test)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def user_cache_dir(environ: Mapping[str, str]) -> Path:
    """The cache `runinfra_opt.models.cache_dir()` would use in this environment (the same rule, restated so
    that the guard does not depend on the code it guards)."""
    if environ.get("RUNINFRA_OPT_CACHE"):
        return Path(environ["RUNINFRA_OPT_CACHE"])
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runinfra-opt"


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under `root` (not following links): a link's target, a file's size and modification time,
    a directory's presence. Empty when `root` does not exist."""
    entries: dict[str, tuple[object, ...]] = {}
    if not root.exists() and not root.is_symlink():
        return entries
    entries["."] = ("dir",)  # a root created by the suite, even empty, is a change
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                entries[rel] = ("link", str(path.readlink()))
            elif path.is_dir():
                entries[rel] = ("dir",)
            else:
                entries[rel] = ("file", st.st_size, st.st_mtime_ns)
    return entries


def changes(before: Mapping[str, tuple[object, ...]], after: Mapping[str, tuple[object, ...]]) -> list[str]:
    """One line per entry added, removed or changed."""
    lines = [f"added {k}" for k in sorted(after.keys() - before.keys())]
    lines += [f"removed {k}" for k in sorted(before.keys() - after.keys())]
    common = sorted(before.keys() & after.keys())
    lines += [f"changed {k}: {before[k]} -> {after[k]}" for k in common if before[k] != after[k]]
    return lines
