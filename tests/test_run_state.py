"""A run's state tells the truth, through the real CLI: a run still going is reported as running and refuses a
second `--resume`; a run killed without a word (SIGKILL, as the OOM killer or a CI runner after its grace period
does) is reported as died, with what finished and the command that continues it, and `--resume` finishes it.
(SIGTERM and SIGINT, status `interrupted`: tests/test_exit_codes.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.exitcodes import ExitCode
from runinfra_opt.results import load_results
from runinfra_opt.runlock import RUN_LOCK_FILE, RunLock, holder
from tests.test_exit_codes import _cli, _optimize_args

PAUSE_IN_CONFIRMATION = """
import os, time
from runinfra_opt.optimize.state import RunState
save = RunState.save
def save_then_pause(self):
    save(self)
    if any(v.name != "baseline" and v.measured_requests for v in self.results.variants):
        open({marker!r}, "w").close()
        time.sleep(600)
RunState.save = save_then_pause
from runinfra_opt.cli.app import main
main()
"""
"""`runinfra-opt` that stops moving (alive, lock held) once its confirmation has timed and saved something."""


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_live_run_refuses_resume_and_a_killed_one_reads_as_died(
    tmp_path: Path, tiny_models: tuple[Path, Path]
) -> None:
    marker = tmp_path / "paused"
    run = tmp_path / "run"
    code = PAUSE_IN_CONFIRMATION.format(marker=str(marker))
    args = _optimize_args(tiny_models, tmp_path, 8)
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.2)
        owner = holder(run)
        assert owner is not None
        assert owner.pid == proc.pid

        busy = _cli("optimize", "--resume", str(run), "--out", str(tmp_path / "m.yaml"))
        assert busy.returncode == int(ExitCode.BAD_INPUT)
        assert busy.stderr.strip().splitlines() == [
            f"error: --resume {run}: the run is still running (pid {proc.pid} on host {owner.host}); wait for it "
            "to end or stop it first"
        ]
        live = _cli("report", str(run))
        assert f"still running (pid {proc.pid} on host {owner.host}" in _flat(live.stdout)

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    kept = load_results(run / "results.json")
    assert kept.status == "running"  # what the killed process last wrote: it had no chance to say more
    before = {(v.name, r.request_id, r.repeat) for v in kept.variants for r in v.measured_requests}
    assert any(name != "baseline" for name, _, _ in before)

    shown = _cli("report", str(run))
    assert shown.returncode == 0, shown.stderr
    text = _flat(shown.stdout)
    assert f"No decision: Died without a word (pid {proc.pid} on host {owner.host}:" in text
    assert f"after phase {kept.phase}; kept: phases {', '.join(kept.phases_done)}, {len(before)} timed" in text
    assert f"Resume: runinfra-opt optimize --resume {run.resolve()} --out {tmp_path / 'm.yaml'}" in text
    as_json = _cli("report", str(run), "--format", "json")
    assert '"status": "died"' in as_json.stdout

    resumed = CliRunner().invoke(app, ["optimize", "--resume", str(run), "--out", str(tmp_path / "m.yaml")])
    assert resumed.exit_code == 0, resumed.output
    final = load_results(run / "results.json")
    assert final.status == "complete"
    assert final.stopped is None
    assert before <= {(v.name, r.request_id, r.repeat) for v in final.variants for r in v.measured_requests}
    assert any(n.text.startswith(f"died without a word after phase {kept.phase}") for n in final.notes)
    assert holder(run) is None  # released at the end


def test_the_run_lock_is_held_while_taken_and_released_by_death(tmp_path: Path) -> None:
    lock = RunLock(tmp_path)
    owner = lock.acquire()
    assert owner.pid == os.getpid()
    other = subprocess.run(
        [sys.executable, "-c", f"from runinfra_opt.runlock import holder; print(holder({str(tmp_path)!r}))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert other.stdout.strip() == f"pid {owner.pid} on host {owner.host}"
    lock.release()
    assert holder(tmp_path) is None
    assert (tmp_path / RUN_LOCK_FILE).is_file()
