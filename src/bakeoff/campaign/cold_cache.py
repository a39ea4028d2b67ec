"""One campaign cell's server across its runs, restarted when a run needs an empty prefix cache.

Backends with a cache-reset endpoint (vLLM, SGLang) are reset by the runner before every
run. Those whose only way to empty the cache is a restart (``cache_reset: restart``:
TensorRT-LLM, llama.cpp) are restarted here, before a run that needs a cold cache:

- a run that measures prefix reuse (a ``sessions`` or agent ``tasks`` plan), or
- a run that sends a prompt this server has already seen (the SLO search replays one
  rate's requests on new schedules), since the cache could serve it from an earlier run.

Runs of fresh random prompts (each sweep level draws its own) are not restarted for: the
cache holds nothing they could hit, and a GPU server restart costs minutes. Every
restart is timed (stop and start) into the cell's effort, and every run says whether it
started on a fresh server, after a restart, or on a cache left as it was.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.spec import BackendSpec
from bakeoff.measure.load_modes import load_mode
from bakeoff.observe.telemetry import CacheReset
from bakeoff.serving.handle import ServerHandle
from bakeoff.workloads.plans import RunPlan

Starter = Callable[[], AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]]


def prompt_keys(plan: RunPlan) -> set[int]:
    """Fingerprints of every prompt text the plan sends (warm-up included)."""
    texts: list[str] = []
    for item in [*plan.warmup, *plan.requests]:
        if item.prompt is not None:
            texts.append(item.prompt)
        texts.extend(str(m.get("content", "")) for m in item.messages or [])
    for session in plan.sessions:
        texts.append(session.system_prompt)
        texts.extend(session.user_turns)
    return {hash(t) for t in texts if t}


def needs_cold_cache(plan: RunPlan, sent: set[int]) -> bool:
    """Could this run hit what earlier runs left in the cache, or does it measure reuse?"""
    return load_mode(plan.mode).shares_prefixes or not prompt_keys(plan).isdisjoint(sent)


class CellServer:
    """The running server of one cell; :meth:`prepare` restarts it when a run needs that.

    ``restarts`` collects one timing record per restart (the caller's effort record).
    """

    def __init__(self, start: Starter, backend: BackendSpec, restarts: list[dict[str, Any]]) -> None:
        self._start = start
        self._backend = backend
        self._stack = contextlib.ExitStack()
        self._fresh = False
        self._sent: set[int] = set()
        self.restarts = restarts
        self.handle: ServerHandle | None = None
        self.launch: RenderedLaunch | None = None

    def __enter__(self) -> CellServer:
        self._open()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()

    def _open(self) -> None:
        self._stack = contextlib.ExitStack()
        self.handle, self.launch = self._stack.enter_context(self._start())
        self._fresh = True
        self._sent = set()

    def current(self) -> tuple[ServerHandle, RenderedLaunch]:
        assert self.handle is not None and self.launch is not None, "use CellServer as a context manager"
        return self.handle, self.launch

    def prepare(self, plan: RunPlan) -> CacheReset | None:
        """Get the cache ready for ``plan``; None leaves it to the runner (an HTTP reset)."""
        if self._backend.cache_reset.kind != "restart":
            return None
        if self._fresh:
            return CacheReset("restart", True, 0, "fresh server: nothing cached yet")
        if not needs_cold_cache(plan, self._sent):
            return CacheReset(
                "restart", None, 0, "not restarted: this run measures no reuse and repeats no earlier prompt"
            )
        stop_s, start_s = self.restart()
        self.restarts.append({"before_run": plan.name, "stop_s": stop_s, "start_s": start_s})
        return CacheReset("restart", True, 0, f"server restarted before this run ({stop_s + start_s:.1f} s)")

    def restart(self) -> tuple[float, float]:
        """Stop the server and start a fresh one: (seconds to stop, seconds to be ready)."""
        began = time.monotonic()
        self._stack.close()
        stopped = time.monotonic()
        self._open()
        return stopped - began, time.monotonic() - stopped

    def ran(self, plan: RunPlan) -> None:
        """Whatever ``plan`` sent may now be in the cache."""
        self._fresh = False
        self._sent |= prompt_keys(plan)
