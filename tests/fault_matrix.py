"""The fault matrix's harness: each cell runs the real CLI (`python -m runinfra_opt optimize`, in a process of its
own) on a small run, injects one fault at one point, and records what it leaves (exit code, time to exit, status,
processes left behind, records lost, the decision `--resume` reaches). benchmarks/faults.py runs every cell and
keeps the summary; tests/test_faults.py runs the cells that take under a minute. See benchmarks/faults.py for the
faults."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAKE_VLLM = REPO / "tests" / "fake_vllm"
MARKER = "RUNINFRA_FAULT_CELL"
EXIT_LIMIT_S = 5.0
HUNG_WAIT_S = 150.0
"""How long the hung-server cell waits for the tool to notice by itself (`client.HUNG_AFTER`: about 45 s a
server) before cancelling it."""

HOOK = """
import json, os, signal, sys, time
from runinfra_opt.optimize.state import RunState
AT, SIG, OUT = os.environ["FAULT_AT"], int(os.environ["FAULT_SIG"]), os.environ["FAULT_OUT"]

def fire(state):
    records = [[v.name, r.request_id, r.repeat] for v in state.results.variants for r in v.measured_requests]
    with open(OUT, "w") as f:
        json.dump({"at": time.time(), "records": records, "phase": state.results.phase}, f)
    RunState.fired = True
    os.kill(os.getpid(), SIG)

save, finish = RunState.save, RunState.finish_phase
def finish_then_fire(self, phase):
    finish(self, phase)
    if AT == "after:" + phase and not getattr(RunState, "fired", False):
        fire(self)
def save_then_fire(self):
    save(self)
    if AT == "mid-confirm" and not getattr(RunState, "fired", False) and "predict" in self.results.phases_done:
        if any(v.name != "baseline" and v.measured_requests for v in self.results.variants):
            fire(self)
RunState.finish_phase, RunState.save = finish_then_fire, save_then_fire
if AT == "mid-load-level":
    import asyncio
    import runinfra_opt.engine.vllm.engine as engine
    level = engine.run_level
    async def fire_during(*args, **kwargs):
        loop = asyncio.get_running_loop()
        def now():
            if not getattr(RunState, "fired", False):
                with open(OUT, "w") as f:
                    json.dump({"at": time.time(), "records": None, "phase": "confirm (load level)"}, f)
                RunState.fired = True
                os.kill(os.getpid(), SIG)
        loop.call_later(0.3, now)
        return await level(*args, **kwargs)
    engine.run_level = fire_during
from runinfra_opt.cli.app import main
main()
"""
"""The CLI with a fault injected at `FAULT_AT` (after:PHASE, mid-confirm, mid-load-level): it records the records
finished so far and the time, then signals itself with FAULT_SIG through the real signal handling."""


@dataclass
class Cell:
    name: str
    engine: str
    fault: str
    phase: str
    exit_code: int | None = None
    exit_s: float | None = None
    status: str | None = None
    left_behind: int = 0
    lost: int | None = None
    resume_exit: int | None = None
    decision: str | None = None
    same_decision: bool | None = None
    note: str = ""
    stderr_tail: str = field(default="", repr=False)


class Bench:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.python = sys.executable
        self.reference: dict[str, str] = {}
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(FAKE_VLLM)])
        self.env["RUNINFRA_OPT_CACHE"] = str(out / "cache")
        self.env.setdefault("OMP_NUM_THREADS", "1")
        for key in ("FAKE_VLLM_MODE", "FAKE_VLLM_SPEC", "FAKE_VLLM_BASE", "FAKE_VLLM_STEP"):
            self.env.pop(key, None)
        from tests.tiny_models import build_pair

        target, draft = build_pair(out / "tiny")
        self.target, self.draft = str(target), str(draft)
        self.workload = out / "w.jsonl"
        rows = [{"id": f"r{i}", "category": "copy" if i % 2 else "chat", "prompt": "abc abc hello " * (1 + i % 3),
                 "max_tokens": 24} for i in range(6)]  # fmt: skip
        self.workload.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    # ---- commands --------------------------------------------------------------------------------------------
    def args(self, engine: str, run_dir: Path, *, load: str = "none") -> list[str]:
        common = ["--workload", str(self.workload), "--target", self.target, "--max-tokens", "24", "--run-dir",
                  str(run_dir), "--out", str(run_dir.parent / f"{run_dir.name}.yaml")]  # fmt: skip
        if engine == "transformers":
            # the tiny draft is clearly slower than its target (0.66x measured): every run, disturbed or not,
            # decides the same beyond noise, so a resume's decision is compared with the undisturbed one's
            # (n-gram here measured 1.0-1.1x, which decides either way by noise)
            return ["optimize", *common, "--threads", "1", "--methods", "draft", "--draft", self.draft, "--lookahead",
                    "4", "--confirm", "1", "--repeats", "2"]  # fmt: skip
        return ["optimize", "--engine", "vllm", "--vllm-python", self.python, *common, "--methods", "vllm_ngram",
                "--lookahead", "4", "--ngram-max", "2", "--repeats", "2", "--load", load]  # fmt: skip

    def start(self, cell: str, argv: list[str], *, env: dict[str, str] | None = None,
              code: str | None = None, preexec: Callable[[], None] | None = None) -> subprocess.Popen[str]:  # fmt: skip
        full = dict(env or self.env)
        full[MARKER] = cell
        head = ["-c", code] if code else ["-m", "runinfra_opt"]
        return subprocess.Popen(
            [self.python, *head, *argv], env=full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            cwd=self.out, preexec_fn=preexec,
        )  # fmt: skip

    def finish(self, proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str, float]:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        return proc.returncode, err or "", time.time()

    def left_behind(self, cell: str, grace_s: float = EXIT_LIMIT_S) -> int:
        """Live processes whose environment carries this cell's marker (the tool, its servers, their children)
        still there `grace_s` after the cell's process ended: a server whose tool was SIGKILLed is told to stop by
        the kernel (its parent-death signal) and takes a moment to exit. Any found are then killed, so that the
        next cell starts clean."""
        deadline = time.monotonic() + grace_s
        found = self._marked(cell)
        while found and time.monotonic() < deadline:
            time.sleep(0.1)
            found = self._marked(cell)
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return len(found)

    @staticmethod
    def _marked(cell: str) -> list[int]:
        needle = f"{MARKER}={cell}\0".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if needle in (entry / "environ").read_bytes():
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        found.append(int(entry.name))
            except OSError:
                continue
        return found

    def status(self, run_dir: Path) -> str:
        from runinfra_opt.errors import UserInputError
        from runinfra_opt.report.locate import load_run

        try:
            return load_run(str(run_dir)).status
        except UserInputError as exc:
            return f"unreadable ({str(exc).splitlines()[0][-60:]})"

    def decision(self, run_dir: Path) -> str | None:
        data = json.loads((run_dir / "results.json").read_text())
        return (data.get("decision") or {}).get("winner")

    def records(self, run_dir: Path) -> set[tuple[str, str, int]]:
        data = json.loads((run_dir / "results.json").read_text())
        return {(v["name"], r["request_id"], r["repeat"]) for v in data["variants"] for r in v["measured_requests"]}

    def ended(self, cell: Cell, proc: subprocess.Popen[str], since: float, run_dir: Path) -> None:
        """Wait for the cell's process and record its exit, the seconds `since`, what is left and the status."""
        code, err, ended = self.finish(proc)
        cell.exit_code, cell.exit_s, cell.stderr_tail = code, round(ended - since, 2), err[-1500:]
        cell.left_behind = self.left_behind(cell.name)
        cell.status, cell.lost = self.status(run_dir), 0

    def undisturbed(self, engine: str, *, load: str = "none") -> str:
        key = f"{engine}/{load}"
        if key not in self.reference:
            run_dir = self.out / f"reference-{engine}-{load.replace(':', '')}"
            shutil.rmtree(run_dir, ignore_errors=True)
            code, err, _ = self.finish(self.start("reference", self.args(engine, run_dir, load=load)))
            assert code == 0, err[-2000:]
            self.reference[key] = self.decision(run_dir) or "?"
        return self.reference[key]

    def resume(self, cell: Cell, run_dir: Path, engine: str, *, load: str = "none",
               env: dict[str, str] | None = None) -> None:  # fmt: skip
        proc = self.start(cell.name + "-resume", ["optimize", "--resume", str(run_dir), "--out",
                          str(run_dir.parent / f"{run_dir.name}.yaml")], env=env)  # fmt: skip
        code, err, _ = self.finish(proc)
        cell.resume_exit = code
        cell.left_behind += self.left_behind(cell.name + "-resume")
        if code == 0:
            cell.decision = self.decision(run_dir)
            cell.same_decision = cell.decision == self.undisturbed(engine, load=load)
        else:
            cell.note += f" resume: {err.strip().splitlines()[-1][:120] if err.strip() else code}"

    # ---- cells -----------------------------------------------------------------------------------------------
    def signal_cell(self, engine: str, sig: signal.Signals, at: str, *, load: str = "none") -> Cell:
        name = f"{engine}-{sig.name}-{at}".replace(":", "-")
        cell = Cell(name, engine, sig.name, at)
        run_dir = self.out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        fired = self.out / f"{name}.fired.json"
        fired.unlink(missing_ok=True)
        env = dict(self.env, FAULT_AT=at, FAULT_SIG=str(int(sig)), FAULT_OUT=str(fired))
        code, err, ended = self.finish(self.start(name, self.args(engine, run_dir, load=load), env=env, code=HOOK))
        cell.exit_code, cell.stderr_tail = code, err[-1500:]
        cell.left_behind = self.left_behind(name)
        if not fired.exists():
            cell.note = "the fault point was not reached"
            return cell
        seen = json.loads(fired.read_text())
        cell.exit_s = round(ended - seen["at"], 2)
        cell.status = self.status(run_dir)
        if seen["records"] is not None:
            cell.lost = len({tuple(r) for r in seen["records"]} - self.records(run_dir))  # type: ignore[misc]
        else:
            cell.lost = 0 if (run_dir / "results.json").is_file() else None
        self.resume(cell, run_dir, engine, load=load)
        return cell

    def startup_cell(self, mode: str, *, resume: bool = True) -> Cell:
        """SIGTERM while the (stand-in) server never becomes healthy; `stubborn` also ignores SIGTERM. With
        `resume`, the run is then resumed and its decision compared with an undisturbed run's."""
        name = f"vllm-SIGTERM-start-up-{mode}"
        cell = Cell(name, "vllm (stand-in)", "SIGTERM" + (" (server ignores SIGTERM)" if mode == "stubborn" else ""),
                    "server start-up")  # fmt: skip
        run_dir = self.out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        env = dict(self.env, FAKE_VLLM_MODE="stubborn_hang" if mode == "stubborn" else mode)
        proc = self.start(name, self.args("vllm", run_dir), env=env)
        deadline = time.monotonic() + 120
        while not list((run_dir / "servers").glob("*.log")) if (run_dir / "servers").exists() else True:
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        self.ended(cell, proc, sent, run_dir)
        if resume:
            self.resume(cell, run_dir, "vllm")
        return cell

    def server_fault_cell(self, spec_mode: str, what: str, *, compare: bool = True) -> Cell:
        """The candidate's (stand-in) server misbehaves; the tool should go on, reporting that variant failed.
        With `compare`, the note names an undisturbed run's decision (one more run)."""
        name = f"vllm-server-{spec_mode.replace(':', '-')}"
        cell = Cell(name, "vllm (stand-in)", what, "confirm (candidate's server)")
        run_dir = self.out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        env = dict(self.env, FAKE_VLLM_SPEC=spec_mode)
        start = time.time()
        code, err, ended = self.finish(self.start(name, self.args("vllm", run_dir), env=env), timeout=240)
        cell.exit_code, cell.stderr_tail = code, err[-1500:]
        cell.exit_s = None if code == 0 else round(ended - start, 1)
        cell.left_behind = self.left_behind(name)
        cell.status, cell.lost = self.status(run_dir), 0
        if code == 0:
            cell.decision = self.decision(run_dir)
            data = json.loads((run_dir / "results.json").read_text())
            failed = [v["name"] for v in data["variants"] if v.get("failed")]
            failed += [launch["variant"] for launch in data.get("launches", []) if launch.get("error")]
            disq = [v["name"] for v in data["variants"] if v.get("disqualified")]
            cell.note = f"failed {sorted(set(failed))}, disqualified {disq}"
            if compare:
                cell.note += "; the undisturbed run picks " + self.undisturbed("vllm")
        return cell

    def hung_server_cell(self) -> Cell:
        """The candidate's server stops answering mid-run (SIGSTOP to its group): does the tool notice, and can a
        CI runner still cancel it within its grace period?"""
        name = "vllm-server-hung"
        cell = Cell(name, "vllm (stand-in)", "server hung (SIGSTOP)", "confirm (candidate's server)")
        run_dir = self.out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        env = dict(self.env, FAKE_VLLM_SPEC="stop_after:1")
        started = time.time()
        proc = self.start(name, self.args("vllm", run_dir), env=env)
        try:
            proc.wait(timeout=HUNG_WAIT_S)
            cell.note = "the tool failed the hung server's requests by itself; exit s: the whole run"
        except subprocess.TimeoutExpired:
            cell.note = f"still waiting on the hung server after {HUNG_WAIT_S:.0f} s; cancelled with SIGTERM"
            started = time.time()
            proc.send_signal(signal.SIGTERM)
        self.ended(cell, proc, started, run_dir)
        if cell.status == "complete":
            cell.decision = self.decision(run_dir)
        else:
            self.resume(cell, run_dir, "vllm", env=self.env)
        return cell

    def port_taken_cell(self) -> Cell:
        """The port picked for a server is taken before it binds (library level: `free_port` hands out a bound
        port first): the launch is retried on another."""
        import runinfra_opt.engine.vllm.server as server_module
        from runinfra_opt.engine.vllm.args import ServerConfig

        cell = Cell("vllm-port-taken", "vllm (stand-in)", "port taken", "server start-up")
        blocker = socket.socket()
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        ports = iter([taken])
        real = server_module.free_port
        server_module.free_port = lambda host="127.0.0.1": next(ports, None) or real(host)  # type: ignore[assignment]
        saved = dict(os.environ)
        os.environ.update({"PYTHONPATH": self.env["PYTHONPATH"], MARKER: cell.name})
        start = time.time()
        try:
            with server_module.VllmServer(self.python, ServerConfig(self.target), self.out / "port-logs") as server:
                cell.note = f"retried: served on port {server.port} (taken: {taken})"
            cell.exit_code = 0
        except Exception as exc:  # noqa: BLE001 (recorded as the cell's outcome)
            cell.exit_code, cell.note = 5, str(exc).splitlines()[0][:150]
        finally:
            os.environ.clear()
            os.environ.update(saved)
            server_module.free_port = real
            blocker.close()
        cell.exit_s = round(time.time() - start, 2)
        cell.left_behind, cell.lost, cell.status = self.left_behind(cell.name), 0, "n/a (library)"
        return cell

    def disk_full_cell(self, tmpfs: bool) -> Cell:
        """results.json cannot be written (ENOSPC on a small tmpfs, or EFBIG under RLIMIT_FSIZE) mid-run."""
        how = "tmpfs" if tmpfs else "RLIMIT_FSIZE"
        cell = Cell("transformers-disk-full", "transformers", f"disk full ({how})", "any write of results.json")
        mount = self.out / "small-disk"
        run_dir = mount / "run"
        limit = 40_000
        preexec = None
        if tmpfs:
            mount.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={2 * limit}", "tmpfs", str(mount)], check=True)
        else:
            import resource

            mount.mkdir(exist_ok=True)
            shutil.rmtree(run_dir, ignore_errors=True)

            def preexec() -> None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        try:
            start = time.time()
            code, err, ended = self.finish(self.start(cell.name, self.args("transformers", run_dir), preexec=preexec))
            cell.exit_code, cell.exit_s, cell.stderr_tail = code, round(ended - start, 1), err[-1500:]
            cell.left_behind = self.left_behind(cell.name)
            cell.status = self.status(run_dir)
            cell.note = (err.strip().splitlines() or [""])[-1][:160]
            cell.lost = 0 if (run_dir / "results.json").is_file() else None
            moved = self.out / "disk-full-run"
            shutil.rmtree(moved, ignore_errors=True)
            shutil.copytree(run_dir, moved)  # room again: resume it where the disk has space
        finally:
            if tmpfs:
                subprocess.run(["umount", str(mount)], check=False)
        self.resume(cell, moved, "transformers")
        return cell

    def corrupt_cell(self, what: str) -> Cell:
        """A file the next start reads is truncated: results.json (resume), the cost cache, the model."""
        cell = Cell(f"transformers-corrupt-{what}", "transformers", f"truncated {what}", "next start")
        run_dir = self.out / cell.name
        shutil.rmtree(run_dir, ignore_errors=True)
        if what == "results.json":
            run_dir.mkdir(parents=True)
            text = json.dumps({"tool": "runinfra-opt", "schema_version": 2, "run_id": cell.name, "status": "running"})
            (run_dir / "results.json").write_text(text[: len(text) // 2])
            argv = ["optimize", "--resume", str(run_dir)]
        elif what == "cost cache":
            self.undisturbed("transformers")  # fills the cache
            caches = [p for p in (self.out / "cache").rglob("*.json") if "cost" in p.name or "cost" in p.parent.name]
            for path in caches:
                path.write_text(path.read_text()[: max(1, path.stat().st_size // 2)])
            cell.note = f"{len(caches)} cost cache file(s) truncated; "
            argv = self.args("transformers", run_dir)
        else:
            model = self.out / "broken-model"
            shutil.rmtree(model, ignore_errors=True)
            shutil.copytree(self.target, model)
            weights = next(model.glob("*.safetensors"))
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
            argv = self.args("transformers", run_dir)
            argv[argv.index("--target") + 1] = str(model)
        start = time.time()
        code, err, ended = self.finish(self.start(cell.name, argv))
        cell.exit_code, cell.exit_s, cell.stderr_tail = code, round(ended - start, 1), err[-1500:]
        cell.left_behind, cell.lost = self.left_behind(cell.name), 0
        lines = err.strip().splitlines()
        cell.note += ("traceback! " if "Traceback" in err else "") + (lines[-1][:160] if lines else "")
        if (run_dir / "results.json").is_file():
            cell.status = self.status(run_dir)
        if code == 0:
            cell.decision = self.decision(run_dir)
            cell.same_decision = cell.decision == self.undisturbed("transformers")
        return cell

    def two_resumes_cell(self) -> Cell:
        """An interrupted run resumed by two processes at once: one refuses at once, the other finishes it."""
        cell = Cell("transformers-two-resumes", "transformers", "two --resume at once", "resume")
        run_dir = self.out / cell.name
        shutil.rmtree(run_dir, ignore_errors=True)
        fired = self.out / "two.fired.json"
        env = dict(self.env, FAULT_AT="after:plan", FAULT_SIG=str(int(signal.SIGTERM)), FAULT_OUT=str(fired))
        self.finish(self.start(cell.name, self.args("transformers", run_dir), env=env, code=HOOK))
        argv = ["optimize", "--resume", str(run_dir), "--out", str(self.out / "two.yaml")]
        first, second = self.start(cell.name, argv), self.start(cell.name, argv)
        (c1, e1, _), (c2, e2, _) = self.finish(first), self.finish(second)
        cell.exit_code = c1 if c1 != 0 else c2
        cell.resume_exit = 0 if 0 in (c1, c2) else c1
        refused = e2 if c1 == 0 else e1
        cell.note = f"exits {c1} and {c2}; refused with: {refused.strip().splitlines()[-1][:140] if refused else ''}"
        cell.left_behind, cell.lost = self.left_behind(cell.name), 0
        cell.status = self.status(run_dir)
        if 0 in (c1, c2):
            cell.decision = self.decision(run_dir)
            cell.same_decision = cell.decision == self.undisturbed("transformers")
        return cell


def cells(bench: Bench, tmpfs: bool) -> dict[str, Callable[[], Cell]]:
    out: dict[str, Callable[[], Cell]] = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for at in ("after:cost", "after:baseline", "mid-confirm"):
            out[f"transformers-{sig.name}-{at}"] = lambda s=sig, a=at: bench.signal_cell("transformers", s, a)
    # SIGINT takes SIGTERM's path (a KeyboardInterrupt each): one point shows it
    out["transformers-SIGINT-mid-confirm"] = lambda: bench.signal_cell("transformers", signal.SIGINT, "mid-confirm")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        out[f"vllm-{sig.name}-mid-confirm"] = lambda s=sig: bench.signal_cell("vllm", s, "mid-confirm")
    out["vllm-SIGTERM-mid-load-level"] = lambda: bench.signal_cell(
        "vllm", signal.SIGTERM, "mid-load-level", load="concurrency:1,2"
    )
    out["vllm-SIGTERM-start-up"] = lambda: bench.startup_cell("hang")
    out["vllm-SIGTERM-start-up-stubborn"] = lambda: bench.startup_cell("stubborn")
    out["vllm-server-killed"] = lambda: bench.server_fault_cell("die_after:2", "server killed")
    out["vllm-server-500s"] = lambda: bench.server_fault_cell("error500_after:2", "server answers 500")
    out["vllm-server-drops"] = lambda: bench.server_fault_cell("drop_after:2", "connection dropped mid-stream")
    out["vllm-server-hung"] = bench.hung_server_cell
    out["vllm-port-taken"] = bench.port_taken_cell
    out["disk-full"] = lambda: bench.disk_full_cell(tmpfs)
    for what in ("results.json", "cost cache", "model"):
        out[f"corrupt-{what}"] = lambda w=what: bench.corrupt_cell(w)
    out["two-resumes"] = bench.two_resumes_cell
    return out


def table(rows: list[Cell]) -> str:
    head = ("cell", "exit", "exit s", "status", "left", "lost", "resume", "decision", "same", "note")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for c in rows:
        values = (c.name, c.exit_code, c.exit_s, c.status, c.left_behind, c.lost, c.resume_exit, c.decision,
                  c.same_decision, c.note.strip())  # fmt: skip
        lines.append(" | ".join("-" if v is None else str(v) for v in values))
    return "\n".join(lines)


def can_mount_tmpfs(where: Path) -> bool:
    if os.geteuid() != 0:
        return False
    probe = where / "tmpfs-probe"
    probe.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True)
    if done.returncode == 0:
        subprocess.run(["umount", str(probe)], check=False)
    return done.returncode == 0
