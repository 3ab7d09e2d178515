"""An engine plugs in through the engine registry and declares its capabilities: `optimize` on an engine that
can only generate (like an HTTP serving engine) skips the phases it cannot run, says why, leaves out the
variants the engine cannot run, and times every other variant (exhaustive) on the tiny models."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine import registry as engine_registry
from runinfra_opt.engine.protocol import Capability
from runinfra_opt.manifest import check_manifest_file
from runinfra_opt.methods import Variant
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import load_results
from runinfra_opt.workload.model import Request


class GenerateOnly:
    """The transformers engine seen as an engine that can only generate and count passes."""

    name = "generate-only"
    capabilities = frozenset({Capability.PASS_COUNTS})

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.prompts = inner.prompts

    @property
    def target_layers(self) -> int:
        return int(self._inner.target_layers)

    def supports(self, variant: Variant) -> str | None:
        return "no self-drafting here" if variant.method == "early_exit" else self._inner.supports(variant)

    def generate(self, request: Request, variant: Variant, *, max_tokens: int, repeat: int = 0) -> RequestRecord:
        record: RequestRecord = self._inner.generate(request, variant, max_tokens=max_tokens, repeat=repeat)
        return record

    def warmup(self, request: Request, variant: Variant, *, max_tokens: int = 8) -> None:
        self._inner.warmup(request, variant, max_tokens=max_tokens)

    def model_infos(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        infos: tuple[dict[str, Any], list[dict[str, Any]]] = self._inner.model_infos()
        return infos

    def environment(self) -> dict[str, Any]:
        return {**self._inner.environment(), "engine": self.name}

    def close(self) -> None:
        self._inner.close()


def _open(target: str, drafts: Sequence[str] = (), **options: Any) -> GenerateOnly:
    from runinfra_opt.engine.hf.engine import open_engine

    return GenerateOnly(open_engine(target, drafts, **options))


@pytest.fixture
def generate_only() -> Iterator[None]:
    engine_registry.register("generate-only", _open)
    try:
        yield
    finally:
        engine_registry.unregister("generate-only")


WORKLOAD = [
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc abc", "max_tokens": 24},
    {"id": "chat-1", "category": "chat", "messages": [{"role": "user", "content": "a story about a cat"}]},
]


def test_unknown_engine_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["optimize", "--engine", "warp", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert "--engine warp: unknown engine; available: transformers" in result.output


def test_optimize_on_an_engine_without_profiling(
    generate_only: None, runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path
) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in WORKLOAD), encoding="utf-8")
    args = ["optimize", "--engine", "generate-only", "--workload", str(workload), "--target", str(tiny_models[0])]
    args += ["--draft", str(tiny_models[1]), "--lookahead", "2", "--ngram-max", "2", "--exit-layers", "2"]
    args += ["--threads", "1", "--repeats", "1", "--max-tokens", "24", "--runs-dir", str(tmp_path / "runs")]
    args += ["--out", str(tmp_path / "manifest.yaml"), "--json"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = load_results(next((tmp_path / "runs").glob("*/results.json")))
    assert results.status == "complete"
    skipped = results.phases_skipped
    assert set(skipped) == {"cost", "check_cost", "profile", "predict", "repredict"}
    assert "generate-only engine has no cost_table, profile capability" in skipped["profile"]
    # Early exit is left out (the engine cannot run it), with a note; the rest is timed, none predicted.
    assert {v.name for v in results.variants} == {"baseline", "ngram-n2-k2", "draft:tiny-draft-k2"}
    assert any("left out early_exit-l2-k2" in note.text for note in results.notes_of("left_out"))
    assert any("every variant is timed" in note.text for note in results.notes)
    for v in results.variants:
        assert v.confirmed
        assert v.predicted is None
        assert v.measured is not None
        assert len(v.measured_requests) == len(WORKLOAD)
    assert results.decision is not None
    assert check_manifest_file(tmp_path / "manifest.yaml") == []
    # Every output renders from such a run (nothing predicted).
    run_dir = next((tmp_path / "runs").glob("*/results.json")).parent
    for fmt in ("table", "markdown", "html"):
        shown = runner.invoke(app, ["report", str(run_dir), "--format", fmt], catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
