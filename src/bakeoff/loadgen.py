"""Load generators: closed loop (fixed concurrency), open loop (arrival schedule), sessions.

They know nothing about which engine answers: they take a :class:`StreamingClient` and a
:class:`RunPlan` and hand every finished :class:`RequestRecord` to ``on_record`` as it
completes (the run folder's journal), so an interrupted run keeps what it measured.
Warm-up requests run first at the same concurrency and are flagged, never counted;
``on_measure_start`` runs between the two, once warm-up has finished, so whatever the
caller snapshots there (server counters) covers the measured part only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

from bakeoff.client import PlannedRequest, StreamingClient
from bakeoff.records import RequestRecord
from bakeoff.workloads import RunPlan, SessionPlan

RecordSink = Callable[[RequestRecord], None]
MeasureStart = Callable[[], None]


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
) -> list[RequestRecord]:
    """Run one plan to completion (warm-up, ``on_measure_start``, measured part); return its records."""
    records: list[RequestRecord] = []

    def keep(record: RequestRecord) -> None:
        records.append(record)
        on_record(record)

    if plan.warmup:
        await closed_loop(client, plan.warmup, plan.concurrency or 1, keep, warmup=True)
    if on_measure_start is not None:
        # A blocking hook (an HTTP scrape) runs off the loop; nothing is in flight meanwhile.
        await asyncio.to_thread(on_measure_start)
    with _progress(_count(plan), plan.name, show_progress) as bar:

        def tick(record: RequestRecord) -> None:
            keep(record)
            bar.update(1)

        if plan.mode == "closed":
            await closed_loop(client, plan.requests, plan.concurrency or 1, tick, duration_s=plan.duration_s)
        elif plan.mode == "open":
            await open_loop(client, plan.requests, tick, max_concurrency=plan.concurrency)
        else:
            await sessions(client, plan.sessions, plan.concurrency or 1, plan.workload, tick)
    return records


def _count(plan: RunPlan) -> int:
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
) -> None:
    """Keep exactly ``concurrency`` requests in flight until the list or the time runs out."""
    queue = iter(requests)
    deadline = None if duration_s is None else time.monotonic() + duration_s

    async def worker() -> None:
        for item in queue:  # one shared iterator: each request is taken by exactly one worker
            if deadline is not None and time.monotonic() >= deadline:
                return
            record = RequestRecord(item.request_id, warmup=warmup, group=item.group, turn=item.turn)
            on_record(await client.send(item, record))

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)) or 1)))


async def open_loop(
    client: StreamingClient,
    requests: list[PlannedRequest],
    on_record: RecordSink,
    *,
    max_concurrency: int | None = None,
) -> None:
    """Send each request at its planned arrival time, whether or not earlier ones finished."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    loop = asyncio.get_running_loop()
    start = loop.time()
    start_ns = time.perf_counter_ns()
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
        delay = start + item.arrival_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(item)))
    await asyncio.gather(*tasks)


async def sessions(
    client: StreamingClient,
    plans: list[SessionPlan],
    concurrency: int,
    workload: dict[str, object],
    on_record: RecordSink,
) -> None:
    """Run conversations, at most ``concurrency`` at once; each turn carries the real history."""
    limit = asyncio.Semaphore(concurrency)
    temperature = float(workload.get("temperature", 0.0))  # type: ignore[arg-type]

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
