"""Exit codes are a contract (README's table): each one driven through the real CLI, in a subprocess of
`python -m runinfra_opt` (the console script's `main`), including cancellation by SIGINT (130) and by SIGTERM
(143, how CI systems cancel a job), after which `--resume` finishes the run without redoing finished work."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.results import RunResults, load_results, save_results
from tests.report_fixtures import build_results

INJECTED = (
    "import runinfra_opt.report.locate as locate\n"
    "def broken(*args, **kwargs):\n"
    "    raise RuntimeError('injected internal error')\n"
    "locate.load_run = broken\n"
    "from runinfra_opt.cli.app import main\n"
    "main()\n"
)
"""`runinfra-opt` with a bug injected where `report` loads a run: an unexpected exception, not a domain error."""


def _cli(
    *args: str, code: str | None = None, timeout: float = 600, max_file_bytes: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess; `max_file_bytes` caps the size of any file it writes (RLIMIT_FSIZE: a write
    beyond fails with EFBIG, as one on a full disk fails with ENOSPC)."""
    head = ["-c", code] if code else ["-m", "runinfra_opt"]  # sys.argv[1:] is `args` either way

    def limit() -> None:
        import resource

        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return subprocess.run(
        [sys.executable, *head, *args], capture_output=True, text=True, timeout=timeout, check=False, preexec_fn=limit
    )


def _save(tmp_path: Path, name: str, results: RunResults) -> str:
    save_results(results, tmp_path / name / "results.json")
    return str(tmp_path / name)


def _tiny_workload(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "tiny.jsonl"
    requests = [
        {"id": f"r{i}", "category": "chat" if i % 2 else "echo", "prompt": "abc abc hello " * (1 + i % 3),
         "max_tokens": 48}
        for i in range(n)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in requests), encoding="utf-8")
    return path


def _optimize_args(tiny_models: tuple[Path, Path], tmp_path: Path, requests: int, repeats: int = 1) -> list[str]:
    target, draft = tiny_models
    return [
        "optimize", "--workload", str(_tiny_workload(tmp_path, requests)), "--target", str(target),
        "--draft", str(draft), "--lookahead", "2,4", "--ngram-max", "2", "--exit-layers", "2", "--confirm", "2",
        "--repeats", str(repeats), "--threads", "1", "--run-dir", str(tmp_path / "run"),
        "--out", str(tmp_path / "m.yaml"),
    ]  # fmt: skip


def ok(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    run = _save(tmp_path, "run", build_results())
    result = _cli("report", run, "--format", "markdown")
    assert "Winner: ngram-n2-k4" in result.stdout
    return result


def internal_error(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    result = _cli("report", _save(tmp_path, "run", build_results()), code=INJECTED)
    assert "RuntimeError: injected internal error" in result.stderr
    return result


def bad_input(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    result = _cli("optimize", "--methods", "ngram,telepathy")
    assert result.stderr.startswith("error: ")
    assert "telepathy" in result.stderr
    assert "Traceback" not in result.stderr
    return result


def no_feasible(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    result = _cli(*_optimize_args(tiny_models, tmp_path, 1), "--max-ttft-ms", "0.001")
    assert not (tmp_path / "m.yaml").exists()
    assert load_results(tmp_path / "run" / "results.json").status == "no_feasible"
    return result


def gate_failed(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    old = _save(tmp_path, "old", build_results())
    new = _save(tmp_path, "new", build_results(run_id="new", scales={"ngram-n2-k4": 0.8}))
    result = _cli("report", "--compare", old, new, "--max-regression", "0.05")
    assert "error: Gate FAILED" in result.stderr
    return result


def engine_failed(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    # An interpreter that cannot import vLLM, given as the user's own vLLM environment.
    result = _cli("engine", "install", "vllm", "--vllm-python", "/usr/bin/false")
    assert "`import vllm` fails" in result.stderr
    return result


def write_failed(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
    # The run's results outgrow what the disk takes: one line, and the last results written stay readable.
    result = _cli(*_optimize_args(tiny_models, tmp_path, 4), max_file_bytes=12_000)
    assert result.stderr.strip().splitlines()[-1].startswith("error: cannot write "), result.stderr[-2000:]
    assert "what was written before is intact" in result.stderr
    assert "Traceback" not in result.stderr
    assert load_results(tmp_path / "run" / "results.json").phases_done  # intact, with the phases it finished
    return result


def _cancelled(sig: signal.Signals) -> Callable[[Path, tuple[Path, Path]], subprocess.CompletedProcess[str]]:
    def scenario(tmp_path: Path, tiny_models: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
        return _cancel_and_resume(tmp_path, tiny_models, sig)

    return scenario


ROWS: dict[ExitCode, Callable[[Path, tuple[Path, Path]], subprocess.CompletedProcess[str]]] = {
    ExitCode.OK: ok,
    ExitCode.INTERNAL: internal_error,
    ExitCode.BAD_INPUT: bad_input,
    ExitCode.NO_FEASIBLE: no_feasible,
    ExitCode.GATE_FAILED: gate_failed,
    ExitCode.ENGINE_FAILED: engine_failed,
    ExitCode.WRITE_FAILED: write_failed,
    ExitCode.INTERRUPTED: _cancelled(signal.SIGINT),
    ExitCode.TERMINATED: _cancelled(signal.SIGTERM),
}


def test_every_documented_exit_code_has_a_row() -> None:
    assert set(ROWS) == set(ExitCode)


@pytest.mark.parametrize("code", list(ROWS), ids=[f"{int(c)}-{c.name.lower()}" for c in ROWS])
def test_exit_code_through_the_real_cli(code: ExitCode, tmp_path: Path, tiny_models: tuple[Path, Path]) -> None:
    result = ROWS[code](tmp_path, tiny_models)
    assert result.returncode == int(code), result.stderr[-3000:]


def _measured(results: RunResults) -> dict[tuple[str, str, int], float]:
    return {(v.name, r.request_id, r.repeat): r.e2e_s for v in results.variants for r in v.measured_requests}


SIGNAL_IN_CONFIRMATION = """
import json, os, signal
from runinfra_opt.optimize.state import RunState
save = RunState.save
def save_then_signal(self):
    save(self)
    timed = [[v.name, r.request_id, r.repeat, r.e2e_s] for v in self.results.variants for r in v.measured_requests]
    if not getattr(RunState, "signalled", False) and any(name != "baseline" for name, *_ in timed):
        RunState.signalled = True
        with open({seen!r}, "w") as f:
            json.dump(timed, f)
        os.kill(os.getpid(), {signum})
RunState.save = save_then_signal
from runinfra_opt.cli.app import main
main()
"""
"""`runinfra-opt` that signals itself once its confirmation has timed something and saved it: the signal lands in
the middle of the confirmation whatever the machine's load (a test that polled the results file from outside
once saw the whole confirmation end first, on a machine busy with real vLLM servers)."""


def _cancel_and_resume(
    tmp_path: Path, tiny_models: tuple[Path, Path], sig: signal.Signals
) -> subprocess.CompletedProcess[str]:
    """Run `optimize`, signalled in the middle of its confirmation phase (by itself, through the real signal
    handling, `SIGNAL_IN_CONFIRMATION`), check what it kept, then finish it with `--resume` (in-process) and check
    that nothing kept was timed again."""
    results_file = tmp_path / "run" / "results.json"
    seen = tmp_path / "timed-before-signal.json"
    code = SIGNAL_IN_CONFIRMATION.format(seen=str(seen), signum=int(sig))
    result = _cli(*_optimize_args(tiny_models, tmp_path, 8), code=code)
    stderr = result.stderr
    timed = {(name, request, repeat): e2e for name, request, repeat, e2e in json.loads(seen.read_text())}
    word = {signal.SIGINT: "interrupted (SIGINT)", signal.SIGTERM: "terminated (SIGTERM)"}[sig]
    assert f"{word}: what was finished is kept on disk" in stderr
    assert "Traceback" not in stderr
    kept = load_results(results_file)
    assert kept.status == "interrupted"
    assert kept.phase == "predict"  # confirmation had started and not finished
    assert kept.stopped is not None
    assert kept.stopped.signal == sig.name
    assert kept.stopped.how == "signal"
    interrupted = [note.text for note in kept.notes_of("interrupted")]
    assert interrupted == [f"interrupted by {sig.name} after phase predict"]
    shown = _cli("report", str(tmp_path / "run"))
    assert shown.returncode == 0, shown.stderr
    line = " ".join(shown.stdout.split())  # unwrapped
    assert f"No decision: Interrupted by {sig.name} at {kept.stopped.at}" in line
    assert f"Resume: runinfra-opt optimize --resume {(tmp_path / 'run').resolve()} --out {tmp_path / 'm.yaml'}" in line
    before = _measured(kept)
    assert timed.items() <= before.items()  # everything seen finished before the signal is on disk, unchanged
    assert not (tmp_path / "m.yaml").exists()

    resume = ["optimize", "--resume", str(tmp_path / "run"), "--out", str(tmp_path / "m.yaml")]
    resumed = CliRunner().invoke(app, resume)
    assert resumed.exit_code == 0, resumed.output
    final = load_results(results_file)
    assert final.status == "complete"
    after = _measured(final)
    assert before.items() <= after.items()  # kept records were not timed again
    assert len(after) > len(before)
    assert (tmp_path / "m.yaml").is_file()
    return result
