"""Shared fixtures: isolation from the user's state, tiny real models (built once per session), the CLI runner.

Isolation: no test may read or write the project's `.runinfra/` or the user's cache (a test run once pointed
the project's `.runinfra/runs/latest` to a pytest directory). Before any fixture of any scope runs, the session
moves to a working directory and a cache of its own; every test then gets a fresh working directory and a
fresh cache (`RUNINFRA_OPT_CACHE`, `XDG_CACHE_HOME`). Subprocesses inherit both. Only converted models may be
shared, read-mostly, through the explicit `shared_model_cache` fixture (the bundled SmolLM2 converts once
per session). `tests/test_zz_isolation_guard.py` checks at the end that nothing changed where it must not.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

# One torch thread per test process unless a test asks for more (`--threads N`): `make test` runs three workers on
# a 2-core machine, and two processes each running a 2-thread torch (or a Ray trial beside one) wait on each
# other's descheduled threads at every parallel op: in the full suite of 2026-12-04 the Ray executor's structure
# test took 211 s against 18 s alone, beside `optimize` on SmolLM2 with --threads 2. Set before torch is imported
# anywhere in the suite; subprocesses (CLI drivers, lock jobs, vLLM servers, which use one thread here anyway)
# inherit it. A value already in the environment is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.isolation import snapshot, user_cache_dir  # noqa: E402 (after OMP_NUM_THREADS)
from tests.suite import SHARED_MODELS_ENV  # noqa: E402
from tests.tiny_models import build_pair  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A suite started in the background of a script (`cmd &` without job control, or under `nohup`) inherits
    # SIGINT ignored, and every process a test starts would inherit it too: the tests that press Ctrl-C on the CLI
    # or on a server's driver then wait for a signal that never acts (both failed so under `-n 2` in the full
    # suites of 2026-12-03, started that way). They test what a user's Ctrl-C does, so each test process takes
    # Python's own handler back and the processes it starts begin with SIGINT at its default.
    signal.signal(signal.SIGINT, signal.default_int_handler)

FAKE_VLLM = Path(__file__).parent / "fake_vllm"

REPO = Path(__file__).resolve().parents[1]
GUARDED = {"repository .runinfra": REPO / ".runinfra", "user cache": user_cache_dir(os.environ)}
"""What the guard test checks (computed from the environment the suite was started with)."""
SNAPSHOTS: dict[str, dict[str, tuple[object, ...]]] = {name: snapshot(path) for name, path in GUARDED.items()}
"""Taken when pytest imports this file, before any test or fixture runs."""
GUARD_MODULE = "test_zz_isolation_guard.py"


FIRST_MODULE = "test_vllm_e2e.py"
"""The real vLLM servers (the suite's longest module, mostly one core compiling and serving): first, so that under
`pytest -n 3 --dist loadfile` one worker runs them while the others run the rest (`make test` runs it as a part of
its own: `PARTS`)."""


QUIET = "quiet"
"""The marker of a test that measures time or memory other CPU-heavy work would skew (a stand-in server's speed
against its prediction, a replay that falls behind its schedule and piles requests up in flight). Under
`pytest -n 3` another worker may be running real vLLM servers, which take both cores: a quiet test holds the
suite's quiet lock shared, the real servers' module holds it exclusively, so the two never overlap; and the
files holding quiet tests run last, after the vLLM module has ended, so that nothing waits in practice. `make test`
runs them as a part of their own, after the real servers' part (tests/suite.py)."""


LONGEST_QUIET = (
    "test_optimize_vllm_predict.py",
    "test_capacity_benchmark.py",
    "test_capacity.py",
    "test_capacity_throughput.py",
    "test_kschedule_served.py",
)
"""The quiet files that take longest, longest first (each 1-3 minutes in a full suite, mostly waiting on the
stand-in server: `git show e14cd7e:docs/measurements.md`, Experiments without a script, 2026-12-07 05:32 and
06:15). The quiet files are the suite's tail, where the three workers take the next file as they finish one:
the long ones handed out first and the short ones last end the three workers close together."""


PARTS = ("vllm", "quiet", "rest")
"""The suite's parts (`--part`), which `make test` runs as separate sessions (tests/suite.py): the real vLLM
servers' module, then the files holding quiet tests, one after the other, beside the rest. Each part holds the
isolation guard too."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        choices=("all", *PARTS),
        default="all",
        help="run one part of the suite: vllm (the real vLLM servers' module), quiet (the files holding quiet "
        "tests) or rest (every other file); each with the isolation guard (default: all)",
    )


def part_of(name: str, quiet_files: set[str]) -> str | None:
    """The part a test file belongs to (None for the isolation guard, which is in every part)."""
    if name == GUARD_MODULE:
        return None
    if name == FIRST_MODULE:
        return "vllm"
    return "quiet" if name in quiet_files else "rest"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests of `--part` only; then the real vLLM servers' tests first, then the rest, then the files
    holding quiet tests (the longest first), the isolation guard last, whatever the file order or selection (files
    stay whole: `--dist loadfile` hands out files, in this order under `--no-loadscope-reorder`)."""
    quiet_files = {item.path for item in items if item.get_closest_marker(QUIET) is not None}
    part = config.getoption("--part")
    if part != "all":
        names = {path.name for path in quiet_files}
        kept = [item for item in items if part_of(item.path.name, names) in (part, None)]
        if len(kept) < len(items):
            ids = {id(item) for item in kept}
            config.hook.pytest_deselected(items=[item for item in items if id(item) not in ids])
            items[:] = kept

    def rank(item: pytest.Item) -> tuple[int, int]:
        if item.path.name == FIRST_MODULE:
            return 0, 0
        if item.path.name == GUARD_MODULE:
            return 3, 0
        if item.path in quiet_files:
            name = item.path.name
            return 2, LONGEST_QUIET.index(name) if name in LONGEST_QUIET else len(LONGEST_QUIET)
        return 1, 0

    items.sort(key=rank)


@contextmanager
def quiet_lock(tmp_path_factory: pytest.TempPathFactory, *, exclusive: bool) -> Iterator[None]:
    """The suite's quiet lock (see QUIET): one file that every xdist worker of this run shares (their base
    temporary directories are siblings), locked with flock, which the kernel releases if a worker dies."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "quiet.lock"
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _quiet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A quiet test runs holding the quiet lock shared (before its other fixtures start any server)."""
    if request.node.get_closest_marker(QUIET) is None:
        yield
        return
    with quiet_lock(tmp_path_factory, exclusive=False):
        yield


def _isolate(monkeypatch: pytest.MonkeyPatch, root: Path) -> Path:
    (root / "cwd").mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(root / "cwd")
    monkeypatch.setenv("RUNINFRA_OPT_CACHE", str(root / "cache" / "runinfra-opt"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    return root / "cache" / "runinfra-opt"


@pytest.fixture(scope="session", autouse=True)
def _isolated_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """For session- and module-scoped fixtures (they run before any function-scoped one)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _isolate(monkeypatch, tmp_path_factory.mktemp("session"))
        yield


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test: its own working directory and an empty cache; returns the cache directory (what
    `runinfra_opt.models.cache_dir()` gives inside the test)."""
    return _isolate(monkeypatch, tmp_path_factory.mktemp("iso"))


@pytest.fixture(scope="session")
def _session_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted models' directory, one for the whole run: under xdist every worker shares it (their base
    temporary directories are siblings), so that SmolLM2 is converted once per run, not once per worker (about a
    minute of a core each time). `make test` runs the suite's parts as separate sessions (tests/suite.py) and hands
    them one such directory of its own in `SHARED_MODELS_ENV`."""
    if os.environ.get(SHARED_MODELS_ENV):
        return Path(os.environ[SHARED_MODELS_ENV])
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.getbasetemp().parent / "shared-models"
        path.mkdir(exist_ok=True)
        return path
    return tmp_path_factory.mktemp("shared-models")


@pytest.fixture
def shared_model_cache(isolated_cache: Path, _session_models: Path) -> Path:
    """Share converted models (only those) across the run: the test's `<cache>/models` links to one
    directory (`_session_models`). Conversions are keyed by the GGUF's sha256 and written under a file lock, so sharing
    them cannot change a result; cost models, teacher data and runs stay per test."""
    isolated_cache.mkdir(parents=True, exist_ok=True)
    (isolated_cache / "models").symlink_to(_session_models, target_is_directory=True)
    return isolated_cache


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): a 4-layer tiny Llama and a 2-layer draft sharing its tokenizer."""
    return build_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> str:
    """The python to launch the stand-in vLLM server (tests/fake_vllm) with, in its default mode."""
    monkeypatch.setenv("PYTHONPATH", str(FAKE_VLLM))
    monkeypatch.delenv("FAKE_VLLM_MODE", raising=False)
    monkeypatch.delenv("FAKE_VLLM_SPEC", raising=False)
    monkeypatch.delenv("FAKE_VLLM_STEP", raising=False)
    monkeypatch.delenv("FAKE_VLLM_BASE", raising=False)
    # the stand-in's worker does not poll after its last step: no settling between two live servers
    monkeypatch.setattr("runinfra_opt.engine.vllm.pool.SWITCH_SETTLE_S", 0.0)
    return sys.executable


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
