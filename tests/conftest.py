"""Shared fixtures: isolation from the user's state, tiny real models (built once per session), the CLI runner.

Isolation: no test may read or write the project's `.runinfra/` or the user's cache (a test run once pointed
the project's `.runinfra/runs/latest` to a pytest directory). Before any fixture of any scope runs, the session
moves to a working directory and a cache of its own; every test then gets a fresh working directory and a
fresh cache (`RUNINFRA_OPT_CACHE`, `XDG_CACHE_HOME`). Subprocesses inherit both. Only converted models may be
shared, read-mostly, through the explicit `shared_model_cache` fixture (the bundled SmolLM2 converts once
per session). `tests/test_zz_isolation_guard.py` checks at the end that nothing changed where it must not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.isolation import snapshot, user_cache_dir
from tests.tiny_models import build_pair

FAKE_VLLM = Path(__file__).parent / "fake_vllm"

REPO = Path(__file__).resolve().parents[1]
GUARDED = {"repository .runinfra": REPO / ".runinfra", "user cache": user_cache_dir(os.environ)}
"""What the guard test checks (computed from the environment the suite was started with)."""
SNAPSHOTS: dict[str, dict[str, tuple[object, ...]]] = {name: snapshot(path) for name, path in GUARDED.items()}
"""Taken when pytest imports this file, before any test or fixture runs."""
GUARD_MODULE = "test_zz_isolation_guard.py"


FIRST_MODULE = "test_vllm_e2e.py"
"""The real vLLM servers (~10 minutes, mostly one core compiling and serving): first, so that under
`pytest -n 2 --dist loadfile` (make test) one worker runs them while the other runs the rest."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real vLLM servers' tests first, the isolation guard last, whatever the file order or selection."""
    items.sort(key=lambda item: 0 if item.path.name == FIRST_MODULE else 2 if item.path.name == GUARD_MODULE else 1)


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
    return tmp_path_factory.mktemp("shared-models")


@pytest.fixture
def shared_model_cache(isolated_cache: Path, _session_models: Path) -> Path:
    """Share converted models (only those) across the session: the test's `<cache>/models` links to one
    session directory. Conversions are keyed by the GGUF's sha256 and written under a file lock, so sharing
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
    return sys.executable


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
