"""Task trees read from hash blocks: which call of a Mooncake-style trace continues which.

Mooncake's traces (the FAST'25 release: conversation, tool-agent and synthetic) carry no
session or parent field: a row is ``timestamp`` (ms), ``input_length``, ``output_length``
and ``hash_ids``, one id per 512-token block of the prompt, each id naming its whole prefix
(equal ids: equal tokens up to that block's end). The tree is in the ids. A call that
continues another's context (the next turn of a conversation, the tool-result turn of an
agent, a sub-agent branching from its planner, the planner's join) resends that context, so
its ids start with the other call's. Here row ``r`` is a child of an earlier row ``p`` when

1. ``r``'s ids hold every *full* block of ``p``'s prompt (``p``'s last, partial block changes
   once its reply is appended, so its id is not expected to repeat);
2. the shared prefix goes beyond what ``p`` itself shared with the traffic before it: a
   prefix common to everything (Mooncake's block 0, a shared system prompt) makes no edge;
3. ``r`` arrives after ``p`` and its prompt is at least ``p``'s prompt and reply: it resends the
   reply, so it cannot have been sent with ``p`` (parallel branches of one context, sent at
   once, are siblings, not parent and child).

Of the rows that qualify, the parent is the one sharing the longest prefix (the latest on a
tie); a row with none starts a task. Rows are taken in arrival order, so a parent is always
sent before its child. Walking the ids through a trie keeps this linear in the blocks read.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bakeoff.workloads.traces.otel import spread_line
from bakeoff.workloads.traces.rows import TraceRow


@dataclass(frozen=True)
class TreeCall:
    """A row placed in its task tree (indices are positions in the rows given)."""

    parent: int | None
    task: int  # index of the task's first row
    depth: int  # 0: the task's first call


def call_tree(rows: Sequence[TraceRow], block_size: int) -> list[TreeCall]:
    """Each row's parent, task and depth; ``rows`` in arrival order."""
    children: dict[tuple[int, int], int] = {}
    ending: dict[int, list[int]] = defaultdict(list)  # trie node -> rows whose full blocks end there
    out: list[TreeCall] = []
    for index, row in enumerate(rows):
        node, known, best = 0, 0, None
        for depth, block in enumerate(row.blocks, start=1):
            child = children.get((node, block))
            if child is None:
                break
            node, known = child, depth
            for candidate in reversed(ending.get(node, ())):
                p = rows[candidate]
                if row.at_s > p.at_s and row.prompt_tokens >= p.prompt_tokens + p.output_tokens:
                    best = candidate  # deeper nodes come later: the longest shared prefix wins
                    break
        node = 0
        full = min(row.prompt_tokens // block_size, len(row.blocks))
        for depth, block in enumerate(row.blocks, start=1):
            node = children.setdefault((node, block), len(children) + 1)
            if depth == full and known < full:
                ending[node].append(index)  # only a row that sent a new block can be a parent
        if best is None:
            out.append(TreeCall(None, index, 0))
        else:
            out.append(TreeCall(best, out[best].task, out[best].depth + 1))
    return out


def task_sessions(rows: Sequence[TraceRow], block_size: int) -> list[str]:
    """A session name per row, ``task-L`` after the line of the task's first row ("" without ids)."""
    calls = call_tree(rows, block_size)
    return [f"task-{rows[c.task].line}" if row.blocks else "" for row, c in zip(rows, calls, strict=True)]


def hash_tree_shape(rows: Sequence[TraceRow], block_size: int) -> dict[str, Any]:
    """Tasks, calls per task, depth, fan-out, task span and largest context, as ``inspect`` prints them."""
    calls = call_tree(rows, block_size)
    members: dict[int, list[int]] = defaultdict(list)
    fanout: dict[int, int] = defaultdict(int)
    for index, call in enumerate(calls):
        members[call.task].append(index)
        if call.parent is not None:
            fanout[call.parent] += 1
    per_task = [
        {
            "task_calls": len(ids),
            "depth": max(calls[i].depth for i in ids),
            "fanout": max((fanout[i] for i in ids), default=0),
            "duration_s": rows[ids[-1]].at_s - rows[ids[0]].at_s,
            "context_tokens": max(rows[i].prompt_tokens + rows[i].output_tokens for i in ids),
        }
        for ids in members.values()
    ]

    def spread(key: str) -> dict[str, float]:
        values = [t[key] for t in per_task]
        return {"min": min(values), "p50": statistics.median(values), "max": max(values)}

    return {
        "tasks": len(per_task),
        "calls": len(rows),
        "branching_tasks": sum(t["fanout"] > 1 for t in per_task),
        **{key: spread(key) for key in per_task[0]},
    }


def render_hash_shape(shape: dict[str, Any]) -> list[str]:
    """The tree lines ``bakeoff trace inspect`` prints for a hash-block trace."""
    return [
        f"call trees    {shape['tasks']} tasks ({shape['calls']} calls, {shape['branching_tasks']} branching; "
        "parent: the earlier call whose context a call extends, by hash prefix); per task:",
        spread_line("calls", shape["task_calls"]),
        spread_line("depth", shape["depth"]),
        spread_line("fan-out (children)", shape["fanout"]),
        spread_line("first to last call", shape["duration_s"], " s"),
        spread_line("largest context", shape["context_tokens"], " tokens"),
    ]
