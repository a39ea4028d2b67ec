"""Agent task figures from a run's records: task completion, critical path, reuse and TTFT by depth.

Every call's record names its task, call and dependencies (:mod:`bakeoff.measure.task_load`),
so these are recomputed from ``records.parquet`` alone, plus the plan for what was designed:

- task completion time: the task's first call sent -> its last answer, over tasks whose every
  planned call answered (a task with a failed call is counted as failed, never timed);
- the critical path (:class:`bakeoff.results.summary.CriticalPath`): from the last answer
  back, each call's prefill and decode, and the wait between the dependency that answered
  last and the call (tool latency, think time);
- per depth: prompt and cached tokens (the server's ``usage``), their hit rate, and the
  designed reuse of those calls beside what the server's cache blocks could realise;
- TTFT by role (planner, worker, join) and by branch index (a call's place among its
  planner's children, :func:`bakeoff.workloads.agentic.branch_indices`; trunk calls left out);
- tasks per minute over the run (first call -> last answer), and within ``task_slo_s``;
- the server's preemptions and prefix-cache evictions over the run, where its counters expose them.
"""

from __future__ import annotations

from collections import defaultdict

from bakeoff.results.formulas import stats, ttft_ms
from bakeoff.results.records import RequestRecord
from bakeoff.results.summary import AgentTasks, CriticalPath, DepthReuse, Stat
from bakeoff.workloads.agentic import TRUNK, branch_indices, designed_calls
from bakeoff.workloads.kinds import Agentic
from bakeoff.workloads.plans import RunPlan

NS_PER_S = 1e9


def critical_path(calls: dict[int, RequestRecord]) -> tuple[float, float, float, int]:
    """(prefill, decode, wait) seconds and the number of calls on one completed task's critical path."""
    node = max(calls, key=lambda n: calls[n].end_ns)
    prefill = decode = wait = 0.0
    count = 0
    while True:
        record = calls[node]
        count += 1
        first = record.first_token_ns or record.end_ns
        prefill += (first - record.start_ns) / NS_PER_S
        decode += (record.end_ns - first) / NS_PER_S
        if not record.depends_on:
            return prefill, decode, wait, count
        node = max(record.depends_on, key=lambda n: calls[n].end_ns)
        wait += (record.start_ns - calls[node].end_ns) / NS_PER_S


def task_block(
    plan: RunPlan,
    records: list[RequestRecord],
    granularity: int | None = None,
    *,
    preemptions: float | None = None,
    evicted_tokens: float | None = None,
) -> AgentTasks | None:
    """The run's task figures; None for a plan that is not agent tasks.

    ``preemptions``: the server's preemption counter over the run, where it has one: requests
    whose KV blocks were taken back, the eviction a tree that no longer fits suffers.
    ``evicted_tokens``: the server's count of tokens its prefix cache evicted over the run
    (SGLang's ``sglang:evicted_tokens_total``; vLLM counts none): a branch whose shared context
    was evicted prefills it again.
    """
    if not plan.tasks:  # only agent task plans carry task trees
        return None
    measured = [r for r in records if not r.warmup and r.task >= 0]
    by_task: dict[int, dict[int, RequestRecord]] = defaultdict(dict)
    for r in measured:
        by_task[r.task][r.node] = r
    planned = {t.task_id: len(t.calls) for t in plan.tasks}
    done = {
        task: calls
        for task, calls in by_task.items()
        if len(calls) == planned.get(task) and all(r.ok for r in calls.values())
    }
    durations = [
        (max(r.end_ns for r in calls.values()) - min(r.start_ns for r in calls.values())) / NS_PER_S
        for calls in done.values()
    ]
    paths = [critical_path(calls) for calls in done.values()]
    path = None
    if paths:
        n = len(paths)
        path = CriticalPath(
            prefill_s=sum(p[0] for p in paths) / n,
            decode_s=sum(p[1] for p in paths) / n,
            wait_s=sum(p[2] for p in paths) / n,
            calls=sum(p[3] for p in paths) / n,
        )
    window = (max(r.end_ns for r in measured) - min(r.start_ns for r in measured)) / NS_PER_S if measured else 0.0
    per_min = 60.0 / window if window > 0 else 0.0
    slo = plan.workload.task_slo_s if isinstance(plan.workload, Agentic) else None  # only agents have one
    within = sum(d <= slo for d in durations) if slo is not None else None
    return AgentTasks(
        tasks=len(done),
        failed_tasks=len(plan.tasks) - len(done),
        calls=len(measured),
        task_s=stats(durations),
        critical_path=path,
        window_s=window,
        tasks_per_min=len(done) * per_min,
        task_slo_s=slo,
        within_slo=within,
        task_goodput_per_min=None if within is None else within * per_min,
        by_depth=_by_depth(plan, measured, granularity),
        preemptions=preemptions,
        evicted_tokens=evicted_tokens,
        ttft_ms_by_role={
            role: stats(v for r in measured if r.ok and r.role == role if (v := ttft_ms(r)) is not None)
            for role in sorted({r.role for r in measured})
        },
        ttft_ms_by_branch=_by_branch(plan, measured),
    )


def _by_branch(plan: RunPlan, measured: list[RequestRecord]) -> dict[int, Stat]:
    """TTFT of the calls at each branch index; the trunk (root planner and join) is on no branch."""
    branch = {(t.task_id, n): b for t in plan.tasks for n, b in enumerate(branch_indices(t))}
    ttfts: dict[int, list[float]] = defaultdict(list)
    for r in measured:
        index = branch.get((r.task, r.node), TRUNK)
        if r.ok and index != TRUNK and (v := ttft_ms(r)) is not None:
            ttfts[index].append(v)
    return {index: stats(values) for index, values in sorted(ttfts.items())}


def _by_depth(plan: RunPlan, measured: list[RequestRecord], granularity: int | None) -> dict[int, DepthReuse]:
    """Tokens, cached tokens and designed reuse of each depth's calls."""
    block = granularity or 1
    designed: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for row in designed_calls(plan.tasks):
        designed[row.depth].append((row.prompt, row.reused))
    out = {}
    for depth, rows in sorted(designed.items()):
        ok = [r for r in measured if r.ok and r.turn == depth]
        reporting = [r for r in ok if r.cached_tokens is not None]
        prompt = sum(r.prompt_tokens for r in reporting)
        cached = sum(r.cached_tokens or 0 for r in reporting) if reporting else None
        total = sum(p for p, _ in rows)
        out[depth] = DepthReuse(
            calls=len(ok),
            prompt_tokens=sum(r.prompt_tokens for r in ok),
            cached_tokens=cached,
            hit_rate=cached / prompt if cached is not None and prompt else None,
            designed_reuse=sum(u for _, u in rows) / total if total else None,
            reusable=sum(u // block * block for _, u in rows) / total if total else None,
            ttft_ms=stats(v for r in ok if (v := ttft_ms(r)) is not None),
        )
    return out
