"""The method registry: built-in methods found by name with helpful errors, names that round-trip, and a toy
method registered here (one class, no other module touched) running through `bench` and `optimize` (predictive
and exhaustive) on the tiny models, its simulator checked against the engine's measured passes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.errors import UserInputError
from runinfra_opt.manifest import check_manifest_file
from runinfra_opt.methods import BASELINE, Variant, get_method, method_names, parse_variant_name, registry
from runinfra_opt.methods.base import MethodOptions, SimInput, SpaceSpec, SpecMethod, TransformersSettings
from runinfra_opt.methods.ngram import simulate_ngram
from runinfra_opt.methods.simulation import SimResult
from runinfra_opt.results import load_results

# --------------------------------------------------------------------------- the built-ins


def test_builtin_methods_in_rank_order() -> None:
    assert method_names() == ["baseline", "ngram", "suffix", "vllm_ngram", "early_exit", "draft", "eagle", "eagle3"]


def test_unknown_method_lists_the_available_ones() -> None:
    with pytest.raises(UserInputError, match=r"unknown method 'magic'; available: .*baseline.*ngram"):
        get_method("magic")
    with pytest.raises(UserInputError, match="unknown method"):
        Variant("magic", lookahead=2)


@pytest.mark.parametrize(
    "variant",
    [
        BASELINE,
        Variant("ngram", lookahead=4, ngram_max=2),
        Variant("early_exit", lookahead=3, exit_layer=8),
        Variant("draft", lookahead=6, draft="/models/tiny-draft"),
        Variant("eagle3", lookahead=3, draft="eagle3:/models/tiny-head"),
        Variant("suffix", lookahead=16, options=(("depth", 32), ("factor", 2.5), ("min_prob", 0.05))),
    ],
)
def test_names_round_trip(variant: Variant) -> None:
    drafts = {"tiny-draft": "/models/tiny-draft", "tiny-head": "eagle3:/models/tiny-head"}
    assert parse_variant_name(variant.name, drafts) == variant
    assert Variant.from_dict(variant.to_dict()) == variant


def test_unparsable_name_lists_every_pattern() -> None:
    every = (
        r"expected baseline, ngram-n<N>-k<K>, suffix-d<DEPTH>-f<FACTOR>-p<MIN_PROB>-k<K>, "
        r"vllm_ngram-m<MIN>-n<MAX>-k<K> \(or -sched_<FIRST>-<LAST>k<K>_\.\.\. "
        r"for a k schedule\), early_exit-l<L>-k<K>, "
    )
    with pytest.raises(UserInputError, match=every + r"draft:<name>-k<K>, eagle:<name>-k<K>, eagle3:<name>-k<K>"):
        parse_variant_name("ngram-k4")


# --------------------------------------------------------------------------- a toy method


class ToyLookup(SpecMethod):
    """Prompt lookup restricted to a fixed match `window`, with its own names, space and options."""

    name = "toy"
    rank = 5

    def validate(self, variant: Variant) -> None:
        super().validate(variant)
        window = variant.option("window")
        if not isinstance(window, int) or window < 1:
            raise UserInputError("method toy needs an integer option window >= 1")

    def variant_name(self, variant: Variant) -> str:
        return f"toy-w{variant.option('window')}-k{variant.lookahead}"

    def parse_name(self, name: str, drafts: dict[str, str]) -> Variant | None:
        m = re.fullmatch(r"toy-w(\d+)-k(\d+)", name)
        return Variant("toy", lookahead=int(m[2]), options=(("window", int(m[1])),)) if m else None

    def name_pattern(self) -> str:
        return "toy-w<W>-k<K>"

    def from_options(self, options: MethodOptions) -> Variant:
        return Variant("toy", lookahead=options.lookahead or 2, options=(("window", 1),))

    def space(self, spec: SpaceSpec) -> list[Variant]:
        return [Variant("toy", lookahead=k, options=(("window", w),)) for w in (1, 2) for k in spec.lookaheads or (3,)]

    def simulate(self, variant: Variant, sim: SimInput) -> SimResult:
        window = int(variant.option("window") or 1)
        return simulate_ngram(
            sim.prompt_ids, sim.output_ids, variant.lookahead, window, sim.eos_token_ids, sim.max_length
        )

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        window = int(variant.option("window") or 1)
        return TransformersSettings(
            generation={"prompt_lookup_num_tokens": variant.lookahead, "max_matching_ngram_size": window}
        )


@pytest.fixture
def toy() -> Iterator[ToyLookup]:
    method = registry.register(ToyLookup())
    try:
        yield method  # type: ignore[misc]
    finally:
        registry.unregister("toy")


def test_toy_method_is_registered_and_parsed(toy: ToyLookup) -> None:
    assert method_names()[-1] == "toy"
    variant = parse_variant_name("toy-w2-k3")
    assert variant == Variant("toy", lookahead=3, options=(("window", 2),))
    assert variant.name == "toy-w2-k3"
    assert Variant.from_dict(json.loads(json.dumps(variant.to_dict()))) == variant
    with pytest.raises(UserInputError, match="option window"):
        Variant("toy", lookahead=3)


TOY_WORKLOAD = [
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc abc", "max_tokens": 40},
    {"id": "echo-2", "category": "echo", "prompt": "hello hello hello hello", "max_tokens": 40},
    {"id": "chat-1", "category": "chat", "messages": [{"role": "user", "content": "a story about a cat"}]},
]


@pytest.fixture
def toy_workload(tmp_path: Path) -> Path:
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TOY_WORKLOAD), encoding="utf-8")
    return path


def test_toy_method_through_bench(
    toy: ToyLookup, runner: CliRunner, tiny_models: tuple[Path, Path], toy_workload: Path
) -> None:
    args = ["bench", "--method", "toy", "--lookahead", "3", "--vs-baseline", "--json", "--max-tokens", "24"]
    args += ["--workload", str(toy_workload), "--target", str(tiny_models[0]), "--threads", "1"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variant"] == "toy-w1-k3"
    assert data["lossless"] is True
    records = data["records"]["toy-w1-k3"]
    assert len(records) == len(TOY_WORKLOAD)
    assert sum(r["drafted_tokens"] for r in records) > 0  # prompt lookup really ran


def _optimize(runner: CliRunner, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path, *extra: str) -> Any:
    args = ["optimize", "--workload", str(workload), "--target", str(tiny_models[0]), "--methods", "toy"]
    args += ["--lookahead", "2,3", "--threads", "1", "--repeats", "1", "--max-tokens", "24"]
    args += ["--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "manifest.yaml"), "--json", *extra]
    return runner.invoke(app, args, catch_exceptions=False)


@pytest.mark.parametrize("strategy", ["predictive", "exhaustive"])
def test_toy_method_through_optimize(
    toy: ToyLookup,
    runner: CliRunner,
    tiny_models: tuple[Path, Path],
    toy_workload: Path,
    tmp_path: Path,
    strategy: str,
) -> None:
    result = _optimize(runner, tiny_models, toy_workload, tmp_path, "--strategy", strategy, "--confirm", "2")
    assert result.exit_code == 0, result.output
    results = load_results(next((tmp_path / "runs").glob("*/results.json")))
    assert results.status == "complete"
    names = {v.name for v in results.variants}
    assert names == {"baseline", "toy-w1-k2", "toy-w1-k3", "toy-w2-k2", "toy-w2-k3"}
    confirmed = [v for v in results.variants if v.confirmed and v.name != "baseline"]
    assert confirmed
    if strategy == "exhaustive":
        assert len(confirmed) == 4  # every variant timed
    for v in results.variants:
        assert v.predicted is not None
        assert len(v.predicted_requests) == len(TOY_WORKLOAD)
    for v in confirmed:
        assert v.measured is not None
        assert v.measured.lossless is True
        # The toy's own simulator predicts the engine's measured target passes exactly.
        predicted = {r.request_id: r.target_passes for r in v.predicted_requests}
        assert {r.request_id: r.target_passes for r in v.measured_requests} == predicted
    assert check_manifest_file(tmp_path / "manifest.yaml") == []
    assert results.decision is not None
    if results.decision.winner != "baseline":
        import yaml

        manifest = yaml.safe_load((tmp_path / "manifest.yaml").read_text(encoding="utf-8"))
        assert manifest["speculative"]["method"] == "toy"
        assert manifest["speculative"]["options"]["window"] in {1, 2}
        assert manifest["serving"]["vllm"]["supported"] is False
