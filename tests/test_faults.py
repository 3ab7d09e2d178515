"""The fault matrix's cells that run in under a minute (tests/fault_matrix.py; benchmarks/faults.py runs them all):
each through the real CLI in a process of its own, checked for its exit code, time to exit, status, processes left
and data lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault_matrix import EXIT_LIMIT_S, Bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Bench:
    return Bench(tmp_path_factory.mktemp("faults"))


@pytest.mark.parametrize("mode", ["hang", "stubborn"])
def test_sigterm_during_a_server_start_up(bench: Bench, mode: str) -> None:
    """The stand-in never becomes healthy (`stubborn`: and ignores SIGTERM, as does its engine-core child)."""
    cell = bench.startup_cell(mode, resume=False)  # resuming is covered in test_run_state.py
    assert cell.exit_code == 143, cell.stderr_tail
    assert cell.exit_s is not None
    assert cell.exit_s < EXIT_LIMIT_S
    assert cell.left_behind == 0
    assert cell.status == "interrupted"
    assert "Traceback" not in cell.stderr_tail


@pytest.mark.parametrize("mode", ["error500_after:2", "drop_after:2", "die_after:2"])
def test_a_candidate_server_that_fails_leaves_a_complete_run(bench: Bench, mode: str) -> None:
    """500s, a dropped stream, a dead server: the candidate fails as data, the run completes, nothing is left."""
    cell = bench.server_fault_cell(mode, mode, compare=False)
    assert cell.exit_code == 0, cell.stderr_tail
    assert cell.status == "complete"
    assert cell.left_behind == 0
    assert cell.decision == "baseline"  # the only variant measured whole


def test_a_truncated_results_file_is_one_line_on_resume(bench: Bench) -> None:
    cell = bench.corrupt_cell("results.json")
    assert cell.exit_code == 2
    assert "corrupt or truncated results file" in cell.note
    assert "traceback" not in cell.note
    assert cell.left_behind == 0


BAD_SERVING_INPUT = {
    "unknown model directory": ({}, ["--target", "/nonexistent/model"], 2, "unknown model"),
    "draft with another tokenizer": ({}, ["--draft", "{other}", "--methods", "draft"], 2, "tokenizer differs"),
    "not a vLLM environment": ({}, ["--vllm-python", "/usr/bin/false"], 5, "`import vllm` fails"),
    "baseline's config rejected": ({"FAKE_VLLM_BASE": "reject"}, [], 5, "rejected by the fake server; log "),
}


@pytest.mark.parametrize("case", list(BAD_SERVING_INPUT))
def test_bad_input_to_the_serving_path_is_one_line(bench: Bench, case: str, tmp_path: Path) -> None:
    """One line naming what is wrong, the documented exit code, no traceback, nothing left running."""
    import json
    import shutil

    extra_env, extra, code, words = BAD_SERVING_INPUT[case]
    other = tmp_path / "other-draft"
    shutil.copytree(bench.draft, other)
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = list(vocab)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    argv = bench.args("vllm", tmp_path / "run")
    for option, value in zip(extra[::2], extra[1::2], strict=True):
        value = value.format(other=other)
        if option in argv:
            argv[argv.index(option) + 1] = value
        else:
            argv += [option, value]
    proc = bench.start(f"bad-{case}", argv, env={**bench.env, **extra_env})
    returncode, stderr, _ = bench.finish(proc, timeout=120)
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert returncode == code, stderr
    assert len(errors) == 1, stderr
    assert words in errors[0]
    assert "Traceback" not in stderr
    assert bench.left_behind(f"bad-{case}") == 0


def test_a_truncated_model_is_one_line_not_a_traceback(bench: Bench) -> None:
    cell = bench.corrupt_cell("model")
    assert cell.exit_code == 2, cell.stderr_tail
    assert "cannot load model" in cell.note
    assert "traceback" not in cell.note
    assert cell.left_behind == 0


def test_a_truncated_cost_cache_is_measured_again(tmp_path: Path) -> None:
    """The benchmark's `corrupt-cost cache` cell, at its source: a truncated cache file reads as absent (the
    forward costs are measured again and the file rewritten), never as an error."""
    import json

    from runinfra_opt.engine.hf.cost import COST_CACHE_VERSION, _read_cache

    path = tmp_path / "costs.json"
    text = json.dumps({"version": COST_CACHE_VERSION, "model": "m", "roles": {"self": []}})
    path.write_text(text)
    assert _read_cache(path) == json.loads(text)
    path.write_text(text[: len(text) // 2])
    assert _read_cache(path) is None
