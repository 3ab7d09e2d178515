"""Method `suffix`: names, space, vLLM settings, the Arctic build recipe, and the simulation driving Arctic
Inference's own cache the way vLLM's proposer does (checked against vLLM's counters in
benchmarks/vllm_suffix.py)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.vllm import arctic
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import get_method
from runinfra_opt.methods.base import SimInput, SpaceSpec
from runinfra_opt.methods.variant import Variant, parse_variant_name
from runinfra_opt.results import load_results

METHOD = get_method("suffix")


def test_names_space_and_the_vllm_config() -> None:
    variant = parse_variant_name("suffix-d24-f1-p0.1-k8")
    assert variant == Variant("suffix", lookahead=8, options=(("depth", 24), ("factor", 1.0), ("min_prob", 0.1)))
    assert [v.name for v in METHOD.space(SpaceSpec(num_layers=30))] == [
        "suffix-d24-f1-p0.1-k8",
        "suffix-d24-f1-p0.1-k16",
        "suffix-d24-f2-p0.1-k16",
    ]
    assert [v.name for v in METHOD.space(SpaceSpec(num_layers=30, lookaheads=(4,)))] == ["suffix-d24-f1-p0.1-k4"]
    serving = METHOD.serving_vllm(parse_variant_name("suffix-d32-f2-p0.05-k16"), None)
    assert serving["supported"]
    assert json.loads(serving["args"][1]) == {
        "method": "suffix",
        "num_speculative_tokens": 16,
        "suffix_decoding_max_tree_depth": 32,
        "suffix_decoding_max_spec_factor": 2.0,
        "suffix_decoding_min_token_prob": 0.05,
    }
    with pytest.raises(UserInputError, match="min token prob in"):
        Variant("suffix", lookahead=8, options=(("min_prob", 1.5),))


def test_the_wheel_is_built_without_isolation_in_an_environment_of_its_own(tmp_path: Path) -> None:
    commands = arctic.build_commands(tmp_path / "venv", "pip", sys.executable)
    install, wheel = commands[1], commands[-1]
    assert install[0] == str(tmp_path / "venv" / "bin" / "python")
    assert any(c.startswith("torch==") for c in install)
    assert "nanobind==2.9.2" in install
    assert wheel[-1] == f"arctic-inference=={arctic.ARCTIC_VERSION}"
    assert "--no-build-isolation" in wheel
    assert "--no-deps" in wheel


def need_arctic(module: str) -> Any:
    """`module`, built into this environment by `engine install vllm`: under `make test` (which runs it and hands
    the tests the vLLM python) its absence fails the test; elsewhere (a bare `pytest`) it skips."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("RUNINFRA_OPT_VLLM_PYTHON"):
            pytest.fail(f"{module} is missing although `engine install vllm` ran (make test): its build failed")
        pytest.skip("built by `engine install vllm` (make test)")


def test_a_missing_module_is_one_line_naming_the_remedy() -> None:
    problem = arctic.missing_module(sys.executable, "no_such_module_here")
    assert problem is not None
    assert "ModuleNotFoundError" in problem
    assert "engine install vllm" in problem
    assert arctic.missing_module(sys.executable, "json") is None


def test_the_simulation_drafts_from_earlier_responses() -> None:
    need_arctic("arctic_inference.suffix_decoding")
    variant = parse_variant_name("suffix-d24-f1-p0.1-k8")
    prompt, output = list(range(100, 140)), list(range(5, 19))

    def sim(earlier: list[tuple[list[int], list[int]]]) -> tuple[int, int, int, list[int]]:
        result = METHOD.simulate(variant, SimInput(prompt, output, [2], 2048, earlier=earlier))
        return result.target_passes, result.drafted, result.accepted, result.chunks

    # Nothing to copy: the output occurs neither in the prompt nor earlier: one token a pass.
    assert sim([]) == (14, 0, 0, [1] * 14)
    # The same answer seen before: the match grows, so does the proposal (max spec factor 1: up to its length).
    assert sim([(prompt, output)]) == (4, 11, 11, [1, 2, 4, 8])
    # A different prompt that got the same answer counts as well (the global tree holds responses only).
    assert sim([(list(range(300, 310)), output)])[0] == 4


def test_a_last_pass_past_max_tokens_is_counted_and_cached_as_the_server_does() -> None:
    # vLLM's last step of a request may accept drafted tokens past `max_tokens`: it counts them and keeps them in
    # its suffix cache before the output is cut. The replay does the same as far as the greedy tokens past the
    # output (the continuation) are known, and says when a count is only a lower bound.
    need_arctic("arctic_inference.suffix_decoding")
    variant = parse_variant_name("suffix-d24-f1-p0.1-k8")
    text = list(range(5, 45))
    prompt = [*range(100, 120), *text, *range(200, 210)]  # the answer copies the text from the prompt
    output, past = text[:16], text[16:25]

    def sim(continuation: list[int]) -> tuple[int, int, int, list[int]]:
        r = METHOD.simulate(variant, SimInput(prompt, output, [2], 2048, serving=True, continuation=continuation))
        return r.target_passes, r.drafted, r.accepted, r.chunks

    # The last pass proposes 8 tokens at the 16th: all 8 match the text, 1 of them inside the output.
    assert sim([]) == (5, 19, 12, [1, 2, 4, 8, 9])
    assert sim(past) == (5, 19, 19, [1, 2, 4, 8, 9])
    # What the overrun put in the global tree drafts a later request with another prompt further.
    later = text[:30]
    without = METHOD.simulate(variant, SimInput(range(300, 310), later, [2], 2048, serving=True,
                                                earlier=[(prompt, output)]))  # fmt: skip
    with_past = METHOD.simulate(variant, SimInput(range(300, 310), later, [2], 2048, serving=True,
                                                  earlier=[(prompt, output, past)]))  # fmt: skip
    assert (without.target_passes, without.accepted) == (18, 12)
    assert (with_past.target_passes, with_past.accepted) == (11, 19)
    # transformers drafts nothing past `max_length`: a continuation changes nothing there.
    assert METHOD.simulate(variant, SimInput(prompt, output, [2], len(prompt) + 16, continuation=past)) == (
        METHOD.simulate(variant, SimInput(prompt, output, [2], len(prompt) + 16))
    )


def test_each_timed_pass_of_a_suffix_variant_gets_a_fresh_server(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server's suffix cache keeps every response it produced: a second pass over the same requests would copy
    # them. Each batch-1 repeat and each load level therefore starts on a new server (warmed up again).
    package = need_arctic("arctic_inference")
    monkeypatch.setenv("PYTHONPATH", f"{os.environ['PYTHONPATH']}{os.pathsep}{Path(package.__file__).parents[1]}")
    workload = tmp_path / "w.jsonl"
    rows = [
        {"id": f"r{i}", "arrival_s": i * 0.1, "prompt": p}
        for i, p in enumerate(["copy copy copy this: alpha beta", "one two three four five six", "x y z x y z"])
    ]
    workload.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    args = ["optimize", "--engine", "vllm", "--vllm-python", fake_vllm, "--target", str(tiny_models[0])]
    args += ["--workload", str(workload), "--methods", "suffix", "--lookahead", "4", "--load", "concurrency:2"]
    args += ["--max-tokens", "48", "--repeats", "2", "--run-dir", str(run_dir), "--out", str(tmp_path / "m.yaml")]
    result = runner.invoke(app, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    launched = [launch["variant"] for launch in results.launches]
    assert launched.count("baseline") == 1
    # the baseline server's greedy tokens past each output, k + 1 of them (what a last pass can accept past it)
    baseline = {r["request_id"]: r["output_ids"] for r in results.profile["baseline"]}
    assert {rid: len(past) for rid, past in results.profile["continuation"].items()} == dict.fromkeys(baseline, 5)
    suffix = results.variant("suffix-d24-f1-p0.1-k4")
    assert suffix is not None
    # repeat 1, repeat 2, concurrency:2, and each pass added to the level if its ratio was unclear (level_repeats)
    assert launched.count("suffix-d24-f1-p0.1-k4") == 3 + sum(len(lr.added) for lr in suffix.load)
    assert suffix.confirmed
    assert [level.level for level in suffix.load] == ["concurrency:2"]
    # the stand-in speculates faster than it decodes: suffix wins, and the manifest serves it
    assert results.decision is not None
    assert results.decision.winner == "suffix-d24-f1-p0.1-k4"
    manifest = yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert manifest["serving"]["vllm"]["speculativeConfig"]["method"] == "suffix"
    assert manifest["speculative"]["options"] == {"depth": 24, "factor": 1.0, "min_prob": 0.1}


def test_the_in_process_engine_drafts_with_the_same_cache_and_the_simulation_counts_its_passes(
    tiny_models: tuple[Path, Path],
) -> None:
    need_arctic("arctic_inference.suffix_decoding")
    from runinfra_opt.engine.hf.engine import open_engine
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.workload.model import Request

    engine = open_engine(str(tiny_models[0]), threads=1)
    variant = parse_variant_name("suffix-d24-f1-p0.1-k4")
    requests = [
        Request(id=f"r{i}", line=i + 1, prompt=text)
        for i, text in enumerate(["alpha beta gamma delta", "alpha beta gamma delta epsilon", "zeta eta theta"])
    ]
    engine.warmup(requests[0], variant)  # drafts from a cache of its own: the pass's starts empty
    base = [engine.generate(r, BASELINE, max_tokens=24) for r in requests]
    earlier: list[tuple[list[int], list[int]]] = []
    drafted = 0
    for repeat in (0, 1):  # the second repeat starts on a fresh cache: the same counts
        earlier = []
        for request, reference in zip(requests, base, strict=True):
            record = engine.generate(request, variant, max_tokens=24, repeat=repeat)
            assert record.output_ids == reference.output_ids  # lossless
            prompt = engine.prompts.prompt_ids(request)
            output = list(reference.output_ids or [])
            sim = METHOD.simulate(
                variant, SimInput(prompt, output, engine.prompts.eos_token_ids, len(prompt) + 24, earlier=earlier)
            )
            assert (record.target_passes, record.drafted_tokens) == (sim.target_passes, sim.drafted)
            assert record.accepted_per_pass == sim.accepted_per_pass
            earlier.append((prompt, output))
            drafted += record.drafted_tokens
    assert drafted > 0  # the tiny model repeats itself: there was something to draft
