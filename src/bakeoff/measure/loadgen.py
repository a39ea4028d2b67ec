"""Load generators: closed loop (fixed concurrency), open loop (arrival schedule), sessions.

Agent task trees (mode ``tasks``) are driven by :mod:`bakeoff.measure.task_load`.

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
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from tqdm import tqdm

from bakeoff.measure.client import StreamingClient
from bakeoff.measure.task_load import task_loop
from bakeoff.measure.window import WindowTracker
from bakeoff.results.records import RequestRecord
from bakeoff.workloads.plans import PlannedRequest, RunPlan, SessionPlan

RecordSink = Callable[[RequestRecord], None]
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
    with _progress(_count(plan), plan.name, show_progress) as bar:

        def tick(record: RequestRecord) -> None:
            keep(record)
            bar.update(1)

        async def here() -> None:
            if plan.mode == "closed":
                await closed_loop(
                    client, plan.requests, plan.concurrency or 1, tick, duration_s=plan.duration_s, steady=steady
                )
            elif plan.mode == "open":
                await open_loop(client, plan.requests, tick, max_concurrency=plan.concurrency)
            elif plan.mode == "tasks":
                await task_loop(
                    client, plan.tasks, plan.concurrency, plan.workload.temperature, tick, open_loop=bool(plan.rate)
                )
            else:
                await sessions(client, plan.sessions, plan.concurrency or 1, plan.workload.temperature, tick)

        if spread is None:
            await here()
        else:
            await spread.measured(client, plan, list(records), tick, here, steady)
    return records


@dataclass(frozen=True)
class Steady:
    """A measured closed loop: stagger the first starts over ``ramp_s``, stop once the window has enough.

    ``ramp_from_first``: no warm-up timed a request, so slot 0's first request does, and the
    other slots start after it, spread over its lifetime (``ramp_s`` is then unused).
    """

    ramp_s: float
    min_requests: int = 0
    min_duration_s: float = 0.0
    ramp_from_first: bool = False


def ramp_from_warmup(records: list[RequestRecord]) -> float | None:
    """One request's lifetime (median E2E of the successful warm-up requests); None without one.

    Spreading N starts over one lifetime spaces their completions evenly too, and in a
    closed loop each replacement keeps its slot's phase, so the level holds no waves.
    """
    lifetimes = [(r.end_ns - r.start_ns) / 1e9 for r in records if r.warmup and r.ok]
    return statistics.median(lifetimes) if lifetimes else None


def _count(plan: RunPlan) -> int:
    if plan.mode == "tasks":
        return sum(len(t.calls) for t in plan.tasks)
    if plan.mode == "sessions":
        return sum(len(s.user_turns) for s in plan.sessions)
    return len(plan.requests)


async def closed_loop(
    client: StreamingClient,
    requests: list[PlannedRequest],
    concurrency: int,
    on_record: RecordSink,
    *,
    duration_s: float | None = None,
    warmup: bool = False,
    steady: Steady | None = None,
) -> None:
    """Keep exactly ``concurrency`` requests in flight until the list or the time runs out.

    With ``steady`` (a measured level) worker k first starts k/N of the ramp in, every
    record carries its worker's ``slot``, and no new request starts once the steady-state
    window holds ``steady.min_requests`` requests and lasts ``steady.min_duration_s``.
    """
    queue = iter(requests)
    deadline = None if duration_s is None else time.monotonic() + duration_s
    workers = min(concurrency, len(requests)) or 1
    tracker = WindowTracker(workers, steady.min_requests, steady.min_duration_s) if steady else None
    stop = False
    timed = asyncio.get_running_loop().create_future()  # the ramp, once known

    async def worker(slot: int) -> None:
        try:
            await work(slot)
        finally:
            if slot == 0 and not timed.done():  # it sent nothing: nobody waits for a lifetime that never comes
                timed.set_result(0.0)

    async def work(slot: int) -> None:
        nonlocal stop
        if steady is not None and slot:
            ramp = await timed if steady.ramp_from_first else steady.ramp_s
            await asyncio.sleep(ramp * slot / workers)
        for item in queue:  # one shared iterator: each request is taken by exactly one worker
            if stop or (deadline is not None and time.monotonic() >= deadline):
                return
            record = RequestRecord(item.request_id, warmup=warmup, group=item.group, turn=item.turn)
            if tracker is None:
                on_record(await client.send(item, record))
                continue
            record.slot = slot
            tracker.started(slot, time.perf_counter_ns())  # a hair before the client stamps start_ns
            done = await client.send(item, record)
            if not timed.done():  # slot 0's first request: its lifetime times the ramp when no warm-up did
                timed.set_result((done.end_ns - done.start_ns) / 1e9)
            tracker.finished(done)
            on_record(done)
            # Only a duration minimum plans a reserve to stop early from; a count alone sends the whole list.
            stop = stop or (steady is not None and steady.min_duration_s > 0 and tracker.enough(time.perf_counter_ns()))

    await asyncio.gather(*(worker(slot) for slot in range(workers)))


async def open_loop(
    client: StreamingClient,
    requests: list[PlannedRequest],
    on_record: RecordSink,
    *,
    max_concurrency: int | None = None,
    start_ns: int | None = None,
) -> None:
    """Send each request at its planned arrival time, whether or not earlier ones finished.

    ``start_ns``: the schedule's epoch (a ``perf_counter_ns`` value, possibly ahead), shared
    by every process that sends part of one schedule; default: now.
    """
    # What exists now (the plan's prompts, often megabytes of text) is kept out of later
    # collections: a full collection over it pauses the loop for tens of ms, and every
    # request due meanwhile goes out that late.
    gc.freeze()
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start_ns = time.perf_counter_ns() if start_ns is None else start_ns
    tasks = []

    async def one(item: PlannedRequest) -> None:
        record = RequestRecord(item.request_id, group=item.group, turn=item.turn)
        record.scheduled_ns = start_ns + int(item.arrival_s * 1e9)
        if limit is None:
            on_record(await client.send(item, record))
            return
        async with limit:
            on_record(await client.send(item, record))

    for item in sorted(requests, key=lambda r: r.arrival_s):
        due_ns = start_ns + int(item.arrival_s * 1e9)
        # uvloop's timers round to the millisecond and its clock is cached per iteration, so
        # one sleep may wake up to a millisecond early: sleep again until the clock says due.
        while (wait_ns := due_ns - time.perf_counter_ns()) > 0:
            await asyncio.sleep(wait_ns / 1e9)
        tasks.append(asyncio.create_task(one(item)))
    await asyncio.gather(*tasks)
    gc.unfreeze()  # collectable again once the schedule is over


async def sessions(
    client: StreamingClient,
    plans: list[SessionPlan],
    concurrency: int,
    temperature: float,
    on_record: RecordSink,
) -> None:
    """Run conversations, at most ``concurrency`` at once; each turn carries the real history."""
    limit = asyncio.Semaphore(concurrency)

    async def conversation(plan: SessionPlan) -> None:
        async with limit:
            messages = [{"role": "system", "content": plan.system_prompt}]
            for turn, user_text in enumerate(plan.user_turns):
                messages.append({"role": "user", "content": user_text})
                item = PlannedRequest(
                    request_id=plan.session_id * 1000 + turn,
                    endpoint="chat",
                    max_tokens=plan.output_len,
                    messages=list(messages),
                    group=f"s{plan.session_id}",
                    turn=turn,
                    temperature=temperature,
                )
                record = await client.send(item, RequestRecord(item.request_id, group=item.group, turn=turn))
                on_record(record)
                if not record.ok:
                    return  # the conversation cannot go on without its reply
                messages.append({"role": "assistant", "content": record.output_text})
                if plan.think_time_s:
                    await asyncio.sleep(plan.think_time_s)

    await asyncio.gather(*(conversation(p) for p in plans))
