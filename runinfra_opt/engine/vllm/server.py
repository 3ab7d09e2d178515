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
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

from runinfra_opt.errors import EngineError, UserInputError
from runinfra_opt.signals import Terminated

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods import Variant

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 600.0
DEFAULT_GRACE_S = 20.0
DEFAULT_KVCACHE_GIB = 2
"""`VLLM_CPU_KVCACHE_SPACE` (GiB) when the user has not set it: ample for small models at 2k context, and
small enough for several helpers on a 24 GiB machine (vLLM's own default reserves far more)."""
LOG_TAIL_LINES = 15
REDACTED = "<redacted>"


class ServerError(EngineError):
    """The server could not start, died, or did not become healthy; the message quotes its log's tail."""


DEFAULT_DTYPE = "bfloat16"
DEFAULT_MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class ServerConfig:
    """Exactly the serving arguments a manifest carries for one variant (nothing run-specific)."""

    model: str
    dtype: str = DEFAULT_DTYPE
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    speculative_config: dict[str, Any] | None = None
    seed: int = 0
    extra_args: tuple[str, ...] = field(default=())
    """Further `vllm serve` arguments, passed through and recorded as they are."""

    def serve_args(self) -> list[str]:
        """The arguments after `vllm serve` / `python -m vllm.entrypoints.openai.api_server`."""
        args = ["--model", self.model, "--dtype", self.dtype, "--max-model-len", str(self.max_model_len)]
        if self.speculative_config is not None:
            args += ["--speculative-config", json.dumps(self.speculative_config, sort_keys=True)]
        args += ["--seed", str(self.seed), *self.extra_args]
        return args


@dataclass(frozen=True)
class ServeSettings:
    """What every variant of a run is served with: the target (a directory or hub id vLLM loads), its dtype,
    context length and seed, plus further `vllm serve` arguments. `server_config(variant)` is the one place
    where a variant becomes `vllm serve` arguments, for an engine to launch, for the manifest to record
    (`serving.vllm.args`) and for `manifest export --format vllm-config` to write as a `--config` file. An
    engine that launches servers records its settings in the run's environment under `ENVIRONMENT_KEY`
    (`to_dict()`), so that the manifest carries what was launched."""

    model: str
    dtype: str = DEFAULT_DTYPE
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    seed: int = 0
    extra_args: tuple[str, ...] = ()

    ENVIRONMENT_KEY: ClassVar[str] = "vllm_serve"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "extra_args": list(self.extra_args)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeSettings:
        return cls(
            model=str(data["model"]),
            dtype=str(data.get("dtype") or DEFAULT_DTYPE),
            max_model_len=int(data.get("max_model_len") or DEFAULT_MAX_MODEL_LEN),
            seed=int(data.get("seed") or 0),
            extra_args=tuple(str(a) for a in data.get("extra_args") or ()),
        )

    def server_config(self, variant: Variant, draft_path: str | None = None) -> ServerConfig:
        """The server for `variant` (`draft_path`: where its draft model or head is, when not its spec).
        Raises UserInputError when the variant's method has no vLLM equivalent (e.g. early exit)."""
        from runinfra_opt.methods import get_method

        method = get_method(variant.method)
        if draft_path is None and (drafter := method.drafter(variant)) is not None:
            draft_path = drafter.model
        serving = method.serving_vllm(variant, draft_path)
        if not serving.get("supported"):
            raise UserInputError(f"{variant.name} cannot be served by vLLM: {serving.get('note') or 'no equivalent'}")
        return ServerConfig(
            model=self.model,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            speculative_config=serving.get("speculativeConfig"),
            seed=self.seed,
            extra_args=self.extra_args,
        )


def config_file_mapping(args: list[str]) -> dict[str, Any]:
    """`vllm serve` arguments as the mapping of a `vllm serve --config FILE` YAML file, such that vLLM's
    `FlexibleArgumentParser.load_config_file` turns it back into exactly `args`: `--name value` becomes
    `name: value` (an integer stays an integer when it reads back the same; a JSON object, as
    `--speculative-config` takes, becomes a nested mapping, which vLLM writes back with `json.dumps`), and a
    flag with no value becomes `name: true`. Raises ValueError for an argument that is not an option, or an
    option given twice."""
    mapping: dict[str, Any] = {}
    index = 0
    while index < len(args):
        option = args[index]
        if not option.startswith("--") or len(option) == 2:
            raise ValueError(f"{option!r} is not an option (expected --name [value])")
        key, inline, value_text = option[2:].partition("=")
        if key in mapping:
            raise ValueError(f"--{key} is given twice")
        if inline:
            index += 1
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            value_text, index = args[index + 1], index + 2
        else:
            mapping[key] = True
            index += 1
            continue
        value: Any = value_text
        if value_text.startswith("{"):
            parsed = json.loads(value_text)
            if json.dumps(parsed) == value_text:  # vLLM writes a mapping back with json.dumps' defaults
                value = parsed
        elif value_text.lstrip("-").isdigit() and str(int(value_text)) == value_text:
            value = int(value_text)
        mapping[key] = value
    return mapping


# Run in the vLLM environment: parse each list of serving arguments with vLLM's own `vllm serve` parser (which
# also reads a `--config FILE`), run its quick checks, and build the engine configuration (reads the model's
# config.json and validates the speculative configuration without loading weights). Prints one JSON line per
# list: the parsed values, or vLLM's message when it rejects them (vLLM is imported once for all).
_CHECK_ARGS = """
import contextlib, io, json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
for argv in json.loads(sys.stdin.read()):
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        validate_parsed_serve_args(args)
        if "--build-config" in sys.argv:
            AsyncEngineArgs.from_cli_args(args).create_engine_config()
        out = {"model": args.model, "dtype": args.dtype, "max_model_len": args.max_model_len, "seed": args.seed,
               "speculative_config": args.speculative_config}
    except SystemExit:
        lines = [line for line in usage.getvalue().splitlines() if line.strip()]
        out = {"error": lines[-1] if lines else "invalid arguments"}
    except Exception as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        out = {"error": f"{type(exc).__name__}: {message}"[:600]}
    print(json.dumps(out, default=str), flush=True)
"""


def check_serve_args(
    python: str, args: list[str], *, build_config: bool = True, timeout_s: float = 300
) -> dict[str, Any]:
    """Parse `vllm serve` arguments with vLLM's own parser in its environment (and, with `build_config`, build
    its engine configuration, which rejects a bad speculative config in seconds instead of a failed launch).
    Returns what vLLM parsed; raises ServerError with vLLM's own message."""
    (parsed,) = check_serve_args_many(python, [args], build_config=build_config, timeout_s=timeout_s)
    if "error" in parsed:
        raise ServerError(f"vLLM rejects the serving arguments: {parsed['error']}")
    return parsed


def check_serve_args_many(
    python: str, arg_lists: list[list[str]], *, build_config: bool = True, timeout_s: float = 300
) -> list[dict[str, Any]]:
    """`check_serve_args` for several argument lists in one process (vLLM is imported once): for each, in
    order, what vLLM parsed, or `{"error": <vLLM's message>}` when it rejects them. Raises ServerError when
    vLLM cannot be run at all."""
    command = [python, "-c", _CHECK_ARGS, *(["--build-config"] if build_config else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    try:
        done = subprocess.run(
            command,
            input=json.dumps(arg_lists),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"cannot check vLLM arguments with {python}: {exc}") from None
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-len(arg_lists) :]
    if done.returncode != 0 or len(results) != len(arg_lists):
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise ServerError(
            f"cannot check vLLM arguments with {python}: {lines[-1] if lines else 'exit ' + str(done.returncode)}"
        )
    return [dict(result) for result in results]


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
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_LIVE: set[VllmServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


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
        # vLLM 0.32's AOT compile cache (its default with torch >= 2.10) fails to load on this CPU build
        # ("'function' object has no attribute 'finalize_loading'") and recompiles at every launch (~80 s);
        # torch.compile's own cache, which it uses with AOT off, does load: ~60 s less a launch after the first
        # of a configuration (docs/engines.md). How the compiled graph is cached, not what is compiled.
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        return env

    # -- lifecycle ----------------------------------------------------------------------------------------
    def __enter__(self) -> VllmServer:
        self._install_sigterm_handler()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

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
                        f"vLLM server exited during start-up (exit code {code}); log {self.log_path}, last lines:\n"
                        + self.log_tail()
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.base_url}/health").status_code == 200:
                        self.startup_s = time.perf_counter() - self._started_at
                        return
                if time.perf_counter() > deadline:
                    raise ServerError(
                        f"vLLM server not healthy after {self.startup_timeout_s:.0f} s; log {self.log_path}, "
                        "last lines:\n" + self.log_tail()
                    )
                time.sleep(0.5)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        """Raise ServerError (quoting the log) if the server has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise ServerError(
                f"vLLM server died (exit code {self.process.returncode}); log {self.log_path}, last lines:\n"
                + self.log_tail()
            )

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after the grace period; returns when the group is gone."""
        process, self.process = self.process, None
        _LIVE.discard(self)
        self._restore_sigterm_handler()
        if process is None:
            return
        pgid = process.pid  # start_new_session: the server leads its own group
        self._signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=self.grace_s)
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process.poll() is None or _group_alive(pgid):
            self._signal_group(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            end = time.monotonic() + 10
            while _group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.1)

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

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

        def _raise(signum: int, frame: FrameType | None) -> None:
            raise Terminated(f"signal {signum}")

        self._previous_sigterm = signal.signal(signal.SIGTERM, _raise)

    def _restore_sigterm_handler(self) -> None:
        if self._previous_sigterm is None or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._previous_sigterm)
        self._previous_sigterm = None
