"""How the verdict judges an agentic workload: by tasks, not by requests.

An agent team waits for tasks, and one task is many calls, so request goodput would reward a
server that answers the many short calls fast and the critical path slowly. For a run of
agent task trees (mode ``tasks``) the verdict's load axis is the tasks in flight (closed loop)
or the task rate (open loop), as that load mode says (:class:`bakeoff.measure.load_modes.Tasks`);
its figure is task goodput (tasks within the workload's ``task_slo_s`` per minute), or tasks per
minute where no task SLO is set; and a run meets the SLO when none of its calls failed and its
P90 task completion time lies within ``task_slo_s`` (P90 rather than P99: a run has tens of
tasks, not hundreds). The verdict's SLO line names that task SLO for each agentic workload
(:func:`task_slo_text`), not the request SLO its calls are never judged on.
"""

from __future__ import annotations

from bakeoff.results.summary import RunSummary


def task_metric(summaries: list[RunSummary]) -> str | None:
    """The figure agentic runs are ranked by; None when the runs are not agentic."""
    tasks = [s.agent_tasks for s in summaries if s.agent_tasks is not None]  # only task runs have the block
    if not tasks:
        return None
    return "task_goodput_per_min" if any(t.task_slo_s is not None for t in tasks) else "tasks_per_min"


def task_run_meets(summary: RunSummary) -> bool:
    """No failed call, and the P90 task time within the task SLO where one is set."""
    block = summary.agent_tasks
    if block is None or summary.requests.failed or block.tasks == 0 or block.failed_tasks:
        return False
    if block.task_slo_s is None:
        return True
    p90 = block.task_s.p90
    return p90 is not None and p90 <= block.task_slo_s


def task_slo(summaries: list[RunSummary]) -> float | None:
    """The task SLO agentic runs were judged on (the workload's ``task_slo_s``); None when none is set."""
    blocks = [s.agent_tasks for s in summaries if s.agent_tasks is not None]
    bounds = [b.task_slo_s for b in blocks if b.task_slo_s is not None]
    return max(bounds, default=None)  # one workload sets one bound


def task_slo_text(workload: str, slo_s: float | None) -> str:
    """How one agentic workload was judged, as the verdict's SLO line says it."""
    if slo_s is None:
        return (
            f"{workload}: no task SLO set (task_slo_s), so every call must answer and servers rank by tasks per minute"
        )
    return (
        f"{workload}: task SLO P90 task completion ≤ {slo_s:g} s (task_slo_s) and every call answered; "
        "servers rank by task goodput (tasks within it per minute)"
    )
