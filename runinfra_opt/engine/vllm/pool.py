"""The vLLM engine's running servers: one per variant at a time, or the baseline's held up beside another while
`keep_baseline` is set (so that a caller can alternate requests between the two). Every launch is recorded
(`launches`: variant, start-up seconds, log file, outcome); a variant whose server failed to start is not
launched again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runinfra_opt.engine.vllm.args import ServerConfig
from runinfra_opt.engine.vllm.client import OpenAIClient
from runinfra_opt.engine.vllm.server import DEFAULT_STARTUP_TIMEOUT_S, VllmServer, stop_servers
from runinfra_opt.errors import EngineError
from runinfra_opt.fsutil import safe_name

SWITCH_SETTLE_S = 1.5
"""Seconds to wait before a request goes to the other of two live servers (`keep_baseline`). After its last step
a vLLM worker keeps polling its shared-memory queue for 1 s (`SpinCondition.busy_loop_s` in vLLM's
`shm_broadcast.py`: `sched_yield` in a loop) on the core the other server's worker computes on, which slows the
other server's next request (`git show e14cd7e:benchmarks/results/vllm_paired_baseline.json`)."""


@dataclass
class Launch:
    """One server start: for which variant, how long it took to become healthy, where its log is."""

    variant: str
    log: str
    startup_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Live:
    """A running server and the client that talks to it."""

    server: VllmServer
    client: OpenAIClient


class ServerPool:
    """At most two running servers: `live` (the variant being timed) and `kept` (the baseline's, while
    `keep_baseline` holds it apart)."""

    def __init__(
        self, python: str, log_dir: Path, loop: asyncio.AbstractEventLoop, startup_timeout_s: float | None = None
    ) -> None:
        self.python = python
        self.log_dir = log_dir
        self.loop = loop
        self.startup_timeout_s = startup_timeout_s
        self.launches: list[Launch] = []
        self.live: Live | None = None
        """The server of the variant being timed (the baseline's too, unless `keep_baseline` holds it apart)."""
        self.kept: Live | None = None
        """The baseline's server, held up beside the others while `keep_baseline` is set."""
        self.keep_baseline = False
        """Keep the baseline's server up while other variants' servers come and go, so that requests can
        alternate between the baseline and a candidate; off: one server at a time."""
        self._used: Live | None = None
        """The server the last request went to (`SWITCH_SETTLE_S`)."""
        self._failed: dict[str, str] = {}

    def get(self, name: str, config: ServerConfig, baseline: ServerConfig) -> Live:
        """The running server for variant `name` (served with `config`; the baseline's is `baseline`): a live one
        with the same arguments, else a new one. A new one replaces the current one, except the baseline's while
        `keep_baseline` holds it: it stays up beside the next."""
        if name in self._failed:
            raise EngineError(self._failed[name])
        for live in (self.live, self.kept):
            if live is not None and live.server.config == config:
                live.server.check_alive()
                if self._used is not None and self._used is not live:
                    time.sleep(SWITCH_SETTLE_S)  # the other server's worker stops spinning first
                self._used = live
                return live
        if self.keep_baseline and self.live is not None and self.live.server.config == baseline:
            self.kept, self.live = self.live, None  # held beside the next server, not stopped
        keep = self.keep_baseline and config == baseline
        if not keep:
            self._stop(self.live)
            self.live = None
        live = self._launch(name, config)
        self._used = live
        if keep:
            self.kept = live
        else:
            self.live = live
        return live

    @contextlib.contextmanager
    def beside(self, name: str, config: ServerConfig) -> Iterator[Live]:
        """A server of its own beside the running ones (neither `live` nor `kept`), stopped on leaving: a measurement
        of another model (a draft's step costs) without stopping the baseline's server. Counted in `launches`."""
        live = self._launch(name, config)
        try:
            yield live
        finally:
            self._stop(live)

    def restart(self, config: ServerConfig) -> None:
        """Stop the running server launched with `config`, if any: the next `get` launches a fresh one."""
        for live in (self.live, self.kept):
            if live is not None and live.server.config == config:
                if live is self.live:
                    self.live = None
                else:
                    self.kept = None
                self._used = None
                self._stop(live)

    def _launch(self, name: str, config: ServerConfig) -> Live:
        server = VllmServer(
            self.python,
            config,
            self.log_dir,
            name=f"{len(self.launches) + 1:02d}-{safe_name(name)}",
            startup_timeout_s=self.startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S,
        )
        launch = Launch(variant=name, log=str(server.log_path))
        self.launches.append(launch)
        try:
            server.__enter__()
        except EngineError as exc:
            launch.error = str(exc).splitlines()[0]
            self._failed[name] = f"{name}: {exc}"
            raise
        launch.startup_s = round(server.startup_s or 0.0, 1)
        client = OpenAIClient(server.base_url, server.api_key, server.model_name)
        self.loop.run_until_complete(client.__aenter__())
        return Live(server, client)

    def _stop(self, live: Live | None) -> None:
        if live is None:
            return
        try:
            self.loop.run_until_complete(live.client.__aexit__(None, None, None))
        finally:
            live.server.__exit__(None, None, None)

    def stop(self) -> None:
        """Stop every running server (a held baseline's too), together: one grace period for both."""
        running = [live for live in (self.live, self.kept) if live is not None]
        self.live, self.kept = None, None
        errors: list[BaseException] = []
        for live in running:
            try:
                self.loop.run_until_complete(live.client.__aexit__(None, None, None))
            except BaseException as exc:  # noqa: BLE001 (the servers are stopped first, then it is raised)
                errors.append(exc)
        stop_servers([live.server for live in running])
        if errors:
            raise errors[0]
