"""One vLLM OpenAI-compatible server: launched with a variant's serving arguments, on loopback, behind a
per-run API key, in its own process group; waited on until healthy; always stopped.

`VllmServer` is a context manager that never leaves a server behind: it stops the whole process group (the
API server starts an engine-core child; signalling only the launched PID can leave that running) with
SIGTERM, then SIGKILL after a grace period, on a normal exit, on an exception, on Ctrl-C and on SIGTERM to
this process (turned into `runinfra_opt.signals.Terminated` while a server runs, so the CLI exits 143).
The server is also asked to receive SIGTERM when this process dies (Linux's parent-death signal), and
stopped at interpreter exit as a last resort.

The API key never leaves this process except to the server (through its environment, `VLLM_API_KEY`, so it
is not on the server's command line either): commands written to logs show it redacted.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from runinfra_opt.engine.vllm.args import ServerConfig
from runinfra_opt.errors import EngineError
from runinfra_opt.signals import CANCEL_GRACE_S, cancelling, raise_terminated

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 600.0
DEFAULT_GRACE_S = 20.0
DEFAULT_KVCACHE_GIB = 2
"""`VLLM_CPU_KVCACHE_SPACE` (GiB) when the user has not set it: ample for small models at 2k context, and
small enough for several helpers on a 24 GiB machine (vLLM's own default reserves far more)."""
LOG_TAIL_LINES = 15
CAUSE_SEARCH_LINES = 80
CAUSE_MAX_CHARS = 300
_ERROR_LINE = re.compile(r"\b[\w.]*(?:Error|Exception)\b: .*")
"""A Python exception's last traceback line (vLLM prefixes its log lines with the process and level)."""
REDACTED = "<redacted>"


class ServerError(EngineError):
    """The server could not start, died, or did not become healthy; the message quotes its log's tail."""


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (the server may still lose a race for it: see `VllmServer`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def redact(command: list[str], secret: str) -> list[str]:
    """The command with the secret (as a value or inside one) replaced, for logs and messages."""
    return [part.replace(secret, REDACTED) if secret else part for part in command]


def _set_parent_death_signal() -> None:
    """In the child before exec: receive SIGTERM when the launching process dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a live process is left in the group. Zombies do not count: an engine-core child killed with its
    parent waits as a zombie until PID 1 reaps it, which in a container may be never (seconds were lost here)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


_LIVE: set[VllmServer] = set()


def stop_servers(servers: Sequence[VllmServer], *, cancelled: bool = False) -> None:
    """Stop servers together: SIGTERM to every group at once, one grace period for all (each its own, from the same
    moment), then SIGKILL to what is left; returns when every group is gone. One after another, their grace periods
    would add up: a baseline kept beside a candidate that ignore SIGTERM took 5.6 s to stop on cancellation."""
    started = time.monotonic()
    stopping: list[tuple[subprocess.Popen[bytes], float]] = []
    for server in servers:
        signalled = server._signal_stop(cancelled)
        if signalled is not None:
            stopping.append((signalled[0], started + signalled[1]))
    for process, deadline in stopping:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    left = [process for process, _ in stopping if process.poll() is None or _group_alive(process.pid)]
    for process in left:
        VllmServer._signal_group(process.pid, signal.SIGKILL)
    for process in left:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        end = time.monotonic() + 10
        while _group_alive(process.pid) and time.monotonic() < end:
            time.sleep(0.1)


@atexit.register
def _stop_all() -> None:
    stop_servers(list(_LIVE))


class VllmServer:
    """A running vLLM server. Use as `with VllmServer(python, config, log_dir) as server: ...`."""

    def __init__(
        self,
        python: str,
        config: ServerConfig,
        log_dir: Path,
        *,
        name: str = "vllm-server",
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        grace_s: float = DEFAULT_GRACE_S,
        kvcache_gib: int | None = None,
        port: int | None = None,
        port_attempts: int = 3,
    ) -> None:
        self.python = python
        self.config = config
        self.log_path = Path(log_dir) / f"{name}.log"
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.kvcache_gib = kvcache_gib
        self._fixed_port = port
        self._port_attempts = 1 if port is not None else max(1, port_attempts)
        self.api_key = secrets.token_urlsafe(32)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self._previous_sigterm: Any = None

    # -- what is launched ---------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def model_name(self) -> str:
        """The name requests use (vLLM serves the model under its `--model` value)."""
        return self.config.model

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            API_SERVER_MODULE,
            *self.config.serve_args(),
            "--host",
            HOST,
            "--port",
            str(self.port),
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "VLLM_API_KEY": self.api_key,
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "PYTHONNOUSERSITE": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.kvcache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kvcache_gib)
        else:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_KVCACHE_GIB))
        # vLLM 0.32's AOT compile cache (its default with torch >= 2.10) fails to load on the CPU build and
        # recompiles at every launch; torch.compile's own cache, used with AOT off, does load (docs/engines.md).
        # How the compiled graph is cached, not what is compiled.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        return env

    # -- lifecycle ----------------------------------------------------------------------------------------
    def __enter__(self) -> VllmServer:
        self._install_sigterm_handler()
        try:
            self.start()
        except BaseException as exc:
            self.stop(cancelled=isinstance(exc, KeyboardInterrupt))
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(cancelled=isinstance(exc, KeyboardInterrupt))

    def start(self) -> None:
        """Launch and wait until `/health` answers; raise ServerError (quoting the log) if it cannot."""
        for attempt in range(self._port_attempts):
            self._launch()
            try:
                self.wait_ready()
                return
            except ServerError:
                lost_port = "address already in use" in self.log_tail().lower()
                self.stop()
                if not lost_port or attempt + 1 == self._port_attempts:
                    raise

    def _launch(self) -> None:
        self.port = self._fixed_port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self.command()
        with self.log_path.open("ab") as log:
            shown = shlex.join(redact(command, self.api_key))
            log.write(f"$ VLLM_API_KEY={REDACTED} {shown}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.environment(),
                    start_new_session=True,
                    preexec_fn=_set_parent_death_signal,
                )
            except OSError as exc:
                raise ServerError(f"cannot start vLLM ({self.python}): {exc}") from None
        self._started_at = time.perf_counter()
        _LIVE.add(self)

    def wait_ready(self) -> None:
        """Poll `/health` until it answers 200; fail fast when the process exits; time out after the limit."""
        import httpx

        assert self.process is not None
        deadline = self._started_at + self.startup_timeout_s
        with httpx.Client(timeout=5.0, trust_env=False) as http:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise ServerError(
                        f"vLLM server exited during start-up (exit code {code}): {self.cause()}; log {self.log_path}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.base_url}/health").status_code == 200:
                        self.startup_s = time.perf_counter() - self._started_at
                        return
                if time.perf_counter() > deadline:
                    raise ServerError(
                        f"vLLM server not healthy after {self.startup_timeout_s:.0f} s (last logged: {self.cause()}); "
                        f"log {self.log_path}"
                    )
                time.sleep(0.5)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        """Raise ServerError (quoting the log) if the server has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise ServerError(
                f"vLLM server died (exit code {self.process.returncode}): {self.cause()}; log {self.log_path}"
            )

    def stop(self, *, cancelled: bool = False) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period (`CANCEL_GRACE_S` when this process is
        being cancelled: the exit must fit a CI grace period); returns when the group is gone."""
        stop_servers([self], cancelled=cancelled)

    def _signal_stop(self, cancelled: bool) -> tuple[subprocess.Popen[bytes], float] | None:
        """SIGTERM (and SIGCONT) to the group; (the process, its grace period), or None when not running."""
        process, self.process = self.process, None
        _LIVE.discard(self)
        self._restore_sigterm_handler()
        if process is None:
            return None
        grace = CANCEL_GRACE_S if cancelled or cancelling() else self.grace_s
        self._signal_group(process.pid, signal.SIGTERM)  # start_new_session: the server leads its own group
        self._signal_group(process.pid, signal.SIGCONT)  # a stopped (hung) server acts on SIGTERM only once continued
        return process, grace

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def cause(self) -> str:
        """The log's last error line (`SomeError: message`, a server's traceback ends with it), else its last
        line: what a one-line message quotes."""
        lines = [line.strip() for line in self.log_tail(CAUSE_SEARCH_LINES).splitlines() if line.strip()]
        for line in reversed(lines):
            found = _ERROR_LINE.search(line)
            if found:
                return found.group(0)[:CAUSE_MAX_CHARS]
        return (lines[-1] if lines else "(empty log)")[:CAUSE_MAX_CHARS]

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.replace(self.api_key, REDACTED).splitlines()[-lines:])

    # -- SIGTERM to this process unwinds like Ctrl-C while a server runs -----------------------------------
    def _install_sigterm_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_sigterm = signal.signal(signal.SIGTERM, raise_terminated)

    def _restore_sigterm_handler(self) -> None:
        if self._previous_sigterm is None or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._previous_sigterm)
        self._previous_sigterm = None
