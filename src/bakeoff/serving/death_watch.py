"""Is the server under test still alive? The verdict that ends a run when it is not.

A server that dies mid-run shows up to the client as cut streams (requests in flight)
followed by ``connect`` failures (every request after): sending the rest of the plan to a
closed port only adds hundreds of meaningless failures. :class:`DeathWatch` watches the
run's records and the server itself and ends the run at once when the server is gone,
with the evidence (:class:`ServerDeath`) that goes into ``summary.json`` as
``server_died``.

How "gone" is decided depends on what is known about the server:

- a process bakeoff started: the process has exited (``waitid`` without reaping it, so
  the launcher still collects it), checked every ``poll_s`` and after every cut stream or
  failed connect, with its exit code;
- a container: the runtime says it no longer runs;
- anything else (``bakeoff bench``, an external URL): after a cut stream or a failed
  connect, its port refuses connections; or ``CONNECT_FAILURES`` connects in a row fail
  with no answer in between (a host that vanished does not even refuse).

Nothing here sends load; :mod:`bakeoff.campaign.runner` runs :meth:`DeathWatch.guard` beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from bakeoff.results.records import RequestRecord
from bakeoff.serving.containers import container_running
from bakeoff.serving.handle import ServerHandle
from bakeoff.serving.process import log_tail

# Consecutive failed connects (no answer in between) that end a run on their own.
CONNECT_FAILURES = 5
# A dying process closes its sockets before it shows as exited: how long to look again.
EXIT_SETTLE_S = 3.0
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class ServerState:
    """One look at the server: ``alive`` None when it cannot be told."""

    alive: bool | None
    how: str = ""  # "process exited", "container stopped", "port closed"
    exit_code: int | None = None


Probe = Callable[[], ServerState]


def process_probe(pid: int) -> Probe:
    """The state of a process this one started; its exit code while it is still unreaped."""

    def look() -> ServerState:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None  # not our child: ask the process table
        except OSError:
            return ServerState(None)
        else:
            if info is None:
                return ServerState(True)
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            return ServerState(False, "process exited", code)
        try:
            gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        return ServerState(False, "process exited") if gone else ServerState(True)

    return look


def container_probe(runtime: str, container: str) -> Probe:
    def look() -> ServerState:
        return ServerState(True) if container_running(runtime, container) else ServerState(False, "container stopped")

    return look


def port_probe(base_url: str, timeout_s: float = 1.0) -> Probe:
    """Refused connections mean nothing listens any more; a timeout tells nothing."""
    url = urlsplit(base_url)
    host = url.hostname or "127.0.0.1"
    port = url.port or (443 if url.scheme == "https" else 80)

    def look() -> ServerState:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return ServerState(True)
        except ConnectionRefusedError:
            return ServerState(False, "port closed")
        except OSError:
            return ServerState(None)

    return look


@dataclass
class ServerDeath:
    """The evidence that ends a run: how the server was found dead and what the client saw."""

    how: str
    detected_after_s: float
    exit_code: int | None
    stream_cuts: int
    connect_failures: int
    requests_finished: int
    log_tail: str = ""

    def message(self, base_url: str) -> str:
        code = f", exit code {self.exit_code}" if self.exit_code is not None else ""
        return (
            f"the server at {base_url} died mid-run ({self.how}{code}) after {self.detected_after_s:.1f} s: "
            f"{self.stream_cuts} streams cut, {self.connect_failures} connects refused; "
            f"{self.requests_finished} requests had finished and are saved, the rest of the plan was not sent"
        )


@dataclass
class DeathWatch:
    """Counts what the records show and decides, with ``probe``, when the server is dead.

    ``poll``: also look at the server every ``poll_s`` (a process or container probe),
    not only after a failure; ``inline``: the probe is a system call, cheap enough to ask
    on the loop the moment a request fails, so not one more request goes to a dead port;
    ``log_path``: the server log quoted in the verdict.
    """

    probe: Probe
    poll: bool = False
    inline: bool = False
    log_path: Path | None = None
    poll_s: float = 0.5
    stream_cuts: int = 0
    connect_failures: int = 0
    finished: int = 0
    verdict: ServerDeath | None = None
    _in_a_row: int = 0
    _started: float = field(default_factory=time.monotonic)
    _suspect: asyncio.Event | None = None
    _load: asyncio.Task[Any] | None = None
    _last_failed: bool = False

    def observe(self, record: RequestRecord) -> None:
        """The record sink's hook: count, and wake the guard on a failure that may mean death."""
        self._last_failed = not record.ok
        if record.ok:
            self.finished += 1
            self._in_a_row = 0
            return
        if record.error_kind == "stream_cut":
            self.stream_cuts += 1
        elif record.error_kind == "connect":
            self.connect_failures += 1
            self._in_a_row += 1
        else:
            return
        if self.inline and self._load is not None and self.verdict is None:
            state = self.probe()
            if self._dead(state):
                self.verdict = self._judge(state)
                self._load.cancel()
                return
        if self._suspect is not None:
            self._suspect.set()

    async def guard(self, load: asyncio.Task[Any]) -> None:
        """Run beside the load; cancel it when the server is found dead (then ``verdict`` is set)."""
        self._suspect = asyncio.Event()
        self._load = load
        while not load.done() and self.verdict is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s if self.poll else None):
                    await self._suspect.wait()
            self._suspect.clear()
            state = await asyncio.to_thread(self.probe)
            if self._dead(state):
                self.verdict = self._judge(state)
                load.cancel()
                return

    async def conclude(self) -> None:
        """After a load that ran to its end: did it end in failures because the server had died?

        Failed connects take microseconds, so the rest of a small plan can be gone before the
        guard's probe answers, or before the dying process shows as exited; when the run
        ended on a failure, this looks again (a process or container: for a few seconds).
        """
        if self.verdict is not None or not self._last_failed:
            return
        deadline = time.monotonic() + (EXIT_SETTLE_S if self.poll else 0.0)
        while True:
            state = await asyncio.to_thread(self.probe)
            if self._dead(state):
                self.verdict = self._judge(state)
                return
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    def _dead(self, state: ServerState) -> bool:
        return state.alive is False or (state.alive is None and self._in_a_row >= CONNECT_FAILURES)

    def _judge(self, state: ServerState) -> ServerDeath:
        tail = log_tail(self.log_path, LOG_TAIL_LINES) if self.log_path is not None else ""
        return ServerDeath(
            how=state.how or f"{self._in_a_row} connects in a row failed",
            detected_after_s=round(time.monotonic() - self._started, 3),
            exit_code=state.exit_code,
            stream_cuts=self.stream_cuts,
            connect_failures=self.connect_failures,
            requests_finished=self.finished,
            log_tail=tail,
        )


def watch_for(handle: ServerHandle) -> DeathWatch:
    """The closest watch over a server bakeoff launched, its log quoted in the verdict."""
    if handle.pid is not None:  # a local process group (a process server, a rehearsal's stand-in)
        return DeathWatch(process_probe(handle.pid), poll=True, inline=True, log_path=handle.log_path)
    runtime = handle.placement.runtime
    if handle.container_id and runtime is not None:
        return DeathWatch(container_probe(runtime, handle.container_id), poll=True, log_path=handle.log_path)
    return url_watch(handle.base_url, handle.log_path)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def url_watch(base_url: str, log_path: Path | None = None) -> DeathWatch:
    """A watch by port probes: asked inline on loopback, where a refused connect is one system call."""
    inline = (urlsplit(base_url).hostname or "") in LOOPBACK
    return DeathWatch(port_probe(base_url), inline=inline, log_path=log_path)
