"""The guard: the test suite changed nothing under the repository's `.runinfra/` (runs, `latest`, drafts) or
in the user's runinfra-opt cache. conftest snapshots both before any test runs and moves this test last (under
`pytest -n 3`, the last to start: the other workers may still be finishing their last tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import GUARDED, SNAPSHOTS
from tests.isolation import changes, snapshot, user_cache_dir


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_the_suite_left_user_state_alone(name: str) -> None:
    changed = changes(SNAPSHOTS[name], snapshot(GUARDED[name]))
    assert not changed, (
        f"the {name} ({GUARDED[name]}) changed while the suite ran:\n" + "\n".join(changed[:20]) + "\n(the guard "
        "compares before and after: another process using the same directory meanwhile, such as a demo or another "
        "checkout's tests, shows up here too; rerun when it is idle)"
    )


def test_tests_run_in_their_own_directory_and_cache(isolated_cache: Path) -> None:
    """What makes the guard hold: inside a test, the working directory and the cache the tool resolves are
    the test's own, never the repository or the user's cache."""
    from runinfra_opt.models import cache_dir

    assert cache_dir() == isolated_cache
    assert user_cache_dir(os.environ) == isolated_cache
    assert GUARDED["user cache"] != isolated_cache
    assert not Path.cwd().resolve().is_relative_to(GUARDED["repository .runinfra"].parent.resolve())


def test_snapshot_sees_a_moved_latest_link(tmp_path: Path) -> None:
    """The guard would catch the original bug: re-pointing `.runinfra/runs/latest`."""
    runs = tmp_path / ".runinfra" / "runs"
    (runs / "demo-run").mkdir(parents=True)
    (runs / "latest").symlink_to("demo-run")
    before = snapshot(tmp_path / ".runinfra")
    (runs / "latest").unlink()
    (runs / "latest").symlink_to("../../../pytest-of-root/pytest-0/test_x0/run")
    assert changes(before, snapshot(tmp_path / ".runinfra")) == [
        "changed runs/latest: ('link', 'demo-run') -> ('link', '../../../pytest-of-root/pytest-0/test_x0/run')"
    ]
