"""Real vLLM on loopback (not a mock): the bundled SmolLM2 served by a baseline server (a few short greedy
requests through our client, /metrics diffed per request, then killed mid-run and reported as failed), and by
`optimize --engine vllm` on a baseline and an n-gram server of its own (the n-gram server's per-request counters
checked against our simulation of vLLM's proposer, its outputs against the baseline's); vLLM's n-gram rule and
its `vllm serve` parser checked directly; SIGTERM during a server's start-up; a draft model predicted, launched and
measured faster than the baseline on the lab pair; nothing left behind.

Needs the vLLM environment: `make test` installs it first (`runinfra-opt engine install vllm`, cached
under the user's cache) and passes its python in RUNINFRA_OPT_VLLM_PYTHON. Each server takes 1.5-2 minutes to
start on 2 cores; the module launches them one at a time.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runinfra_opt.engine.vllm import metrics
from runinfra_opt.engine.vllm.args import ServerConfig
from runinfra_opt.engine.vllm.client import CompletionRequest, RequestResult, replay
from runinfra_opt.engine.vllm.server import ServerError, VllmServer
from runinfra_opt.engine.vllm.validate import check_serve_args_many
from runinfra_opt.methods.vllm_ngram import propose, simulate
from tests.conftest import quiet_lock
from tests.test_vllm_server import group_members, wait_gone

pytestmark = pytest.mark.e2e

DTYPE = "float32"
MAX_MODEL_LEN = 2048  # as `optimize` serves: the four launches here share two compiled graphs (see below)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = [
    "Copy this list exactly, one item per line:\napples\nbananas\ncherries\ndates\nelderberries\nfigs\n\nCopy:\n",
    "Text: The meeting moved from Tuesday to Thursday at 3 pm in room 204.\n"
    "Repeat the text word for word.\nRepeated text:",
    'Convert to JSON. name: Ada Lovelace; born: 1815; field: mathematics.\nJSON: {"name": "',
]
MAX_TOKENS = 24


@pytest.fixture(scope="module", autouse=True)
def _loud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Real vLLM servers take both cores: the module holds the suite's quiet lock exclusively while it runs, so
    no quiet test (tests/conftest.py) measures beside them."""
    with quiet_lock(tmp_path_factory, exclusive=True):
        yield


@pytest.fixture(scope="module", autouse=True)
def _no_bytecode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The vLLM environment lives in the user's cache, which the suite must leave untouched: its python
    must not write bytecode there. vLLM's own caches go to one directory of this module's (VLLM_CACHE_ROOT,
    which vLLM reads before XDG_CACHE_HOME): the fixtures' servers and `optimize`'s serve the same model
    with the same arguments, so the later two launches load the graphs the first two compiled instead of
    compiling again (docs/engines.md, "How a server is launched")."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONDONTWRITEBYTECODE", "1")
        mp.setenv("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-compile-cache")))
        yield


@pytest.fixture(scope="module")
def vllm_python() -> str:
    """The vLLM environment's python, handed over by `make test` (tests do not look in the user's cache). Not
    probed first (`environment.verify` imports vLLM, and `make test` has just verified it): a broken
    environment fails the first test that uses it, with its message, and `optimize --engine vllm` below verifies it
    as every run does."""
    python = os.environ.get("RUNINFRA_OPT_VLLM_PYTHON")
    if not python:
        pytest.fail(
            "no vLLM environment given: run `make test` (it installs one), or set RUNINFRA_OPT_VLLM_PYTHON to "
            "the python of `runinfra-opt engine install vllm --json`"
        )
    return python


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory, _session_models: Path) -> tuple[str, list[list[int]]]:
    """The converted bundled model (shared with the session's other tests) and the prompts' token ids."""
    from transformers import AutoTokenizer

    from runinfra_opt.models import ensure_converted, resolve_model

    cache = tmp_path_factory.mktemp("vllm-cache")
    (cache / "models").symlink_to(_session_models, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RUNINFRA_OPT_CACHE", str(cache))
        model_dir = ensure_converted(resolve_model("default"))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return str(model_dir), [list(tokenizer(p)["input_ids"]) for p in PROMPTS]


def _serve(python: str, model: str, prompts: list[list[int]], log_dir: Path) -> dict[str, Any]:
    """Start a baseline server, warm up, send each prompt alone with /metrics scraped around it, then kill the
    server mid-run: the next request fails as data, and the server reports that it died."""
    config = ServerConfig(model, dtype=DTYPE, max_model_len=MAX_MODEL_LEN, seed=0)
    run: dict[str, Any] = {"results": [], "counters": []}
    with VllmServer(python, config, log_dir, name="baseline") as server:
        assert server.process is not None
        run["pgid"] = server.process.pid
        run["startup_s"] = server.startup_s
        warm = CompletionRequest("warm-up", 4, prompt=prompts[0])
        assert replay(server.base_url, server.api_key, server.model_name, [warm])[0][0].success
        for index, prompt in enumerate(prompts):
            before = metrics.scrape(server.base_url)
            request = CompletionRequest(f"r{index}", MAX_TOKENS, prompt=prompt)
            (result,), _ = replay(server.base_url, server.api_key, server.model_name, [request])
            run["results"].append(result)
            run["counters"].append(metrics.scrape(server.base_url).minus(before))
        os.killpg(server.process.pid, signal.SIGKILL)
        assert wait_gone(server.process.pid)
        deadline = time.monotonic() + 30  # a multi-threaded process is reaped only once every thread is gone
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        run["after_kill"] = replay(server.base_url, server.api_key, server.model_name, [request])[0][0]
        with pytest.raises(ServerError) as died:
            server.check_alive()
        run["died"] = str(died.value)
    return run


@pytest.fixture(scope="module")
def baseline(vllm_python: str, smollm2: tuple[str, list[list[int]]], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _serve(vllm_python, *smollm2, tmp_path_factory.mktemp("vllm-logs"))


def _check_measured(result: RequestResult) -> None:
    assert result.success, result.error
    assert result.output_tokens is not None
    assert 0 < result.output_tokens <= MAX_TOKENS
    assert len(result.output_token_ids) == result.output_tokens
    assert len(result.top_logprobs) == result.output_tokens
    assert all(len(top) == 2 and top[0][1] >= top[1][1] for top in result.top_logprobs)
    assert result.ttft_s is not None
    assert result.e2e_s is not None
    assert 0 < result.ttft_s <= result.e2e_s
    assert sum(result.chunk_tokens) == result.output_tokens


def test_ngram_rule_is_vllms(vllm_python: str) -> None:
    """Our rule returns what vLLM's own numba function returns, on random contexts with many repeats."""
    rng = random.Random(0)
    cases = []
    for _ in range(400):
        context = [rng.randrange(rng.choice([2, 3, 5, 20])) for _ in range(rng.randrange(1, 40))]
        lo = rng.randrange(1, 4)
        cases.append({"c": context, "k": rng.randrange(1, 6), "lo": lo, "hi": lo + rng.randrange(0, 4),
                      "max": len(context) + rng.randrange(0, 6)})  # fmt: skip
    script = (
        "import json, sys, numpy as np\n"
        "from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f\n"
        "cases = json.load(sys.stdin)\n"
        "print(json.dumps([f(np.array(c['c'], dtype=np.int32), c['lo'], c['hi'], c['max'], c['k']).tolist()"
        " for c in cases]))\n"
    )
    done = subprocess.run(
        [vllm_python, "-c", script], input=json.dumps(cases), capture_output=True, text=True, check=True, timeout=600
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [
        propose(c["c"], k=c["k"], prompt_lookup_min=c["lo"], prompt_lookup_max=c["hi"], max_model_len=c["max"])
        for c in cases
    ]
    assert sum(1 for t in theirs if t) > 100  # the cases exercise real matches, not only empty proposals
    assert ours == theirs


def test_baseline_server_measures_and_stops(baseline: dict[str, Any]) -> None:
    for result, counters in zip(baseline["results"], baseline["counters"], strict=True):
        _check_measured(result)
        assert counters.drafts == 0
        assert counters.generation_tokens == result.output_tokens
        assert counters.requests_finished == 1
    assert not group_members(baseline["pgid"])


def test_killed_server_is_reported_as_failed(baseline: dict[str, Any]) -> None:
    assert not baseline["after_kill"].success
    assert baseline["after_kill"].error
    assert "vLLM server died" in baseline["died"]
    assert "; log " in baseline["died"]  # one line: the cause, then where the log is


def test_serve_args_parse_with_vllms_own_parser(
    vllm_python: str, smollm2: tuple[str, list[list[int]]], optimize_run: dict[str, Any]
) -> None:
    """What a manifest carries is what vLLM's `vllm serve` parser reads back (ours, and the manifest `optimize`
    wrote below); a speculative config vLLM rejects is caught in seconds, before a launch."""
    model, _ = smollm2
    config = ServerConfig(model, dtype=DTYPE, max_model_len=MAX_MODEL_LEN, speculative_config=NGRAM, seed=7)
    inverted = {**NGRAM, "prompt_lookup_min": 5, "prompt_lookup_max": 2}
    bad = ServerConfig(model, speculative_config=inverted)
    vllm = optimize_run["manifest"]["serving"]["vllm"]
    written = ServerConfig(model, dtype=DTYPE, max_model_len=2048, speculative_config=vllm["speculativeConfig"])
    # one vLLM process for all five (importing vLLM takes 10-30 s here)
    good, rejected, bad_dtype, parsed, parsed_args = check_serve_args_many(
        vllm_python,
        [
            config.serve_args(),
            bad.serve_args(),
            ServerConfig(model, dtype="float99").serve_args(),
            written.serve_args(),
            vllm["args"],
        ],
    )
    assert good == {"model": model, "dtype": DTYPE, "max_model_len": MAX_MODEL_LEN, "seed": 7,
                    "speculative_config": NGRAM}  # fmt: skip
    assert "prompt_lookup" in rejected["error"], rejected
    assert "dtype" in bad_dtype["error"], bad_dtype
    assert parsed.get("speculative_config") == vllm["speculativeConfig"], parsed
    assert parsed_args.get("speculative_config") == vllm["speculativeConfig"], parsed_args


@pytest.fixture(scope="module")
def optimize_run(
    vllm_python: str,
    smollm2: tuple[str, list[list[int]]],
    baseline: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """`optimize --engine vllm` on the baseline and one n-gram variant (read by two tests below)."""
    import yaml
    from typer.testing import CliRunner

    from runinfra_opt.cli.app import app
    from runinfra_opt.results import load_results

    model, _ = smollm2
    tmp_path = tmp_path_factory.mktemp("optimize-vllm")
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    run_dir, out = tmp_path / "run", tmp_path / "m.yaml"
    args = ["optimize", "--engine", "vllm", "--vllm-python", vllm_python, "--target", model, "--dtype", DTYPE]
    args += ["--workload", str(workload), "--methods", "vllm_ngram", "--lookahead", "4", "--ngram-max", "3"]
    args += ["--max-tokens", str(MAX_TOKENS), "--repeats", "1", "--run-dir", str(run_dir), "--out", str(out)]
    # One load level: a second one costs a measurement per server, and two levels whose leaders differ by noise
    # add a k schedule and a third launch (optimize.md, "k schedule"; tests/test_optimize_vllm_load.py has both).
    args += ["--load", "concurrency:2"]
    # eager: a launch without vLLM's compilation warm-up (the default path's launch: the `baseline` fixture's)
    args += ["--vllm-serve-args=--enforce-eager"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code in (0, 4), result.output
    return {"results": load_results(run_dir / "results.json"), "manifest": yaml.safe_load(out.read_text())}


def test_optimize_on_vllm_measures_each_variant_on_its_own_server(
    smollm2: tuple[str, list[list[int]]], baseline: dict[str, Any], optimize_run: dict[str, Any]
) -> None:
    """`optimize --engine vllm` end to end on real servers: the baseline and one vLLM n-gram variant, each on
    its own server launched with the manifest's arguments (parsed with vLLM's own parser above), outputs compared,
    counters recorded per request at batch 1 and equal to our simulation of vLLM's proposer, a load level served
    on the same servers, nothing left running."""
    model, prompt_ids = smollm2
    results = optimize_run["results"]
    assert results.status == "complete"
    assert [launch["variant"] for launch in results.launches] == ["baseline", "vllm_ngram-m1-n3-k4"]
    assert all(launch["error"] is None and launch["startup_s"] > 0 for launch in results.launches)
    # the step-cost table on the baseline's server, as far as the run can use it: 2 in flight, lookahead 4,
    # prompts of under 64 tokens (two of them together under 256)
    assert results.cost_model.serving is not None
    table = results.cost_model.serving.step_costs.table.model_dump()
    assert (table["batch_sizes"], table["tokens"]) == ([1, 2], [1, 2, 3, 5])
    assert [n for n, _ in table["prefill"]] == [64, 256]
    spec = results.variant("vllm_ngram-m1-n3-k4")
    assert spec is not None
    assert spec.failed is None
    assert spec.disqualified is None  # float32: the n-gram server's outputs equal the baseline's
    assert all(r.lossless is True for r in spec.measured_requests)
    # at batch 1, each request's counters (drafted and accepted tokens, /metrics diffed around it) are what our
    # simulation of vLLM's proposer gives on its prompt and output; the outputs are the baseline server's above
    assert sorted(r.request_id for r in spec.measured_requests) == ["r0", "r1", "r2"]
    total_accepted = 0
    for record in spec.measured_requests:
        index = int(record.request_id[1:])
        assert record.output_ids == baseline["results"][index].output_token_ids, record.request_id
        sim = simulate(
            prompt_ids[index],
            record.output_ids,
            k=NGRAM["num_speculative_tokens"],
            prompt_lookup_min=NGRAM["prompt_lookup_min"],
            prompt_lookup_max=NGRAM["prompt_lookup_max"],
            max_model_len=MAX_MODEL_LEN,
        )
        assert record.drafted_tokens == sim.draft_tokens, record.request_id
        if sim.last_pass_lower_bound:
            assert record.accepted_tokens >= sim.accepted_tokens, record.request_id
        else:
            assert record.accepted_tokens == sim.accepted_tokens, record.request_id
        total_accepted += record.accepted_tokens
    assert total_accepted > 0
    # under load, on the same servers (no relaunch): every request answered, counters read
    for variant in (results.variant("baseline"), spec):
        assert variant is not None
        assert [lr.level for lr in variant.load] == ["concurrency:2"]
        assert all(lr.metrics.succeeded == 3 * lr.metrics.runs and lr.metrics.failed == 0 for lr in variant.load)
    assert results.load is not None
    assert results.load.schedule is None
    assert [d.level for d in results.load.decisions] == ["concurrency:2"]
    assert all((lr.drafted_tokens or 0) > 0 for lr in spec.load)
    manifest = optimize_run["manifest"]
    vllm = manifest["serving"]["vllm"]
    if manifest["decision"]["winner"] == "vllm_ngram-m1-n3-k4":
        assert vllm["speculativeConfig"] == NGRAM
    assert vllm["args"][-1] == "--enforce-eager"
    for launch in results.launches:
        log = Path(launch["log"]).read_text()
        first = log.splitlines()[0]
        assert f"--dtype {DTYPE} --max-model-len 2048" in first
        assert "VLLM_API_KEY=<redacted>" in first
        assert "enforce_eager=True" in log  # the user's serving argument reached the server
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert not [line for line in ps.splitlines() if "api_server" in line and model in line]


def _server_children(pid: int) -> list[int]:
    """The vLLM API servers `pid` launched (each leads its own process group)."""
    done = subprocess.run(["pgrep", "-P", str(pid), "-f", "api_server .*--port"], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def test_sigterm_during_server_start_up_exits_143_at_once(
    vllm_python: str, smollm2: tuple[str, list[list[int]]], baseline: dict[str, Any], tmp_path: Path
) -> None:
    """A CI runner's cancellation while a server is still starting (its engine core loading the model): the tool
    stops the server's whole process group and exits 143 in a fraction of a start-up, leaving no process and an
    interrupted run. (The server is killed seconds into its start-up: no full launch is paid for.)"""
    import sys

    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "r0", "prompt": "Copy: a b c"}) + "\n")
    run_dir = tmp_path / "run"
    args = ["optimize", "--engine", "vllm", "--vllm-python", vllm_python, "--target", smollm2[0], "--workload",
            str(workload), "--methods", "vllm_ngram", "--load", "none", "--max-tokens", "4", "--run-dir",
            str(run_dir), "--out", str(tmp_path / "m.yaml")]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "runinfra_opt", *args], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        servers: list[int] = []
        while not servers:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no server launched"
            servers = _server_children(proc.pid)
            time.sleep(0.2)
        time.sleep(10)  # well into start-up (100-120 s here): the server is importing and loading the model
        assert proc.poll() is None
        assert group_members(servers[0])
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    assert code == 143, stderr[-2000:]
    # it did not wait for the start-up it cut short: the baseline's start-up here, with the same arguments
    assert took < 0.1 * baseline["startup_s"], f"exit took {took:.1f} s, a start-up {baseline['startup_s']:.1f} s"
    assert not group_members(servers[0])
    assert "Traceback" not in stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "interrupted"
    assert results["stopped"]["signal"] == "SIGTERM"


# ---- Draft models predicted on real vLLM (issue 40) ------------------------------------------------------------
# `optimize --engine vllm` on the lab pair at its test size (tests/lab_pair.py: a deeper, slower SmolLM2 as the
# target, SmolLM2 itself as its draft) over a few short requests. The draft's variant is predicted from the
# baseline's server, the draft's in-process profile (float32, as these servers are) and its own step costs,
# launched as the one confirmed candidate, and measured faster than the baseline, as predicted. Three launches, one
# at a time: the baseline, the draft alone (its step costs), the draft variant (beside the baseline's). In this
# module so that the real servers run on one worker, one after another, under one compile cache.

DRAFT_LOOKAHEAD = 3
DRAFT_REQUESTS = [
    "Repeat the text word for word.\nText: The city council voted on Tuesday to extend the library's opening hours to "
    "9 pm on weekdays, starting next month.\nRepeated text:",
    "Repeat the text word for word.\nText: A local bakery started delivering bread by bicycle this spring; the owner "
    "says deliveries are faster in the old town.\nRepeated text:",
    "Repeat the text word for word.\nText: The museum will close its east wing for three months to repair the roof, "
    "and the paintings will be shown in the main hall.\nRepeated text:",
]
"""Copying, where the pair agrees at 0.97 of the positions (in-process, 24 tokens): the draft's gain on this server is
then well beyond a few requests' noise. On one-sentence summaries the pair agrees at 0.80 and the draft's predicted
gain here is about 5% (the draft's server step costs half the target's), which 3 requests cannot tell from noise."""


@pytest.fixture(scope="module")
def lab_pair(tmp_path_factory: pytest.TempPathFactory, _session_models: Path) -> tuple[Path, Path]:
    """The lab pair at its test size, built from the session's converted SmolLM2."""
    from tests.lab_pair import SMALL, build

    cache = tmp_path_factory.mktemp("lab-cache")
    (cache / "models").symlink_to(_session_models, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RUNINFRA_OPT_CACHE", str(cache))
        return build(tmp_path_factory.mktemp("lab-pair"), SMALL)


def test_a_draft_variant_is_predicted_launched_and_faster_than_the_baseline(
    vllm_python: str,
    lab_pair: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from runinfra_opt.cli.app import app
    from runinfra_opt.report.answer import launches_line
    from runinfra_opt.results import load_results

    target, draft = lab_pair
    workload = tmp_path / "w.jsonl"
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": text}]} for i, text in enumerate(DRAFT_REQUESTS)]
    workload.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_dir = tmp_path / "run"
    args = ["optimize", "--engine", "vllm", "--vllm-python", vllm_python, "--target", str(target)]
    args += ["--draft", str(draft), "--methods", "draft", "--lookahead", f"2,{DRAFT_LOOKAHEAD}", "--dtype", DTYPE]
    args += ["--workload", str(workload), "--max-tokens", "24", "--load", "none", "--repeats", "1"]
    args += ["--confirm", "1", "--run-dir", str(run_dir), "--out", str(tmp_path / "m.yaml")]
    # eager: vLLM's compilation warm-up of the lab target (a dummy batch of 2,048 tokens through 90 layers) took
    # 1.5-3 minutes a launch on 2 cores, more than the timing itself
    args += ["--vllm-serve-args=--enforce-eager"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = load_results(run_dir / "results.json")
    assert results.status == "complete"
    assert all("enforce_eager=True" in Path(launch["log"]).read_text() for launch in results.launches)
    # predicted: both lookaheads, from the profile (agreement flags for every request) and the draft's own table
    role = f"draft:{draft}"
    assert set(results.profile["agreement"][role]) == {"r0", "r1", "r2"}
    assert results.cost_model.serving is not None
    assert results.cost_model.serving.draft_step_costs[role].table.tokens[-1] >= DRAFT_LOOKAHEAD + 1
    speculative = [v for v in results.variants if v.name != "baseline"]
    assert len(speculative) == 2
    assert all(v.predicted is not None for v in speculative)
    # launched: the baseline, the draft alone for its step costs, and only the best predicted variant
    launched = [launch["variant"] for launch in results.launches]
    assert launched[:2] == ["baseline", "draft-alone:draft"]
    assert len(launched) == 3
    ranking = results.profile["ranking_predicted_tokens_per_s"]  # the predictions the candidate was chosen by
    best = max(speculative, key=lambda v: ranking[v.name])
    assert launched[2] == best.name
    assert launches_line(results) == (
        "Servers: 3 launched (1 baseline, 1 candidate(s), 1 draft alone) for 3 variants; 2 speculative variant(s) "
        "predicted from the baseline's server."
    )
    # measured faster than the baseline (paired with it), lossless, and predicted faster too, near the measurement.
    # The gain, not tokens/s: the ratio to the baseline timed beside it is what the ranking used. "Near" is a factor
    # of 1.6 either way, not the predictor's accuracy (benchmarks/predictor_accuracy.py measures that alone under the
    # CPU lock): the tables are measured minutes before the timing, and on two cores shared with the other test
    # workers the draft's cost relative to the target's moves with their load (`git show
    # e14cd7e:docs/measurements.md`, Experiments without a script, 2026-12-07 03:00, where a run of this test
    # re-predicted shows that leaving the draft's cost out, or counting it twice, falls outside these bounds on a
    # quiet machine).
    assert best.measured is not None
    assert best.disqualified is None
    assert best.measured.speedup is not None
    assert best.measured.speedup.value > 1.0
    assert best.predicted is not None
    assert best.predicted.speedup is not None
    predicted, measured = best.predicted.speedup.value, best.measured.speedup.value
    assert predicted > 1.0
    assert 1 / 1.6 < predicted / measured < 1.6, f"predicted {predicted:.3f}x, measured {measured:.3f}x"
