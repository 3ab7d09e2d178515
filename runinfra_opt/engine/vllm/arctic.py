"""Arctic Inference's suffix-decoding cache, which vLLM's `"method": "suffix"` imports and does not install.

PyPI has `arctic-inference` as a source distribution only; it compiles its suffix tree with CMake and nanobind.
It is built once into a wheel under `<cache>/wheels/` (a build environment of its own on the project's torch,
whose `bin/` goes first on PATH: CMake must find that environment's Python and nanobind; build isolation would
pull a CUDA torch), then installed without dependencies into the vLLM environment (the server) and into
runinfra-opt's own (the simulation). A file lock makes concurrent installs build it once. The package also
registers a vLLM plugin that does nothing unless `ARCTIC_INFERENCE_ENABLED=1`."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from runinfra_opt.engine.vllm.environment import run_logged, torch_pin
from runinfra_opt.errors import EngineError
from runinfra_opt.models import cache_dir

ARCTIC_VERSION = "0.3.0"
MODULE = "arctic_inference.suffix_decoding"
BUILD_LOG = "arctic-build.log"
BUILD_TIMEOUT_S = 1800.0
BUILD_PACKAGES = (
    "nanobind==2.9.2",
    "cmake",
    "ninja",
    "setuptools",
    "wheel",
    "protobuf==5.29.6",
    "grpcio-tools",
    "numpy",
)
"""The source distribution's build requirements (its pyproject), with the project's torch pinned beside them."""


def wheels_dir() -> Path:
    return cache_dir() / "wheels"


def cached_wheel(python_tag: str | None = None) -> Path | None:
    """The built wheel for this Python (`cp311`), if any."""
    tag = python_tag or f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = sorted(wheels_dir().glob(f"arctic_inference-{ARCTIC_VERSION}-{tag}-*.whl"))
    return found[-1] if found else None


def _run(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    run_logged(command, log, "Arctic Inference build", timeout_s=BUILD_TIMEOUT_S, env=env, lines=12)


def build_commands(venv: Path, installer: str, base_python: str) -> list[list[str]]:
    """The build environment and the wheel build (pure, so they can be checked without running)."""
    python = str(venv / "bin" / "python")
    requirements = [torch_pin(), *BUILD_PACKAGES, "pip"]
    if installer == "uv":
        links = [f"--find-links={link}" for link in os.environ.get("PIP_FIND_LINKS", "").split() if link]
        setup = [
            ["uv", "venv", "--quiet", "--python", base_python, str(venv)],
            ["uv", "pip", "install", "--python", python, "--index-strategy", "unsafe-best-match", *links,
             *requirements],
        ]  # fmt: skip
    else:
        setup = [[base_python, "-m", "venv", str(venv)], [python, "-m", "pip", "install", *requirements]]
    wheel = [
        python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--wheel-dir", str(wheels_dir()),
        f"arctic-inference=={ARCTIC_VERSION}",
    ]  # fmt: skip
    return [*setup, wheel]


def build_wheel(installer: str, *, say: Callable[[str], None] = lambda _: None) -> Path:
    """The cached wheel, built first when there is none (minutes); EngineError with the log's last lines when
    the build fails."""
    from filelock import FileLock

    folder = wheels_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / "arctic.lock")):
        found = cached_wheel()
        if found is not None:
            return found
        venv, log = folder / "arctic-build-venv", folder / BUILD_LOG
        shutil.rmtree(venv, ignore_errors=True)
        log.write_text("", encoding="utf-8")
        say(f"building arctic-inference=={ARCTIC_VERSION} (suffix decoding; minutes; log: {log})")
        env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        for command in build_commands(venv, installer, sys.executable):
            _run(command, log, env)
        shutil.rmtree(venv, ignore_errors=True)
        found = cached_wheel()
        if found is None:
            raise EngineError(f"Arctic Inference build: no wheel for this Python in {folder}; log: {log}")
        return found


def install_into(python: str, installer: str, *, say: Callable[[str], None] = lambda _: None) -> None:
    """Install the (built or cached) wheel into the environment of `python`, without dependencies, and check
    that the cache imports there."""
    if missing_module(python, MODULE) is None:
        return
    wheel = build_wheel(installer, say=say)
    log = wheels_dir() / BUILD_LOG
    if installer == "uv":
        _run(["uv", "pip", "install", "--python", python, "--no-deps", str(wheel)], log)
    else:
        _run([python, "-m", "pip", "install", "--no-deps", str(wheel)], log)
    _missing_module.cache_clear()
    problem = missing_module(python, MODULE)
    if problem is not None:
        raise EngineError(f"Arctic Inference installed into {python}, but {problem}")


def missing_module(python: str, module: str) -> str | None:
    """None when `module` imports in the environment of `python` (as servers start from it: with this process's
    environment variables), else why not (one line)."""
    return _missing_module(python, module, os.environ.get("PYTHONPATH", ""))


@functools.cache
def _missing_module(python: str, module: str, pythonpath: str) -> str | None:
    try:
        done = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "PYTHONNOUSERSITE": "1", "PYTHONPATH": pythonpath},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot check `import {module}` in {python}: {exc}"
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return f"`import {module}` fails in {python} ({last}); `runinfra-opt engine install vllm` builds it"


def ensure(vllm_python: str, installer: str, *, say: Callable[[str], None] = lambda _: None) -> str | None:
    """Arctic Inference in the vLLM environment (the server) and in this one (the simulation): None when both
    import it, else why not, the build log's last lines included (method `suffix` is then left out)."""
    try:
        for python in (vllm_python, sys.executable):
            install_into(python, installer, say=say)
    except EngineError as exc:
        return str(exc)
    return None
