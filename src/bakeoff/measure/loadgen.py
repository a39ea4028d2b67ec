"""Running one plan: warm-up, the measured part by the plan's load mode, every record journalled.

The load shapes (closed loop, open loop, sessions, agent task trees) are registered modes
(:mod:`bakeoff.measure.load_modes`) driving the loops of :mod:`bakeoff.measure.loops`.

They know nothing about which engine answers: they take a :class:`StreamingClient` and a
:class:`RunPlan` and hand every finished :class:`RequestRecord` to ``on_record`` as it
completes (the run folder's journal), so an interrupted run keeps what it measured.
Warm-up requests run first at the same concurrency and are flagged, never counted;
``on_measure_start`` runs between the two, once warm-up has finished, so whatever the
caller snapshots there (server counters) covers the measured part only.

A measured closed loop staggers its first N starts over a ramp (no lock-step waves: all
prefills together, all finishes together) and stops issuing once its steady-state window
(:mod:`bakeoff.measure.window`) holds the plan's minimum requests and duration. An open loop stamps
each request with its scheduled time, so the wait for a free slot under a concurrency cap
counts in its latency (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from tqdm import tqdm

from bakeoff.measure.client import StreamingClient
from bakeoff.measure.load_modes import load_mode
from bakeoff.measure.loops import RecordSink, Steady, closed_loop, open_loop, sessions
from bakeoff.results.records import RequestRecord
from bakeoff.workloads.plans import RunPlan

# The loops live in bakeoff.measure.loops; callers and tests still import them from here.
__all__ = [
    "LoadResult",
    "RecordSink",
    "Spread",
    "Steady",
    "closed_loop",
    "open_loop",
    "ramp_from_warmup",
    "run_plan",
    "sessions",
]
MeasureStart = Callable[[], None]


class Spread(Protocol):
    """Drives a plan's measured part, in this process (``local``) or spread over several.

    Told when the warm-up ends, then given its records to judge from (:mod:`bakeoff.measure.multiload`).
    """

    def warmed_up(self) -> None: ...

    async def measured(
        self,
        client: StreamingClient,
        plan: RunPlan,
        warmup: list[RequestRecord],
        sink: RecordSink,
        local: Callable[[], Awaitable[None]],
        steady: Steady | None = None,
    ) -> None: ...


@dataclass
class LoadResult:
    records: list[RequestRecord]
    interrupted: bool = False


def _progress(total: int, label: str, show: bool) -> tqdm:
    return tqdm(total=total, desc=label, unit="req", disable=not show, leave=True, mininterval=0.5)


async def run_plan(
    client: StreamingClient,
    plan: RunPlan,
    on_record: RecordSink,
    *,
    show_progress: bool = True,
    on_measure_start: MeasureStart | None = None,
    spread: Spread | None = None,
) -> list[RequestRecord]:
    """Run one plan to completion (warm-up, ``on_measure_start``, measured part); return its records.

    ``spread`` decides who drives the measured part: this process or several (default: this one).
    """
    records: list[RequestRecord] = []

    def keep(record: RequestRecord) -> None:
        records.append(record)
        on_record(record)

    if plan.warmup:
        await closed_loop(client, plan.warmup, plan.concurrency or 1, keep, warmup=True)
    if spread is not None:
        spread.warmed_up()
    timed_ramp = plan.ramp_s if plan.ramp_s is not None else ramp_from_warmup(records)
    steady = Steady(timed_ramp or 0.0, plan.min_requests, plan.min_duration_s, ramp_from_first=timed_ramp is None)
    if on_measure_start is not None:
        # A blocking hook (an HTTP scrape) runs off the loop; nothing is in flight meanwhile.
        await asyncio.to_thread(on_measure_start)
    mode = load_mode(plan.mode)
    with _progress(mode.count(plan), plan.name, show_progress) as bar:

        def tick(record: RequestRecord) -> None:
            keep(record)
            bar.update(1)

        async def here() -> None:
            await mode.drive(client, plan, tick, steady)

        if spread is None:
            await here()
        else:
            await spread.measured(client, plan, list(records), tick, here, steady)
    return records


def ramp_from_warmup(records: list[RequestRecord]) -> float | None:
    """One request's lifetime (median E2E of the successful warm-up requests); None without one.

    Spreading N starts over one lifetime spaces their completions evenly too, and in a
    closed loop each replacement keeps its slot's phase, so the level holds no waves.
    """
    lifetimes = [(r.end_ns - r.start_ns) / 1e9 for r in records if r.warmup and r.ok]
    return statistics.median(lifetimes) if lifetimes else None
