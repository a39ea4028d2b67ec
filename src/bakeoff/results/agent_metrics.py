"""The agent task metrics (issue [20]): rows of the metric table judged by tasks, not requests.

Owns :data:`AGENT_METRICS` and the readers only they use; :mod:`bakeoff.results.metric_table`
composes them into :data:`~bakeoff.results.metric_table.METRICS`, so a metric stays one row.
"""

from __future__ import annotations

from collections.abc import Callable

from bakeoff.results.metric_row import Metric, figure
from bakeoff.results.summary import STAT_LABELS, AgentTasks, RunSummary


def _tasks(summary: RunSummary, read: Callable[[AgentTasks], float | None]) -> float | None:
    """A figure of an agentic run's task block (None for other runs)."""
    return read(summary.agent_tasks) if summary.agent_tasks is not None else None


def _path(summary: RunSummary, field: str) -> float | None:
    path = summary.agent_tasks.critical_path if summary.agent_tasks is not None else None
    return None if path is None else float(getattr(path, field))


# Agentic workloads (issue [20]): a task is the unit an agent team waits for, so it is judged by tasks.
AGENT_METRICS: tuple[Metric, ...] = (
    *(
        figure(
            f"task_s_{stat}",
            f"task time {STAT_LABELS[stat]}",
            "s",
            f"agent tasks: {STAT_LABELS[stat]} of task completion time, the task's first call sent → its last "
            "answer, over tasks whose every call answered (nearest rank; n is the task count).",
            "lower",
            lambda s, stat=stat: _tasks(s, lambda t: t.task_s.value(stat)),  # type: ignore[misc]
        )
        for stat in ("p50", "p90", "p99")
    ),
    figure(
        "tasks_per_min",
        "task throughput",
        "tasks/min",
        "agent tasks completed per minute over the run (first call sent → last answer).",
        "higher",
        lambda s: _tasks(s, lambda t: t.tasks_per_min),
    ),
    figure(
        "task_goodput_per_min",
        "task goodput",
        "tasks/min",
        "agent tasks completed within the workload's `task_slo_s` per minute: what an agentic verdict ranks by.",
        "higher",
        lambda s: _tasks(s, lambda t: t.task_goodput_per_min),
    ),
    figure(
        "critical_prefill_s",
        "critical-path prefill",
        "s",
        "agent tasks: mean seconds per task on the critical path between sending a call and its first token "
        "(queueing on the server and prefill).",
        "lower",
        lambda s: _path(s, "prefill_s"),
    ),
    figure(
        "critical_decode_s",
        "critical-path decode",
        "s",
        "agent tasks: mean seconds per task on the critical path between a call's first token and its end.",
        "lower",
        lambda s: _path(s, "decode_s"),
    ),
    figure(
        "critical_wait_s",
        "critical-path waits",
        "s",
        "agent tasks: mean seconds per task on the critical path between a dependency's answer and the next "
        "call (tool latency, think time, client).",
        None,
        lambda s: _path(s, "wait_s"),
    ),
)
