"""The server lifecycle never leaves a process behind: normal exit, an exception, Ctrl-C, SIGTERM or SIGKILL
to the driving process, a server that dies or hangs at start-up, one that ignores SIGTERM, one killed
mid-run. These run a stand-in for vLLM's API server (tests/fake_vllm, same module path and arguments, with
an "engine core" child) so they take seconds; tests/test_vllm_e2e.py does the same with real vLLM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from runinfra_opt.engine.vllm import metrics
from runinfra_opt.engine.vllm.args import ServerConfig
from runinfra_opt.engine.vllm.client import CompletionRequest, replay
from runinfra_opt.engine.vllm.server import REDACTED, ServerError, VllmServer, redact

FAKE_VLLM = Path(__file__).parent / "fake_vllm"
REPO = Path(__file__).parent.parent


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in the process group."""
    done = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True, check=False)
    pids = [int(p) for p in done.stdout.split()]
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def pid_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pgid: int, timeout_s: float = 15.0) -> bool:
    """True once no live process is left in the group (its leader's pid)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if not group_members(pgid):
            return True
        time.sleep(0.1)
    return False


def logged_pids(log: Path) -> tuple[int, int]:
    """(API server pid = its group id, engine-core child pid) as the stand-in logged them."""
    line = log.read_text().split("api server pid ")[-1].split("\n")[0]
    server, child = line.replace(", engine core pid", "").split()
    return int(server), int(child)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> str:
    """The python that runs the stand-in server (our own, with the fake `vllm` package on its path)."""
    monkeypatch.setenv("PYTHONPATH", str(FAKE_VLLM))
    monkeypatch.delenv("FAKE_VLLM_MODE", raising=False)
    return sys.executable


def make(python: str, tmp_path: Path, **kwargs: object) -> VllmServer:
    config = ServerConfig("some-model", speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    return VllmServer(python, config, tmp_path / "logs", **kwargs)  # type: ignore[arg-type]


def test_serve_args_are_the_manifest_arguments() -> None:
    config = ServerConfig(
        "/m", dtype="float32", max_model_len=1024, seed=3, speculative_config={"num_speculative_tokens": 2, "a": 1}
    )
    assert config.serve_args() == [
        "--model", "/m", "--dtype", "float32", "--max-model-len", "1024",
        "--speculative-config", '{"a": 1, "num_speculative_tokens": 2}', "--seed", "3",
    ]  # fmt: skip
    assert "--speculative-config" not in ServerConfig("/m").serve_args()


def test_the_argument_check_script_ships_with_the_package() -> None:
    """The script that `validate` runs in the vLLM environment is package data, read through importlib.resources,
    and without vLLM it fails as one ServerError (not a traceback of ours)."""
    from runinfra_opt.engine.vllm.validate import _check_script, check_serve_args_many

    script = _check_script()
    compile(script, "check_serve_args.py", "exec")
    assert "make_arg_parser" in script
    with pytest.raises(ServerError, match="cannot check vLLM arguments"):
        check_serve_args_many(sys.executable, [["--model", "/m"]], build_config=False, timeout_s=60)


def test_redact() -> None:
    assert redact(["a", "--api-key", "s3cret", "x=s3cret"], "s3cret") == ["a", "--api-key", REDACTED, f"x={REDACTED}"]


def test_normal_exit_leaves_nothing_and_keeps_the_key_out(fake_vllm: str, tmp_path: Path) -> None:
    with make(fake_vllm, tmp_path) as server:
        assert server.process is not None
        pgid = server.process.pid
        assert server.base_url.startswith("http://127.0.0.1:")
        assert len(group_members(pgid)) == 2  # the API server and its engine-core child
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().decode()
        assert server.api_key not in cmdline
        assert "--speculative-config" in cmdline
        assert httpx.get(server.base_url + "/health", trust_env=False).status_code == 200
        assert metrics.scrape(server.base_url).generation_tokens == 7.0
        key = server.api_key
    assert wait_gone(pgid, 1.0)
    log = server.log_path.read_text()
    assert "api key set: True" in log
    assert key not in log
    assert f"VLLM_API_KEY={REDACTED}" in log
    assert server.startup_s is not None


def test_exception_and_ctrl_c_stop_the_server(fake_vllm: str, tmp_path: Path) -> None:
    def fail_inside(server: VllmServer, exc_type: type[BaseException]) -> None:
        with server:
            raise exc_type("boom")

    for exc_type in (RuntimeError, KeyboardInterrupt):
        server = make(fake_vllm, tmp_path)
        with pytest.raises(exc_type):
            fail_inside(server, exc_type)
        pgid, child = logged_pids(server.log_path)
        assert wait_gone(pgid, 1.0), exc_type
        assert not pid_alive(child)


def test_death_at_startup_is_one_error_with_the_log(
    fake_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODE", "die")
    server = make(fake_vllm, tmp_path)
    with pytest.raises(ServerError, match=r"exited during start-up \(exit code 1\)") as info, server:
        pass
    assert "torchvision::nms" in str(info.value)
    assert str(server.log_path) in str(info.value)
    # the orphaned engine-core child was stopped with the group
    pgid, child = logged_pids(server.log_path)
    assert not pid_alive(child)
    assert wait_gone(pgid, 1.0)


def test_hang_at_startup_times_out(fake_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the control: a whole life of a server that starts (launch, healthy, stopped), timed here and now
    start = time.monotonic()
    with make(fake_vllm, tmp_path / "ok"):
        pass
    lifecycle_s = time.monotonic() - start
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    server = make(fake_vllm, tmp_path, startup_timeout_s=2.0)
    start = time.monotonic()
    with pytest.raises(ServerError, match="not healthy after 2 s"), server:
        pass
    # it gave up at its start-up timeout: the same launch and stop around a 2-s wait, not longer
    assert 2.0 <= time.monotonic() - start < 2.0 + 2 * lifecycle_s
    pgid, child = logged_pids(server.log_path)
    assert not pid_alive(child)
    assert wait_gone(pgid, 1.0)


def test_sigterm_ignored_means_sigkill_after_grace(
    fake_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_MODE", "stubborn")
    with make(fake_vllm, tmp_path, grace_s=1.0) as server:
        assert server.process is not None
        pgid = server.process.pid
    assert wait_gone(pgid, 1.0)


def test_servers_stopped_together_share_one_grace_period(
    fake_vllm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline kept beside a candidate, both ignoring SIGTERM: stopped together they take one grace period, not
    two (one after another, a cancelled run took 5.6 s to exit, past its 5 s promise)."""
    from runinfra_opt.engine.vllm.server import stop_servers

    monkeypatch.setenv("FAKE_VLLM_MODE", "stubborn")
    # the control: one such server stopped alone takes one grace period (3 s), timed here and now
    alone = make(fake_vllm, tmp_path / "alone", grace_s=3.0).__enter__()
    start = time.monotonic()
    stop_servers([alone])
    alone_s = time.monotonic() - start
    first = make(fake_vllm, tmp_path / "a", grace_s=3.0).__enter__()
    second = make(fake_vllm, tmp_path / "b", grace_s=3.0).__enter__()
    groups = [s.process.pid for s in (first, second) if s.process is not None]
    start = time.monotonic()
    stop_servers([first, second])
    took = time.monotonic() - start
    assert len(groups) == 2
    assert all(wait_gone(pgid, 1.0) for pgid in groups)
    # two together take one grace period like the one alone; one after another would take twice as long
    assert 3.0 <= took < 1.5 * alone_s, f"together {took:.2f} s, alone {alone_s:.2f} s"


def test_killed_server_is_reported_and_requests_fail_as_data(fake_vllm: str, tmp_path: Path) -> None:
    with make(fake_vllm, tmp_path) as server:
        assert server.process is not None
        pgid = server.process.pid
        os.killpg(pgid, signal.SIGKILL)
        assert wait_gone(pgid)
        results, _ = replay(server.base_url, server.api_key, server.model_name, [CompletionRequest("a", 4, prompt="x")])
        assert not results[0].success
        assert results[0].error
        with pytest.raises(ServerError, match="vLLM server died"):
            server.check_alive()
    assert not server.alive()


def test_port_in_use_is_an_error(fake_vllm: str, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = make(fake_vllm, tmp_path, port=port)
        with pytest.raises(ServerError, match="exited during start-up"), server:
            pass
        assert "Address already in use" in server.log_tail()


DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from runinfra_opt.engine.vllm.args import ServerConfig
    from runinfra_opt.engine.vllm.server import VllmServer
    with VllmServer(sys.executable, ServerConfig("m"), Path(sys.argv[1])) as server:
        print(server.process.pid, flush=True)
        time.sleep(120)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_signals_to_the_driver_stop_the_server(fake_vllm: str, tmp_path: Path, sig: int) -> None:
    env = {**os.environ, "PYTHONPATH": f"{FAKE_VLLM}{os.pathsep}{REPO}"}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert driver.stdout is not None
    pgid = int(driver.stdout.readline())
    assert group_members(pgid)
    driver.send_signal(sig)
    _, stderr = driver.communicate(timeout=120)  # 30 s once ran out on a loaded 2-core machine (SIGKILL)
    assert driver.returncode != 0, stderr
    if sig == signal.SIGTERM:  # unwound like Ctrl-C (the `with` stopped the server), not killed outright
        assert "runinfra_opt.signals.Terminated: signal 15" in stderr, stderr
    assert wait_gone(pgid), f"server group {pgid} still alive after {signal.Signals(sig).name} to the driver"


def test_kv_cache_space(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert make("python", tmp_path).environment()["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert make("python", tmp_path, kvcache_gib=6).environment()["VLLM_CPU_KVCACHE_SPACE"] == "6"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")  # the user's own setting wins over the default
    assert make("python", tmp_path).environment()["VLLM_CPU_KVCACHE_SPACE"] == "4"
    env = make("python", tmp_path).environment()
    assert env["HF_HUB_OFFLINE"] == "1"
    assert len(env["VLLM_API_KEY"]) >= 32
