"""Load modes: one object per way of driving a plan, registered by the name a plan carries.

A :class:`RunPlan`'s ``mode`` names its load shape (closed loop, open loop, conversations,
agent task trees). Everything that differs by shape lives on that mode's object, so a new
shape is one class here (plus the workload kind that makes its plans) instead of a branch in
every reader:

- ``drive`` / ``count``: which loop runs the measured part in this process, and how many
  requests it sends (:func:`bakeoff.measure.loadgen.run_plan`);
- ``split`` / ``drive_share`` / ``demand``: how the plan is dealt out to several client
  processes, how each drives its share, and the chunk demand that decides how many
  (:mod:`bakeoff.measure.multiload`);
- ``level_name`` / ``level``: what a plan's level is called and its value, which the sweep
  stops on (:mod:`bakeoff.campaign.cell_run`) and tune picks its load by
  (:mod:`bakeoff.campaign.tune.figures`); the report draws its sweeps along it
  (:mod:`bakeoff.report.sweeps`);
- ``axis`` / ``axis_texts``: the load the verdict groups runs by and how it is written
  (:mod:`bakeoff.analysis.verdict`, :mod:`bakeoff.report.decision`);
- ``shares_prefixes``: the plan reuses prefixes by construction, so each run needs an empty
  cache and the report checks the reuse happened.

Modes register with :func:`register` (the shape of guidellm's profile factory) and are
looked up with :func:`load_mode`.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.synchronize import Lock
from typing import Any, ClassVar, TypeVar

from bakeoff.measure.client import StreamingClient
from bakeoff.measure.loops import RecordSink, Steady, closed_loop, open_loop, sessions
from bakeoff.measure.task_load import task_loop
from bakeoff.results.records import RequestRecord
from bakeoff.workloads.plans import PlannedRequest, RunPlan

Claim = tuple[Any, Lock]  # the closed loop's shared next-request counter and its lock


@dataclass
class Share:
    """One client process's part of a plan."""

    mode: str
    requests: list[PlannedRequest] = field(default_factory=list)
    sessions: list[Any] = field(default_factory=list)
    tasks: list[Any] = field(default_factory=list)  # agent task trees, dealt out whole
    concurrency: int = 1
    max_concurrency: int | None = None
    duration_s: float | None = None
    temperature: float = 0.0  # sessions and tasks: the workload's sampling temperature, the one field a call needs
    steady: Steady | None = None  # closed loop: this worker's part of the ramp and of the window's minimum
    lead_s: float = 0.0  # closed loop: its slots start this far into the ramp, between the others'
    slot_base: int = 0  # its slot numbers in the merged run start here


class Claimed(list[PlannedRequest]):
    """The closed loop's request list where each request goes to whichever process asks first."""

    def __init__(self, items: list[PlannedRequest], counter: Any, lock: Lock) -> None:
        super().__init__(items)
        self._counter = counter
        self._lock = lock

    def __iter__(self) -> Iterator[PlannedRequest]:
        while True:
            with self._lock:
                index = self._counter.value
                if index >= len(self):
                    return
                self._counter.value = index + 1
            yield self[index]


class LoadMode:
    """What differs by load shape; the defaults are those of a plan of requests without a level."""

    name: ClassVar[str]
    level_name: ClassVar[str | None] = None  # what the swept level is called ("concurrency", "rate")
    axis_texts: ClassVar[dict[str, str]] = {}  # each verdict axis of the mode and how a load on it reads
    shares_prefixes: ClassVar[bool] = False

    def level(self, concurrency: float | None, rate: float | None) -> float | None:
        """The plan's (or summary's) swept level, None for a shape without one."""
        return None

    def axis(self, concurrency: float | None, rate: float | None) -> tuple[str, float] | None:
        """(axis, load) the verdict groups the run by; by default its swept level."""
        value = self.level(concurrency, rate)
        return None if value is None or self.level_name is None else (self.level_name, float(value))

    def count(self, plan: RunPlan) -> int:
        """Requests the measured part sends (the progress bar's total)."""
        return len(plan.requests)

    async def drive(self, client: StreamingClient, plan: RunPlan, sink: RecordSink, steady: Steady) -> None:
        """Run the measured part of ``plan`` in this process."""
        raise NotImplementedError

    def split(self, plan: RunPlan, caps: list[int], steady: Steady | None) -> list[Share]:
        """Deal the measured part out to ``len(caps)`` processes; ``caps`` splits the in-flight limit."""
        raise NotImplementedError

    async def drive_share(
        self, client: StreamingClient, share: Share, sink: RecordSink, epoch_ns: int, claim: Claim
    ) -> None:
        """Run one process's share, all shares starting from ``epoch_ns``."""
        raise NotImplementedError

    def demand(self, plan: RunPlan, done: list[RequestRecord], stream_rate: float) -> float:
        """Chunks per second the plan asks of the client, from the warm-up's ``stream_rate`` per stream."""
        return (plan.concurrency or 1) * stream_rate


_MODES: dict[str, LoadMode] = {}
_M = TypeVar("_M", bound=type[LoadMode])


def register(cls: _M) -> _M:
    """Class decorator: make ``cls`` the mode of plans whose ``mode`` is ``cls.name``."""
    if cls.name in _MODES:
        raise ValueError(f"load mode {cls.name!r} registered twice")
    _MODES[cls.name] = cls()
    return cls


def load_mode(name: str | None) -> LoadMode:
    """The registered mode called ``name``; KeyError names the known ones."""
    try:
        return _MODES[name or ""]
    except KeyError:
        raise KeyError(f"no load mode {name!r} (known: {', '.join(sorted(_MODES))})") from None


def load_level(mode: str | None, concurrency: float | None, rate: float | None) -> tuple[str, float] | None:
    """(level name, value) of a plan or summary, None where its mode has no level or the value is unset."""
    known = _MODES.get(mode or "")
    if known is None or known.level_name is None:
        return None
    value = known.level(concurrency, rate)
    return None if value is None else (known.level_name, float(value))


def load_axis(mode: str | None, concurrency: float | None, rate: float | None) -> tuple[str, float] | None:
    """(axis, load) the verdict groups a run by; None for a mode without one (or an unknown mode)."""
    known = _MODES.get(mode or "")
    return None if known is None else known.axis(concurrency, rate)


def load_text(axis: str, load: float) -> str:
    """A load on a verdict axis in words ("concurrency 8", "2 req/s", "4 tasks in flight")."""
    for mode in _MODES.values():
        if axis in mode.axis_texts:
            return mode.axis_texts[axis].format(load)
    raise KeyError(f"no load mode has the axis {axis!r}")


def swept_modes() -> list[tuple[str, str]]:
    """(mode, level name) of every mode with a swept level, in registration order (closed loop first)."""
    return [(name, mode.level_name) for name, mode in _MODES.items() if mode.level_name is not None]


def prefix_sharing_modes() -> list[str]:
    """The modes whose plans reuse prefixes by construction (conversations, task trees)."""
    return [name for name, mode in _MODES.items() if mode.shares_prefixes]


@register
class ClosedLoop(LoadMode):
    """A fixed number of requests in flight; every process takes the next request from one counter."""

    name = "closed"
    level_name = "concurrency"
    axis_texts: ClassVar[dict[str, str]] = {"concurrency": "concurrency {:g}"}

    def level(self, concurrency: float | None, rate: float | None) -> float | None:
        return concurrency

    async def drive(self, client: StreamingClient, plan: RunPlan, sink: RecordSink, steady: Steady) -> None:
        await closed_loop(client, plan.requests, plan.concurrency or 1, sink, duration_s=plan.duration_s, steady=steady)

    def split(self, plan: RunPlan, caps: list[int], steady: Steady | None) -> list[Share]:
        # Every worker sees the whole list and takes the next index from the shared counter.
        conc, n = plan.concurrency or 1, len(caps)
        parts = []
        for i, cap in enumerate(caps):
            mine = None
            if steady is not None:
                mine = Steady(steady.ramp_s * cap / conc, -(-steady.min_requests // n), steady.min_duration_s)
            lead = steady.ramp_s * i / conc if steady is not None else 0.0
            share = Share(self.name, plan.requests, concurrency=max(cap, 1), duration_s=plan.duration_s, steady=mine)
            share.lead_s, share.slot_base = lead, sum(caps[:i])
            parts.append(share)
        return parts

    async def drive_share(
        self, client: StreamingClient, share: Share, sink: RecordSink, epoch_ns: int, claim: Claim
    ) -> None:
        await asyncio.sleep(share.lead_s)
        requests = Claimed(share.requests, *claim)
        await closed_loop(client, requests, share.concurrency, sink, duration_s=share.duration_s, steady=share.steady)


@register
class OpenLoop(LoadMode):
    """An arrival schedule, optionally under an in-flight cap; the schedule is split round-robin."""

    name = "open"
    level_name = "rate"
    axis_texts: ClassVar[dict[str, str]] = {"rate": "{:g} req/s"}

    def level(self, concurrency: float | None, rate: float | None) -> float | None:
        return rate

    async def drive(self, client: StreamingClient, plan: RunPlan, sink: RecordSink, steady: Steady) -> None:
        await open_loop(client, plan.requests, sink, max_concurrency=plan.concurrency)

    def split(self, plan: RunPlan, caps: list[int], steady: Steady | None) -> list[Share]:
        n = len(caps)
        ordered = sorted(plan.requests, key=lambda r: r.arrival_s)
        limits = [max(c, 1) if plan.concurrency else None for c in caps]
        return [Share(self.name, ordered[i::n], max_concurrency=limits[i]) for i in range(n)]

    async def drive_share(
        self, client: StreamingClient, share: Share, sink: RecordSink, epoch_ns: int, claim: Claim
    ) -> None:
        await open_loop(client, share.requests, sink, max_concurrency=share.max_concurrency, start_ns=epoch_ns)

    def demand(self, plan: RunPlan, done: list[RequestRecord], stream_rate: float) -> float:
        if not plan.rate:
            return super().demand(plan, done, stream_rate)
        per_request = statistics.fmean(len(r.chunk_ns) / max(r.completion_tokens, 1) for r in done)
        mean_tokens = statistics.fmean(p.max_tokens for p in plan.requests) if plan.requests else 0.0
        demand = plan.rate * per_request * mean_tokens
        if plan.concurrency:
            demand = min(demand, plan.concurrency * stream_rate)
        return demand


@register
class Sessions(LoadMode):
    """Multi-turn conversations, each sent turn by turn with its real replies; dealt out whole."""

    name = "sessions"
    shares_prefixes = True

    def count(self, plan: RunPlan) -> int:
        return sum(len(s.user_turns) for s in plan.sessions)

    async def drive(self, client: StreamingClient, plan: RunPlan, sink: RecordSink, steady: Steady) -> None:
        await sessions(client, plan.sessions, plan.concurrency or 1, plan.workload.temperature, sink)

    def split(self, plan: RunPlan, caps: list[int], steady: Steady | None) -> list[Share]:
        n, temperature = len(caps), plan.workload.temperature
        return [
            Share(self.name, sessions=plan.sessions[i::n], concurrency=max(caps[i], 1), temperature=temperature)
            for i in range(n)
        ]

    async def drive_share(
        self, client: StreamingClient, share: Share, sink: RecordSink, epoch_ns: int, claim: Claim
    ) -> None:
        await sessions(client, share.sessions, share.concurrency, share.temperature, sink)


@register
class Tasks(LoadMode):
    """Agent task trees: closed loop keeps tasks in flight, open loop (a rate, no cap) starts them on arrival."""

    name = "tasks"
    shares_prefixes = True
    axis_texts: ClassVar[dict[str, str]] = {"tasks in flight": "{:g} tasks in flight", "task rate": "{:g} tasks/s"}

    def axis(self, concurrency: float | None, rate: float | None) -> tuple[str, float] | None:
        # Not a swept level (the sweep never stops early on task trees), but the verdict's load.
        if rate is not None:
            return "task rate", float(rate)
        return "tasks in flight", float(concurrency or 1)

    def count(self, plan: RunPlan) -> int:
        return sum(len(t.calls) for t in plan.tasks)

    async def drive(self, client: StreamingClient, plan: RunPlan, sink: RecordSink, steady: Steady) -> None:
        await task_loop(
            client, plan.tasks, plan.concurrency, plan.workload.temperature, sink, open_loop=bool(plan.rate)
        )

    def split(self, plan: RunPlan, caps: list[int], steady: Steady | None) -> list[Share]:
        n, temperature = len(caps), plan.workload.temperature
        caps_or_none = [max(c, 1) if plan.concurrency else None for c in caps]
        return [
            Share(self.name, tasks=plan.tasks[i::n], max_concurrency=caps_or_none[i], temperature=temperature)
            for i in range(n)
        ]

    async def drive_share(
        self, client: StreamingClient, share: Share, sink: RecordSink, epoch_ns: int, claim: Claim
    ) -> None:
        cap = share.max_concurrency
        await task_loop(client, share.tasks, cap, share.temperature, sink, open_loop=cap is None, start_ns=epoch_ns)
