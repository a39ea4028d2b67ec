"""The agentic part of the comparison report: task time, its critical path, and reuse by depth.

An agent team waits for whole tasks, so the section opens with task completion time (P50,
P90, P99 with n and, across repeats, a 95% interval), tasks per minute and, where the
workload sets ``task_slo_s``, task goodput (what the verdict ranks agentic runs by,
:mod:`bakeoff.analysis.task_verdict`). The critical path says where a task's time went:
prefill (queueing included), decode, or the tool and think waits no server can shorten.
By tree depth: calls, TTFT, the server's cached tokens and hit rate beside the reuse the
tree designed and the share the server's cache blocks could realise; a deep call that
designed 90% reuse and hit 0% is a cache that did not hold the tree. TTFT by role and by branch
index (a call's place among its planner's children). Every figure comes from
the runs' ``summary.json`` (:class:`bakeoff.results.summary.AgentTasks`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

import pandas as pd

from bakeoff.analysis.confidence import estimate
from bakeoff.results.layout import load_cells
from bakeoff.results.summary import RunSummary, Stat

NOTE = (
    "Task time: a task's first call sent to its last answer, over tasks whose every call answered (n per "
    "repeat; across repeats a 95% interval). The critical path splits it: prefill (queueing on the server "
    "included), decode, and the tool and think waits no server can shorten. By depth: the reuse the tree "
    "designed, the share the server's cache blocks could realise, and the hit rate from each call's usage."
)


@dataclass
class AgentRun:
    """One agentic run of one server across its repeats."""

    server: str
    workload: str
    run: str
    repeats: list[RunSummary]


def agent_runs(campaign_dir: Path) -> list[AgentRun]:
    """Every agentic run of the campaign, its repeats together, rehearsals included (their headings say so)."""
    found: dict[tuple[str, str, str], list[RunSummary]] = defaultdict(list)
    for cell in load_cells(campaign_dir):
        for run, summary in cell.summaries.items():
            if summary.agent_tasks is not None and not summary.interrupted:
                found[(cell.label, cell.workload, run)].append(summary)
    return [AgentRun(*key, reps) for key, reps in sorted(found.items())]


def _figure(repeats: list[RunSummary], metric: str, digits: int = 2) -> str:
    return estimate(repeats, metric).text(digits)


def task_table(campaign_dir: Path) -> pd.DataFrame:
    """Per server and agentic run: tasks, task time percentiles, throughput in tasks, the critical path."""
    rows = []
    for ar in agent_runs(campaign_dir):
        blocks = [s.agent_tasks for s in ar.repeats if s.agent_tasks is not None]
        paths = [b.critical_path for b in blocks if b.critical_path is not None]
        total = fmean(p.prefill_s + p.decode_s + p.wait_s for p in paths) if paths else None
        row: dict[str, Any] = {
            "server": ar.server,
            "workload": ar.workload,
            "run": ar.run,
            "repeats": len(ar.repeats),
            "tasks": sum(b.tasks for b in blocks),
            "failed tasks": sum(b.failed_tasks for b in blocks),
            "task n per repeat": min((b.task_s.n for b in blocks), default=0),
            "task P50 s": _figure(ar.repeats, "task_s_p50"),
            "task P90 s": _figure(ar.repeats, "task_s_p90"),
            "task P99 s": _figure(ar.repeats, "task_s_p99"),
            "tasks/min": _figure(ar.repeats, "tasks_per_min"),
            "task goodput/min": _figure(ar.repeats, "task_goodput_per_min")
            if any(b.task_slo_s is not None for b in blocks)
            else "no task SLO",
            # Evictions under pressure, where the server counts them (vLLM, SGLang); '-': not exposed.
            "preemptions": sum(p for b in blocks if (p := b.preemptions) is not None)
            if any(b.preemptions is not None for b in blocks)
            else None,
        }
        for part, label in (("prefill_s", "prefill"), ("decode_s", "decode"), ("wait_s", "tool/think wait")):
            value = fmean(getattr(p, part) for p in paths) if paths else None
            row[f"critical {label} s"] = value
            row[f"critical {label} share"] = value / total if value is not None and total else None
        rows.append(row)
    return pd.DataFrame(rows).round(3)


def depth_table(campaign_dir: Path) -> pd.DataFrame:
    """Per server, agentic run and tree depth: calls, TTFT, hit rate beside designed and reusable reuse."""
    rows = []
    for ar in agent_runs(campaign_dir):
        depths = sorted({d for s in ar.repeats if s.agent_tasks for d in s.agent_tasks.by_depth})
        for depth in depths:
            found = [
                s.agent_tasks.by_depth[depth] for s in ar.repeats if s.agent_tasks and depth in s.agent_tasks.by_depth
            ]
            hits = [b.hit_rate for b in found if b.hit_rate is not None]
            ttft = [b.ttft_ms.p50 for b in found if b.ttft_ms.p50 is not None]
            rows.append(
                {
                    "server": ar.server,
                    "workload": ar.workload,
                    "run": ar.run,
                    "depth": depth,
                    "calls": sum(b.calls for b in found),
                    "TTFT P50 ms": fmean(ttft) if ttft else None,
                    "designed reuse": found[0].designed_reuse,
                    "reusable at the cache's blocks": found[0].reusable,
                    "hit rate (usage)": fmean(hits) if hits else None,
                }
            )
    return pd.DataFrame(rows).round(3)


def _ttft_table(campaign_dir: Path, by: str, column: str) -> pd.DataFrame:
    """TTFT per server, agentic run and group of calls (``by``: a dict field of AgentTasks)."""
    rows = []
    for ar in agent_runs(campaign_dir):
        blocks = [s.agent_tasks for s in ar.repeats if s.agent_tasks]
        groups: dict[Any, list[Stat]] = defaultdict(list)
        for block in blocks:
            for key, stat in getattr(block, by).items():
                groups[key].append(stat)
        for key, found in sorted(groups.items()):
            p50 = [st.p50 for st in found if st.p50 is not None]
            p90 = [st.p90 for st in found if st.p90 is not None]
            rows.append(
                {
                    "server": ar.server,
                    "workload": ar.workload,
                    "run": ar.run,
                    column: key,
                    "n": sum(st.n for st in found),
                    "TTFT P50 ms": fmean(p50) if p50 else None,
                    "TTFT P90 ms": fmean(p90) if p90 else None,
                }
            )
    return pd.DataFrame(rows).round(2)


def role_table(campaign_dir: Path) -> pd.DataFrame:
    """TTFT by role (planner, sub-agent worker, join): which kind of call waits for its first token."""
    return _ttft_table(campaign_dir, "ttft_ms_by_role", "role")


def branch_table(campaign_dir: Path) -> pd.DataFrame:
    """TTFT by branch index (a call's place among its planner's children, 0 first; trunk calls left out).

    Every branch of a planner extends the same context, so with a prefix cache that holds it the
    branches wait alike; a TTFT that climbs with the index is branches queued behind each other,
    or a context the cache lost between them.
    """
    return _ttft_table(campaign_dir, "ttft_ms_by_branch", "branch")


def critical_path_figure(campaign_dir: Path) -> Any:
    """Stacked bars per server and run: mean seconds per task in prefill, decode and waits."""
    import matplotlib.pyplot as plt  # deferred: only the figure needs the plotting libraries

    table = task_table(campaign_dir)
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.5 * max(len(table), 1)))
    if table.empty:
        plt.close(fig)
        return fig
    labels = [f"{r.server} / {r.run}" for r in table.itertuples()]
    left = pd.Series(0.0, index=table.index)
    for part in ("prefill", "decode", "tool/think wait"):
        values = table[f"critical {part} s"].fillna(0.0)
        ax.barh(labels, values, left=left, label=part)
        left = left + values
    ax.set_xlabel("seconds per task on the critical path (mean)")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    plt.close(fig)  # shown once, by the notebook's display()
    return fig
