"""Agent traces as OpenTelemetry GenAI spans: the tree read from parent links, its inferred reuse, inspect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bakeoff.errors import SpecError
from bakeoff.workloads.kinds import Trace
from bakeoff.workloads.traces.formats import detect_format, write_bakeoff
from bakeoff.workloads.traces.loading import load_trace
from bakeoff.workloads.traces.otel import read_spans, task_calls, tree_shape
from bakeoff.workloads.traces.rows import reuse_share, reused_tokens

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "agent-otel-sample.jsonl"


def span(sid: int, parent: int, op: str, start: float, end: float, prompt: int = 0, out: int = 0) -> dict[str, object]:
    attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": op}}]
    if prompt:
        attrs += [
            {"key": "gen_ai.usage.input_tokens", "value": {"intValue": prompt}},
            {"key": "gen_ai.usage.output_tokens", "value": {"intValue": out}},
        ]
    return {
        "traceId": "t1",
        "spanId": f"s{sid}",
        "parentSpanId": f"s{parent}" if parent else "",
        "name": op,
        "startTimeUnixNano": str(int(start * 1e9)),
        "endTimeUnixNano": str(int(end * 1e9)),
        "attributes": attrs,
    }


def write(path: Path, spans: list[dict[str, object]]) -> Path:
    path.write_bytes(orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + b"\n")
    return path


# A planner agent (s1): a planner call, two sub-agents (s3, s4) of one call and a tool each, then a join.
TREE = [
    span(1, 0, "invoke_agent", 0.0, 10.0),
    span(2, 1, "chat", 0.0, 1.0, prompt=100, out=20),
    span(3, 1, "invoke_agent", 1.0, 5.0),
    span(4, 1, "invoke_agent", 1.0, 6.0),
    span(5, 3, "chat", 1.1, 2.0, prompt=140, out=10),
    span(6, 3, "execute_tool", 2.0, 4.0),
    span(7, 4, "chat", 1.1, 3.0, prompt=130, out=10),
    span(8, 1, "chat", 6.5, 7.0, prompt=150, out=30),
]


def test_parent_links_make_the_tree_and_the_contexts_each_call_extends(tmp_path: Path) -> None:
    path = write(tmp_path / "agent.jsonl", TREE)
    assert detect_format(path) == "otel"
    calls = task_calls(read_spans(path))["t1"]
    assert [c.span.span for c in calls] == ["s2", "s5", "s7", "s8"]
    assert [c.depth for c in calls] == [0, 1, 1, 0]
    # Each sub-agent's first call branches from the planner call; the join extends the planner call too.
    assert [c.context_parent for c in calls] == [None, 0, 0, 0]
    shape = tree_shape(path)
    assert shape["tasks"] == 1 and shape["fanout"]["max"] == 2 and shape["tool_calls"]["max"] == 1
    assert shape["parallel_calls"]["max"] == 2 and shape["depth"]["max"] == 1
    assert shape["tool_latency_s"] == {"p50": 2.0, "max": 2.0}


def test_inferred_reuse_counts_whole_blocks_of_the_shared_context(tmp_path: Path) -> None:
    path = write(tmp_path / "agent.jsonl", TREE)
    trace = load_trace(Trace.model_validate({"path": path, "format": "otel", "block_size": 16}))
    rows = trace.rows
    assert [r.prompt_tokens for r in rows] == [100, 140, 130, 150]
    reused = reused_tokens([(r.prompt_tokens, r.blocks) for r in rows], 16)
    # The planner's context (prompt and reply) is 120 tokens, 7 whole blocks of which each later call shares.
    # The first branch reuses only the 100 its prompt sent (reuse counts what earlier prompts sent); it sends
    # the 7th block whole, so the next calls reuse all 112.
    assert reused == [0, 100, 112, 112]
    assert {r.session for r in rows} == {"t1"}
    # Converted, it replays as a bakeoff trace with the same block ids.
    converted = tmp_path / "agent-bakeoff.jsonl"
    converted.write_bytes(write_bakeoff(trace))
    again = load_trace(Trace.model_validate({"path": converted, "format": "bakeoff"}))
    assert [r.blocks for r in again.rows] == [r.blocks for r in rows]


def test_spans_without_usage_are_refused_naming_the_row(tmp_path: Path) -> None:
    broken = write(tmp_path / "broken.jsonl", [span(1, 0, "chat", 0.0, 1.0)])
    with pytest.raises(SpecError, match=r"row 1: span s1: gen_ai.usage.input_tokens"):
        read_spans(broken)
    (tmp_path / "other.jsonl").write_text('{"spans": []}\n')
    with pytest.raises(SpecError, match="row 1: resourceSpans: missing"):
        read_spans(tmp_path / "other.jsonl")


def test_inspect_prints_the_shipped_agent_samples_tree_and_reuse() -> None:
    shape = tree_shape(SAMPLE)
    assert shape["tasks"] == 8 and shape["fanout"]["min"] >= 2 and shape["depth"]["max"] == 1
    trace = load_trace(Trace.model_validate({"path": SAMPLE, "format": "otel"}))
    share = reuse_share([(r.prompt_tokens, r.blocks) for r in trace.rows], 16)
    assert share is not None and 0.5 < share < 0.95
    done = subprocess.run(
        [sys.executable, "-m", "bakeoff", "trace", "inspect", str(SAMPLE)], capture_output=True, text=True, check=True
    )
    assert "agent tasks   8 tasks" in done.stdout and "fan-out (sub-agents)" in done.stdout
    assert f"prefix reuse  {share:.1%}" in done.stdout
