"""Agent task trees: a planner turn, sub-agents on branches of its context, their answers joined.

One task is a tree of chat calls built from a few parameters (:class:`bakeoff.workloads.kinds.Agentic`):

- the **root planner** sees the shared system prompt (tool schemas included) and the task;
- each planner has ``fanout`` children, each on a branch of the planner's context: the
  planner's context, its real reply as an assistant message, then the branch's own user turn
  (a sub-task and a tool result of a drawn length, sent after a drawn tool latency). A child
  above ``depth`` is a planner again; at ``depth`` it is a **worker**;
- once every child's answer is in, the planner's **join** call extends the planner's context
  with its reply and the children's real answers (a worker's reply, a sub-planner's join
  reply), after a drawn think time. The join's reply is the planner's answer.

The plan fixes everything but the replies: texts, lengths, waits and the tree shape, drawn
from the seed, so every server gets the same tree token for token. A call's messages are
made at send time by :func:`call_messages` from the replies its dependencies really got
(the live dependency); the load driver (:mod:`bakeoff.measure.task_load`) and any check
of the records use this one function. :func:`designed_rows` says, per call, how many prompt
tokens repeat a prefix an earlier call already sent, from the planned token counts.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Literal, Protocol

import orjson

from bakeoff.workloads.lengths import LengthDist, sample_length

Role = Literal["planner", "worker", "join"]
ROLES: tuple[Role, ...] = ("planner", "worker", "join")
# Tokens of the fixed line that opens a join's user turn, before the children's answers.
JOIN_HEADER_TOKENS = 8


@dataclass
class CallNode:
    """One call of a task tree; ``node`` indexes the task's ``calls`` (a node follows what it waits for)."""

    node: int
    role: Role
    depth: int
    parent: int  # the call whose context (and reply) this one extends; -1 for the root
    waits_for: list[int]  # calls whose replies must be in before this one is sent
    user_text: str  # the user turn this call appends (task, sub-task + tool result, join header)
    user_tokens: int
    output_len: int
    delay_s: float  # tool latency (children) or think time (joins) after the last dependency


@dataclass
class TaskPlan:
    """One agent task: its tree of calls and, in open loop, when it arrives."""

    task_id: int
    system_prompt: str
    system_tokens: int
    calls: list[CallNode]
    arrival_s: float = 0.0

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> TaskPlan:
        values = dict(raw)
        calls = [CallNode(**c) for c in values.pop("calls")]  # type: ignore[attr-defined]
        return cls(calls=calls, **values)  # type: ignore[arg-type]


class TextSource(Protocol):
    """Token-exact text (:class:`bakeoff.workloads.prompts.PromptFactory`, or a shape-only stand-in)."""

    def text(self, tokens: int, rng: random.Random) -> str: ...


class TreeShape(Protocol):
    """What a tree takes from its workload (:class:`bakeoff.workloads.kinds.Agentic`)."""

    @property
    def fanout(self) -> int: ...
    @property
    def depth(self) -> int: ...
    @property
    def task_len(self) -> int: ...
    @property
    def subtask_len(self) -> int: ...
    @property
    def tool_result_len(self) -> LengthDist: ...
    @property
    def planner_output_len(self) -> int: ...
    @property
    def worker_output_len(self) -> int: ...
    @property
    def join_output_len(self) -> int: ...

    def tool_latency(self, rng: random.Random) -> float: ...
    def think_time(self, rng: random.Random) -> float: ...


@dataclass
class _Builder:
    shape: TreeShape
    prompts: TextSource
    rng: random.Random
    calls: list[CallNode] = field(default_factory=list)

    def add(self, node: CallNode) -> CallNode:
        node.node = len(self.calls)
        self.calls.append(node)
        return node

    def planner(self, depth: int, parent: int, user_tokens: int, delay_s: float) -> int:
        """A planner, its subtree and its join; returns the call that answers for it (its join)."""
        text = self.prompts.text(user_tokens, self.rng)
        waits = [parent] if parent >= 0 else []
        shape = self.shape
        plan = self.add(
            CallNode(0, "planner", depth, parent, waits, text, user_tokens, shape.planner_output_len, delay_s)
        )
        answers = [self.child(depth + 1, plan.node) for _ in range(shape.fanout)]
        header = self.prompts.text(JOIN_HEADER_TOKENS, self.rng)
        join_delay = shape.think_time(self.rng)
        join = CallNode(
            0, "join", depth, plan.node, answers, header, JOIN_HEADER_TOKENS, shape.join_output_len, join_delay
        )
        return self.add(join).node

    def child(self, depth: int, parent: int) -> int:
        shape = self.shape
        tokens = shape.subtask_len + sample_length(shape.tool_result_len, self.rng)
        delay = shape.tool_latency(self.rng)
        if depth < shape.depth:
            return self.planner(depth, parent, tokens, delay)
        text = self.prompts.text(tokens, self.rng)
        return self.add(
            CallNode(0, "worker", depth, parent, [parent], text, tokens, shape.worker_output_len, delay)
        ).node


def build_task(
    shape: TreeShape, prompts: TextSource, rng: random.Random, task_id: int, system: str, system_tokens: int
) -> TaskPlan:
    """One task tree, drawn from ``rng``: the same draws give the same tree, text and waits."""
    builder = _Builder(shape, prompts, rng)
    builder.planner(0, -1, shape.task_len, 0.0)
    return TaskPlan(task_id, system, system_tokens, builder.calls)


def answer_of(task: TaskPlan, node: int) -> int:
    """The call whose reply answers for ``node``: a planner's join, else the call itself."""
    call = task.calls[node]
    if call.role != "planner":
        return node
    return next(c.node for c in task.calls if c.role == "join" and c.parent == node)


def call_messages(task: TaskPlan, node: int, replies: dict[int, str]) -> list[dict[str, str]]:
    """The exact messages of call ``node``, given the real replies of the calls before it.

    A call's context is its parent's context, the parent's reply as the assistant's turn,
    then its own user turn; a join's user turn carries its children's answers after its
    header. ``replies`` maps node -> reply text; a missing dependency is a KeyError.
    """
    call = task.calls[node]
    if call.parent < 0:
        messages = [{"role": "system", "content": task.system_prompt}]
    else:
        messages = call_messages(task, call.parent, replies)
        messages.append({"role": "assistant", "content": replies[call.parent]})
    content = call.user_text
    if call.role == "join":
        content = "\n\n".join([content, *(replies[n] for n in call.waits_for)])
    messages.append({"role": "user", "content": content})
    return messages


def messages_digest(messages: list[dict[str, str]]) -> str:
    """A short fingerprint of what was sent: records keep it, so a check can rebuild and compare."""
    return hashlib.sha256(orjson.dumps(messages)).hexdigest()[:16]


def planned_prompt_tokens(task: TaskPlan) -> list[int]:
    """Each call's prompt tokens as planned: message bodies and full-length replies, no template tokens."""
    prompt: list[int] = []
    for call in task.calls:
        base = task.system_tokens if call.parent < 0 else prompt[call.parent] + task.calls[call.parent].output_len
        own = call.user_tokens
        if call.role == "join":
            own += sum(task.calls[n].output_len for n in call.waits_for)
        prompt.append(base + own)
    return prompt


@dataclass(frozen=True)
class DesignedCall:
    """One call's planned prompt tokens and how many of them repeat a prefix sent before it."""

    task: int
    node: int
    depth: int
    prompt: int
    reused: int


def designed_calls(tasks: list[TaskPlan]) -> list[DesignedCall]:
    """Every call's designed reuse, by construction of the trees, tasks in arrival order.

    A root planner repeats the shared system prompt (every task but the first); any other call
    repeats its parent's prompt and reply, which the parent sent and got before it.
    """
    rows = []
    for index, task in enumerate(sorted(tasks, key=lambda t: (t.arrival_s, t.task_id))):
        prompt = planned_prompt_tokens(task)
        for call in task.calls:
            if call.parent < 0:
                reused = task.system_tokens if index > 0 else 0
            else:
                reused = prompt[call.parent] + task.calls[call.parent].output_len
            rows.append(DesignedCall(task.task_id, call.node, call.depth, prompt[call.node], reused))
    return rows


def designed_rows(tasks: list[TaskPlan]) -> list[tuple[int, int]]:
    """(prompt tokens, tokens repeating an earlier prefix) per call: :func:`designed_calls` as pairs."""
    return [(row.prompt, row.reused) for row in designed_calls(tasks)]


TRUNK = -1  # the branch index of the root planner and its join: on no branch


def branch_indices(task: TaskPlan) -> list[int]:
    """Each call's branch index: its place among its planner's children (0: the first drawn).

    A child (a worker, or a sub-planner) is its planner's ``k``-th branch; a join answers for
    its planner, so it takes the planner's index; the root planner and its join are on the
    trunk (:data:`TRUNK`). All of a planner's branches are sent once its reply is in, after
    their own tool latencies, so a later index is not a later send, only another branch of
    the same context.
    """
    out: list[int] = []
    seen: dict[int, int] = {}  # planner node -> children placed so far
    for call in task.calls:
        if call.parent < 0:
            out.append(TRUNK)
        elif call.role == "join":
            out.append(out[call.parent])
        else:
            out.append(seen.get(call.parent, 0))
            seen[call.parent] = out[-1] + 1
    return out


def tree_facts(task: TaskPlan) -> dict[str, int]:
    """Shape of one tree: calls per role, its depth, and the longest chain of calls."""
    chain: list[int] = []
    for call in task.calls:
        chain.append(1 + max((chain[n] for n in call.waits_for), default=0))
    facts: dict[str, int] = {role: sum(c.role == role for c in task.calls) for role in ROLES}
    return {"calls": len(task.calls), "depth": max(c.depth for c in task.calls), "critical_calls": max(chain), **facts}
