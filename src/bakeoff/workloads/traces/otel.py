"""Agent traces exported as OpenTelemetry GenAI spans: their calls, the tree they form, and its reuse.

The format: JSON lines, each an OTLP trace export (``{"resourceSpans": [{"scopeSpans":
[{"spans": [...]}]}]}``), what the OpenTelemetry Collector's file exporter writes. A span
is read by the GenAI semantic conventions: ``gen_ai.operation.name`` says what it is
(``chat`` / ``text_completion`` / ``generate_content``: a model call; ``execute_tool``: a tool;
``invoke_agent``: an agent or sub-agent), ``gen_ai.usage.input_tokens`` and
``gen_ai.usage.output_tokens`` its lengths, ``parentSpanId`` its place in the tree, and one
``traceId`` is one task.

Spans carry lengths, not text, so the prefix a call shares is inferred from the tree, as an
agent framework builds its prompts: a model call extends the context of the model call
before it in the same agent (its prompt and reply), and a sub-agent's first call branches
from the context of the planner call that ran last before the sub-agent started. A call
reuses that context up to its own prompt length. Each call becomes a trace row: its start
(seconds after the file's first span), its lengths, its task as the session, and block ids
of ``block_size`` tokens that encode that sharing (equal ids: equal prefix), so ``bakeoff
trace inspect`` shows the reuse at a cache's block size and ``convert`` writes a replayable
``bakeoff`` trace. :func:`tree_shape` summarizes the trees themselves.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bakeoff.errors import SpecError
from bakeoff.workloads.traces.rows import TraceRow

MODEL_CALLS = frozenset({"chat", "text_completion", "generate_content"})
TOOL = "execute_tool"
AGENT = "invoke_agent"
OTEL_BLOCK_SIZE = 16  # default tokens per block id: vLLM's GPU block size


@dataclass
class Span:
    """One span of an agent trace, the fields the tree needs."""

    trace: str
    span: str
    parent: str
    operation: str
    name: str
    start_s: float
    end_s: float
    input_tokens: int = 0
    output_tokens: int = 0
    line: int = 0


@dataclass
class AgentCall:
    """A model call placed in its task's tree."""

    span: Span
    agent: str  # the invoke_agent span it runs in ("" at the top)
    depth: int  # agents above it, less one (0: the top agent)
    context_parent: int | None = None  # index of the call whose context it extends
    blocks: list[int] = field(default_factory=list)  # ids over prompt + reply


def _attributes(raw: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for item in raw or []:
        value = item.get("value") or {}
        for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
            if kind in value:
                out[str(item.get("key"))] = value[kind]
    return out


def read_spans(path: Path) -> list[Span]:
    """Every span of the file; a line that is not an OTLP export is an error naming it."""
    spans = []
    with path.open("rb") as handle:
        for line, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                doc = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise SpecError(f"{path}: row {line}: not valid JSON ({exc})") from None
            if not isinstance(doc, dict) or "resourceSpans" not in doc:
                raise SpecError(f"{path}: row {line}: resourceSpans: missing (expected one OTLP trace export a line)")
            for resource in doc["resourceSpans"]:
                for scope in resource.get("scopeSpans") or []:
                    for raw_span in scope.get("spans") or []:
                        spans.append(_span(raw_span, line, path))
    if not spans:
        raise SpecError(f"{path}: no spans found")
    return spans


def _span(raw: dict[str, Any], line: int, path: Path) -> Span:
    attrs = _attributes(raw.get("attributes") or [])
    try:
        start, end = int(raw["startTimeUnixNano"]), int(raw["endTimeUnixNano"])
        span = Span(
            trace=str(raw["traceId"]),
            span=str(raw["spanId"]),
            parent=str(raw.get("parentSpanId") or ""),
            operation=str(attrs.get("gen_ai.operation.name", "")),
            name=str(raw.get("name", "")),
            start_s=start / 1e9,
            end_s=end / 1e9,
            input_tokens=int(attrs.get("gen_ai.usage.input_tokens", 0)),
            output_tokens=int(attrs.get("gen_ai.usage.output_tokens", 0)),
            line=line,
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise SpecError(f"{path}: row {line}: span {raw.get('spanId', '?')}: {exc} missing or not a number") from None
    if span.operation in MODEL_CALLS and (span.input_tokens <= 0 or span.output_tokens <= 0):
        raise SpecError(
            f"{path}: row {line}: span {span.span}: gen_ai.usage.input_tokens and output_tokens must be > 0 "
            "on a model call"
        )
    return span


def _agent_of(span: Span, by_id: dict[str, Span]) -> tuple[str, int]:
    """The nearest invoke_agent span above ``span`` and how many agents are above it."""
    agents: list[str] = []
    node = by_id.get(span.parent)
    while node is not None:
        if node.operation == AGENT:
            agents.append(node.span)
        node = by_id.get(node.parent)
    return (agents[0] if agents else ""), max(len(agents) - 1, 0)


def task_calls(spans: list[Span]) -> dict[str, list[AgentCall]]:
    """Each task's model calls in start order, each with the call whose context it extends."""
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace].append(span)
    out = {}
    for trace, members in by_trace.items():
        by_id = {s.span: s for s in members}
        calls = [
            AgentCall(s, *_agent_of(s, by_id))
            for s in sorted(members, key=lambda s: s.start_s)
            if s.operation in MODEL_CALLS
        ]
        for index, call in enumerate(calls):
            earlier = [i for i in range(index) if calls[i].span.end_s <= call.span.start_s]
            same = [i for i in earlier if calls[i].agent == call.agent]
            if same:
                call.context_parent = same[-1]
                continue
            # A sub-agent's first call: the enclosing agent's call that ran last before this agent started.
            agent = by_id.get(call.agent)
            above = _agent_of(agent, by_id)[0] if agent is not None else None
            spawned = [i for i in earlier if above is not None and calls[i].agent == above]
            if agent is not None and spawned:
                call.context_parent = max(spawned, key=lambda i: calls[i].span.end_s)
        out[trace] = calls
    return out


def parse_otel_rows(path: Path, block_size: int) -> tuple[list[TraceRow], int]:
    """(rows, spans in file): one row per model call, block ids encoding the shared contexts."""
    spans = read_spans(path)
    origin = min(s.start_s for s in spans)
    rows = []
    next_id = 0
    for trace, calls in task_calls(spans).items():
        for call in calls:
            s = call.span
            total = -(-(s.input_tokens + s.output_tokens) // block_size)
            shared: list[int] = []
            if call.context_parent is not None:
                parent = calls[call.context_parent]
                reused = min(parent.span.input_tokens + parent.span.output_tokens, s.input_tokens)
                shared = parent.blocks[: reused // block_size]
            fresh = list(range(next_id, next_id + total - len(shared)))
            next_id += len(fresh)
            call.blocks = shared + fresh
            prompt_blocks = -(-s.input_tokens // block_size)
            blocks = tuple(call.blocks[:prompt_blocks])
            rows.append(TraceRow(s.line, s.start_s - origin, s.input_tokens, s.output_tokens, blocks, trace))
    return rows, len(spans)


def tree_shape(path: Path) -> dict[str, Any]:
    """The trees: tasks, model and tool calls per task, depth, fan-out, branches in flight, time scale."""
    spans = read_spans(path)
    calls = task_calls(spans)
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace].append(span)
    per_task = []
    for trace, members in by_trace.items():
        agents = [s for s in members if s.operation == AGENT]
        children: dict[str, int] = defaultdict(int)
        ids = {a.span for a in agents}
        for agent in agents:
            node = next((m for m in members if m.span == agent.parent), None)
            while node is not None and node.span not in ids:
                node = next((m for m in members if m.span == node.parent), None)
            if node is not None:
                children[node.span] += 1
        model = calls[trace]
        events = sorted([(c.span.start_s, 1) for c in model] + [(c.span.end_s, -1) for c in model])
        live = peak = 0
        for _, step in events:
            live += step
            peak = max(peak, live)
        per_task.append(
            {
                "model_calls": len(model),
                "tool_calls": sum(s.operation == TOOL for s in members),
                "depth": max((c.depth for c in model), default=0),
                "fanout": max(children.values(), default=0),
                "parallel_calls": peak,
                "duration_s": max(s.end_s for s in members) - min(s.start_s for s in members),
                "context_tokens": max((c.span.input_tokens + c.span.output_tokens for c in model), default=0),
            }
        )
    tools = [s.end_s - s.start_s for s in spans if s.operation == TOOL]

    def spread(key: str) -> dict[str, float]:
        values = [t[key] for t in per_task]
        return {"min": min(values), "p50": statistics.median(values), "max": max(values)}

    return {
        "tasks": len(per_task),
        "spans": len(spans),
        **{key: spread(key) for key in per_task[0]},
        "tool_latency_s": {"p50": statistics.median(tools), "max": max(tools)} if tools else None,
    }


def spread_line(label: str, spread: dict[str, float], unit: str = "") -> str:
    """One per-task figure of a tree summary: its min, median and max."""
    return f"  {label:22} min {spread['min']:.4g}, p50 {spread['p50']:.4g}, max {spread['max']:.4g}{unit}"


def render_shape(shape: dict[str, Any]) -> list[str]:
    """The tree lines ``bakeoff trace inspect`` prints for an agent trace."""

    def line(label: str, key: str, unit: str = "") -> str:
        return spread_line(label, shape[key], unit)

    lines = [
        f"agent tasks   {shape['tasks']} tasks ({shape['spans']} spans); per task:",
        line("model calls", "model_calls"),
        line("tool calls", "tool_calls"),
        line("sub-agent depth", "depth"),
        line("fan-out (sub-agents)", "fanout"),
        line("model calls at once", "parallel_calls"),
        line("task duration", "duration_s", " s"),
        line("largest context", "context_tokens", " tokens"),
    ]
    tools = shape["tool_latency_s"]
    if tools:
        lines.append(f"  {'tool latency':22} p50 {tools['p50']:.2f} s, max {tools['max']:.2f} s")
    return lines
