"""The load loops that send a list of planned requests: closed loop, open loop, conversations.

Each takes a :class:`StreamingClient` and hands every finished :class:`RequestRecord` to
``on_record``; which loop a plan runs, and with which arguments, is its load mode's choice
(:mod:`bakeoff.measure.load_modes`). Agent task trees have their own loop
(:mod:`bakeoff.measure.task_load`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from bakeoff.measure.client import StreamingClient
from bakeoff.measure.window import WindowTracker
from bakeoff.results.records import RequestRecord
from bakeoff.workloads.plans import PlannedRequest, SessionPlan

RecordSink = Callable[[RequestRecord], None]


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
