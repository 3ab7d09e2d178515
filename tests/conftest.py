"""Shared fixtures: tiny real models (built once per session), an isolated cache, the CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.tiny_models import build_pair


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Converted-model cache per session (the bundled GGUF converts once per test session)."""
    cache = tmp_path_factory.getbasetemp() / "runinfra-cache"
    monkeypatch.setenv("RUNINFRA_OPT_CACHE", str(cache))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target_dir, draft_dir): a 4-layer tiny Llama and a 2-layer draft sharing its tokenizer."""
    return build_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
