"""Load past one client process: how many a run needs, and driving its plan from several.

One event loop in one process reads every chunk of every stream. At a few hundred
streams of fast decode the chunks arrive faster than one process can stamp them, and its
own queueing shows up as latency the server never caused. :class:`Spreader` (the
:class:`bakeoff.measure.loadgen.Spread` of a run) decides after the warm-up:

- ``processes`` fixed by the campaign (``client_processes: N``), or
- ``auto``: the warm-up's chunk demand (chunks per second per stream in flight, times the
  plan's concurrency, or its arrival rate times chunks per request) times the CPU this
  process spent per chunk during the warm-up, divided by :data:`BUSY_TARGET`. A process
  kept under half busy keeps its event loop's wakeup delay well below a millisecond.

Several processes are started with ``spawn`` (a clean interpreter: no inherited event
loop, no forked threads) and each runs the ordinary load generator on its share: the
closed loop takes the next request from one shared counter (exactly ``concurrency`` in
flight across all of them), the open loop splits the schedule round-robin, sessions are
dealt out whole. All of them start from one epoch. Records carry ``perf_counter_ns``
values; on Linux that clock is ``CLOCK_MONOTONIC``, one system-wide clock, so values from
different processes of one host compare directly. Each process still reports its
``perf_counter_ns - monotonic_ns`` offset and records are shifted by the difference to
this process's offset, which is zero where both name the same clock and keeps the merge
right where they do not. Every record is handed to the run's sink as it arrives, so the
journal holds what finished even if a worker dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event, Lock
from typing import Any

from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.measure.load_modes import Share, load_mode
from bakeoff.measure.loops import RecordSink, Steady
from bakeoff.results.records import RequestRecord
from bakeoff.results.summary import ClientLoad
from bakeoff.workloads.plans import RunPlan

# Share of one core a client process may use before another is added.
BUSY_TARGET = 0.5
# Below this many warm-up chunks the CPU-per-chunk figure is noise: fall back to this one
# (benchmarks/loadgen_overhead.py: about 15-25 us per chunk on a 2-core x86 host, uvloop).
MIN_WARMUP_CHUNKS = 200
DEFAULT_CPU_S_PER_CHUNK = 25e-6
READY_TIMEOUT_S = 60.0
# The shared epoch lies this far ahead of the moment every worker said it was ready.
EPOCH_LEAD_NS = 200_000_000
_TIME_FIELDS = ("scheduled_ns", "start_ns", "headers_ns", "first_event_ns", "first_token_ns", "end_ns")


def clock_offset_ns() -> int:
    """``perf_counter_ns - monotonic_ns`` now: 0 where both are CLOCK_MONOTONIC (Linux)."""
    return time.perf_counter_ns() - time.monotonic_ns()


def shift(record: RequestRecord, delta_ns: int) -> RequestRecord:
    """Move a record's timestamps onto another process's ``perf_counter`` (unset ones stay 0)."""
    if delta_ns:
        for name in _TIME_FIELDS:
            value = getattr(record, name)
            if value:
                setattr(record, name, value + delta_ns)
        record.chunk_ns = [t + delta_ns for t in record.chunk_ns]
    return record


@dataclass
class Estimate:
    """What the warm-up showed about the load this plan puts on a client process."""

    chunks_per_s: float | None  # chunk demand of the measured part
    cpu_s_per_chunk: float  # this process's CPU per chunk in the warm-up (or the default)
    warmup_cpu_util: float | None  # busy share of this process during the warm-up

    def processes(self, limit: int) -> int:
        if self.chunks_per_s is None:
            return 1
        return max(1, min(limit, math.ceil(self.chunks_per_s * self.cpu_s_per_chunk / BUSY_TARGET)))

    def as_dict(self) -> dict[str, float | None]:
        return {
            "chunks_per_s": self.chunks_per_s,
            "cpu_us_per_chunk": self.cpu_s_per_chunk * 1e6,
            "warmup_cpu_util": self.warmup_cpu_util,
        }


def estimate(plan: RunPlan, warmup: list[RequestRecord], cpu_s: float, wall_s: float) -> Estimate:
    """Chunk demand of ``plan`` from its warm-up records and what they cost this process.

    A warm-up that already saturated this process under-reports the demand (the streams
    were read late); ``warmup_cpu_util`` near 1 says so, and the summary keeps it.
    """
    done = [r for r in warmup if r.ok and r.chunk_ns and r.end_ns > r.start_ns]
    chunks = sum(len(r.chunk_ns) for r in done)
    per_chunk = cpu_s / chunks if chunks >= MIN_WARMUP_CHUNKS else DEFAULT_CPU_S_PER_CHUNK
    util = cpu_s / wall_s if wall_s > 0 else None
    if not done:
        return Estimate(None, per_chunk, util)
    stream_rate = chunks / sum((r.end_ns - r.start_ns) / 1e9 for r in done)  # per request in flight
    demand = load_mode(plan.mode).demand(plan, done, stream_rate)
    return Estimate(demand, per_chunk, util)


def split(plan: RunPlan, n: int, steady: Steady | None = None) -> list[Share]:
    """Deal the measured part of ``plan`` out to ``n`` workers; in-flight limits split evenly.

    A closed loop's ``steady`` ramp is interleaved: worker i's slots start i/concurrency of
    the ramp after the matching slots of worker 0, so the N starts stay evenly spread.
    """
    conc = plan.concurrency or 1
    caps = [conc // n + (1 if i < conc % n else 0) for i in range(n)]
    return load_mode(plan.mode).split(plan, caps, steady)


async def _work(
    settings: ClientSettings, share: Share, epoch_ns: int, claim: tuple[Any, Lock], sink: RecordSink
) -> None:
    async with StreamingClient(settings) as client:
        await asyncio.sleep(max(epoch_ns - time.perf_counter_ns(), 0) / 1e9)
        await load_mode(share.mode).drive_share(client, share, sink, epoch_ns, claim)


def _worker(
    index: int,
    settings: ClientSettings,
    share: Share,
    out: Any,
    go: Event,
    epoch: Any,
    claim: tuple[Any, Lock],
) -> None:
    """A spawned client process: report ready, wait for the epoch, send, report every record."""
    offset = clock_offset_ns()
    out.put(("ready", index, offset))
    if not go.wait(READY_TIMEOUT_S):
        return
    epoch_ns = epoch.value + offset  # the epoch travels as a monotonic_ns value
    cpu0 = time.process_time()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(_work(settings, share, epoch_ns, claim, lambda r: out.put(("record", index, r))))
    # Busy share over the measured part only: the wait for the epoch is not load.
    wall_s = (time.perf_counter_ns() - epoch_ns) / 1e9
    out.put(("done", index, (time.process_time() - cpu0) / max(wall_s, 1e-9)))


async def drive_processes(
    settings: ClientSettings, plan: RunPlan, n: int, sink: RecordSink, steady: Steady | None = None
) -> list[float]:
    """Run the measured part of ``plan`` over ``n`` spawned processes; return each one's CPU share.

    Cancelling (Ctrl-C, a dead server) terminates the workers; records already received stay.
    """
    shares = split(plan, n, steady)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    epoch = ctx.Value("q", 0)
    claim = (ctx.Value("q", 0), ctx.Lock())
    workers = [
        ctx.Process(target=_worker, args=(i, settings, share, out, go, epoch, claim), daemon=True)
        for i, share in enumerate(shares)
    ]
    here = clock_offset_ns()
    offsets: dict[int, int] = {}
    util: dict[int, float] = {}
    try:
        for proc in workers:
            proc.start()
        while len(offsets) < n:
            kind, index, value = await _next(out, workers, READY_TIMEOUT_S)
            offsets[index] = value
        epoch.value = time.monotonic_ns() + EPOCH_LEAD_NS
        go.set()
        while len(util) < n:
            kind, index, value = await _next(out, workers, None)
            if kind == "record":
                if value.slot >= 0:
                    value.slot += shares[index].slot_base
                sink(shift(value, here - offsets[index]))
            elif kind == "done":
                util[index] = value
    finally:
        for proc in workers:
            if proc.is_alive():
                proc.terminate()
        for proc in workers:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        out.close()
    return [util[i] for i in range(n)]


async def _next(out: Any, workers: list[Any], timeout_s: float | None) -> tuple[str, int, Any]:
    """The next message from the workers; raises if they all died or ``timeout_s`` passed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(queue.Empty):
            message: tuple[str, int, Any] = out.get_nowait()
            return message
        if not any(p.is_alive() for p in workers) and out.empty():
            codes = [p.exitcode for p in workers]
            raise RuntimeError(f"client processes ended without finishing their share (exit codes {codes})")
        if deadline is not None and time.monotonic() > deadline:
            raise RuntimeError(f"client processes not ready within {timeout_s:g} s")
        await asyncio.sleep(0.002)


class Spreader:
    """The :class:`bakeoff.measure.loadgen.Spread` of one run; :attr:`result` says what drove it.

    ``processes``: a fixed count, or None to decide from the warm-up.
    """

    def __init__(self, processes: int | None = None, max_processes: int | None = None) -> None:
        self.fixed = processes
        self.limit = max_processes or max((os.cpu_count() or 2) - 1, 1)
        self.result: ClientLoad | None = None
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._warmup = (0.0, 0.0)

    def warmed_up(self) -> None:
        """The warm-up's CPU and wall time (since construction): the estimate's evidence."""
        self._warmup = (time.process_time() - self._cpu0, time.perf_counter() - self._wall0)

    async def measured(
        self,
        client: StreamingClient,
        plan: RunPlan,
        warmup: list[RequestRecord],
        sink: RecordSink,
        local: Callable[[], Awaitable[None]],
        steady: Steady | None = None,
    ) -> None:
        guess = estimate(plan, warmup, *self._warmup)
        n = self.fixed or guess.processes(self.limit)
        decided: Any = "fixed" if self.fixed else "auto"
        if n == 1:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await local()
            utils = [(time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9)]
        else:
            utils = await drive_processes(client.settings, plan, n, sink, steady)
        self.result = ClientLoad(
            processes=n,
            decided_by=decided,
            cpu_util=[round(u, 4) for u in utils],
            headroom=round(1 - max(utils), 4),
            estimate=guess.as_dict(),
        )
