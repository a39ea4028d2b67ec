"""Drive agent task trees: each call waits for the real replies it depends on, then sends.

A task (:class:`bakeoff.workloads.agentic.TaskPlan`) starts every call of its tree at once
as a coroutine; each waits until the calls it depends on have answered, sleeps its planned
tool latency or think time, builds its messages from those replies
(:func:`bakeoff.workloads.agentic.call_messages`: the live dependency) and sends them. A
call whose dependency failed is not sent: the agent could not have made it. Closed loop
keeps ``concurrency`` tasks in flight; open loop starts each task at its arrival time
(from ``start_ns``, shared by every client process). Each record names its task, call,
role and the calls it depended on, and fingerprints the messages as sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bakeoff.measure.client import StreamingClient
from bakeoff.results.records import RequestRecord
from bakeoff.workloads.agentic import TaskPlan, call_messages, messages_digest
from bakeoff.workloads.plans import PlannedRequest

RecordSink = Callable[[RequestRecord], None]
# Request ids: task x this + node, unique for trees of up to this many calls.
TASK_ID_STRIDE = 100_000


async def run_task(client: StreamingClient, task: TaskPlan, temperature: float, on_record: RecordSink) -> None:
    """Every call of one task, each sent once its dependencies answered (and its wait passed)."""
    replies: dict[int, str] = {}
    answered = {call.node: asyncio.Event() for call in task.calls}

    async def call(node: int) -> None:
        plan = task.calls[node]
        try:
            for dep in plan.waits_for:
                await answered[dep].wait()
            if any(dep not in replies for dep in plan.waits_for):
                return  # a dependency failed: this call never happens
            if plan.delay_s:
                await asyncio.sleep(plan.delay_s)
            messages = call_messages(task, node, replies)
            item = PlannedRequest(
                request_id=task.task_id * TASK_ID_STRIDE + node,
                endpoint="chat",
                max_tokens=plan.output_len,
                messages=messages,
                group=f"task{task.task_id}",
                turn=plan.depth,
                temperature=temperature,
            )
            record = RequestRecord(item.request_id, group=item.group, turn=plan.depth)
            record.task, record.node, record.role = task.task_id, node, plan.role
            record.depends_on = list(plan.waits_for)
            record.sent_digest = messages_digest(messages)
            done = await client.send(item, record)
            on_record(done)
            if done.ok:
                replies[node] = done.output_text
        finally:
            answered[node].set()  # answered or not: whoever waits must not wait forever

    await asyncio.gather(*(call(c.node) for c in task.calls))


async def task_loop(
    client: StreamingClient,
    tasks: list[TaskPlan],
    concurrency: int | None,
    temperature: float,
    on_record: RecordSink,
    *,
    open_loop: bool = False,
    start_ns: int | None = None,
) -> None:
    """Run ``tasks``: closed loop with ``concurrency`` in flight, or open loop at their arrival times."""
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    start_ns = time.perf_counter_ns() if start_ns is None else start_ns

    async def one(task: TaskPlan) -> None:
        if open_loop:
            while (wait_ns := start_ns + int(task.arrival_s * 1e9) - time.perf_counter_ns()) > 0:
                await asyncio.sleep(wait_ns / 1e9)
        if limit is None:
            await run_task(client, task, temperature, on_record)
            return
        async with limit:
            await run_task(client, task, temperature, on_record)

    await asyncio.gather(*(one(t) for t in sorted(tasks, key=lambda t: (t.arrival_s, t.task_id))))
