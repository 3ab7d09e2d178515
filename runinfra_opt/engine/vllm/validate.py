"""Serving arguments checked by vLLM itself: its own `vllm serve` parser and engine configuration, run in the vLLM
environment by a short script (`resources/check_serve_args.py`) before anything is launched."""

from __future__ import annotations

import json
import os
import subprocess
from importlib.resources import files
from typing import Any

from runinfra_opt.engine.vllm.server import ServerError

CHECK_SCRIPT = "resources/check_serve_args.py"
"""The script, beside this module (package data), run in the vLLM environment with `python -c`."""


def _check_script() -> str:
    return files("runinfra_opt.engine.vllm").joinpath(CHECK_SCRIPT).read_text(encoding="utf-8")


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
    command = [python, "-c", _check_script(), *(["--build-config"] if build_config else [])]
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
