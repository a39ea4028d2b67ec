"""The agentic part of the comparison report: task time, its critical path, and reuse by depth.

An agent team waits for whole tasks, so the section opens with task completion time (P50,
P90, P99 with n and, across repeats, a 95% interval), tasks per minute and, where the
workload sets ``task_slo_s``, task goodput (what the verdict ranks agentic runs by,
:mod:`bakeoff.analysis.task_verdict`). The critical path says where a task's time went:
prefill (queueing included), decode, or the tool and think waits no server can shorten, each
with its interval across repeats. By tree depth: calls, TTFT, the server's hit rate (with its
interval) beside the reuse the tree designed and the share the server's cache blocks could
realise; a deep call that designed 90% reuse and hit 0% is a cache that did not hold the tree.
The server's preemptions and prefix-cache evictions, where it counts them. TTFT by role and by
branch index (a call's place among its planner's children). Every figure comes from the runs'
``summary.json`` (:class:`bakeoff.results.summary.AgentTasks`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

import pandas as pd

from bakeoff.analysis.confidence import Estimate, estimate
from bakeoff.results.layout import load_cells
from bakeoff.results.summary import RunSummary, Stat

NOTE = (
    "Task time: a task's first call sent to its last answer, over tasks whose every call answered (n per "
    "repeat; across repeats a 95% interval). The critical path splits it: prefill (queueing on the server "
    "included), decode, and the tool and think waits no server can shorten. By depth: the reuse the tree "
    "designed, the share the server's cache blocks could realise, and the hit rate from each call's usage. "
    "Preemptions and evicted tokens are the server's own counters over the run, summed over repeats ('-': "
    "not exposed; of these servers only SGLang counts the tokens its prefix cache evicts)."
)


# CriticalPath fields and their labels, in the order a task spends them.
PATH_PARTS = (("prefill_s", "prefill"), ("decode_s", "decode"), ("wait_s", "tool/think wait"))


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


def _total(values: Iterable[float | None]) -> float | None:
    """The sum over repeats of a server counter; None where no repeat's server exposed it."""
    seen = [v for v in values if v is not None]
    return sum(seen) if seen else None


def task_table(campaign_dir: Path) -> pd.DataFrame:
    """Per server and agentic run: tasks, task time percentiles, throughput in tasks, the critical path."""
    rows = []
    for ar in agent_runs(campaign_dir):
        blocks = [s.agent_tasks for s in ar.repeats if s.agent_tasks is not None]
        means = _path_means(ar)
        total = sum(means.values()) if means else None
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
            # Under pressure, where the server counts them (preemptions: vLLM, SGLang; evictions: SGLang).
            "preemptions": _total(b.preemptions for b in blocks),
            "evicted tokens": _total(b.evicted_tokens for b in blocks),
        }
        for part, label in PATH_PARTS:
            # The mean over repeats with its interval and n (the metric table's critical_* rows).
            row[f"critical {label} s"] = _figure(ar.repeats, f"critical_{part}", 3)
            row[f"critical {label} share"] = means[part] / total if means and total else None
        rows.append(row)
    return pd.DataFrame(rows).round(3)


def _path_means(ar: AgentRun) -> dict[str, float] | None:
    """Mean seconds per task in each critical-path part over the run's repeats; None: no task completed."""
    paths = [s.agent_tasks.critical_path for s in ar.repeats if s.agent_tasks and s.agent_tasks.critical_path]
    return {part: fmean(getattr(p, part) for p in paths) for part, _ in PATH_PARTS} if paths else None


def _interval(values: list[float], samples: int | None) -> str:
    """A figure's mean over repeats with its Student-t interval and n, as the task figures show theirs."""
    return Estimate.over(values, samples).text(3) if values else "-"


def depth_table(campaign_dir: Path) -> pd.DataFrame:
    """Per server, agentic run and tree depth: calls, TTFT, hit rate beside designed and reusable reuse."""
    rows = []
    for ar in agent_runs(campaign_dir):
        depths = sorted({d for s in ar.repeats if s.agent_tasks for d in s.agent_tasks.by_depth})
        for depth in depths:
            found = [
                s.agent_tasks.by_depth[depth] for s in ar.repeats if s.agent_tasks and depth in s.agent_tasks.by_depth
            ]
            reporting = [b for b in found if b.hit_rate is not None]
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
                    # n: repeats x the fewest calls of this depth in one repeat.
                    "hit rate (usage)": _interval(
                        [b.hit_rate for b in reporting if b.hit_rate is not None],
                        min((b.calls for b in reporting), default=None),
                    ),
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

    runs = agent_runs(campaign_dir)
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.5 * max(len(runs), 1)))
    if not runs:
        plt.close(fig)
        return fig
    labels = [f"{ar.server} / {ar.run}" for ar in runs]
    means = [_path_means(ar) for ar in runs]
    left = [0.0] * len(runs)
    for part, label in PATH_PARTS:
        values = [m[part] if m else 0.0 for m in means]
        ax.barh(labels, values, left=left, label=label)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("seconds per task on the critical path (mean)")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    plt.close(fig)  # shown once, by the notebook's display()
    return fig
