#!/usr/bin/env python3
"""Write traces/agent-otel-sample.jsonl: a small synthetic agent trace as OpenTelemetry GenAI spans.

No public agent trace can be downloaded on this project's machines; this stand-in has the
layout an OpenTelemetry Collector's file exporter writes (one OTLP trace export a line) and
the shape agent traffic has: a planner turn over a long shared system prompt with tool
schemas, two to four sub-agents on branches of its context, each calling a tool (log-normal
latency, tool results of very different sizes) and answering, then the planner's join of
their answers. One task a line, tasks arriving as a Poisson process. Deterministic: the same
seed writes a byte-identical file.

    .venv/bin/python scripts/make-agent-trace.py [--out traces/agent-otel-sample.jsonl] [--seed 11]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import orjson

SYSTEM_AND_TOOLS = 1536  # tokens every planner call starts with


class Task:
    def __init__(self, rng: random.Random, index: int, start_s: float) -> None:
        self.rng = rng
        self.trace = f"{index + 1:032x}"
        self.spans: list[dict[str, object]] = []
        self.next = 1
        self.clock = start_s

    def span(self, parent: str, name: str, operation: str, start: float, end: float, **usage: int) -> str:
        span_id = f"{self.next:016x}"
        self.next += 1
        attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": operation}}]
        attrs += [{"key": f"gen_ai.usage.{k}", "value": {"intValue": v}} for k, v in usage.items()]
        if operation == "chat":
            attrs.append({"key": "gen_ai.request.model", "value": {"stringValue": "agent-model"}})
        self.spans.append(
            {
                "traceId": self.trace,
                "spanId": span_id,
                "parentSpanId": parent,
                "name": name,
                "kind": 3 if operation == "chat" else 1,
                "startTimeUnixNano": str(int(start * 1e9)),
                "endTimeUnixNano": str(int(end * 1e9)),
                "attributes": attrs,
            }
        )
        return span_id

    def chat(self, parent: str, start: float, prompt: int, output: int) -> float:
        # About 2 ms per prompt token of prefill on a busy server and 20 ms per output token.
        end = start + 0.002 * prompt + 0.02 * output
        self.span(parent, "chat agent-model", "chat", start, end, input_tokens=prompt, output_tokens=output)
        return end


def make_task(rng: random.Random, index: int, start_s: float) -> bytes:
    task = Task(rng, index, start_s)
    fanout = rng.randint(2, 4)
    root_end_guess = start_s + 60.0
    root = task.span("", "invoke_agent planner", "invoke_agent", start_s, root_end_guess)
    planner_prompt = SYSTEM_AND_TOOLS + rng.randint(40, 160)
    planner_out = rng.randint(80, 160)
    t = task.chat(root, start_s + 0.01, planner_prompt, planner_out)
    context = planner_prompt + planner_out
    answers, ends = [], []
    for branch in range(fanout):
        sub_start = t + 0.005 * branch
        sub = task.span(root, f"invoke_agent researcher-{branch}", "invoke_agent", sub_start, sub_start + 1.0)
        first_prompt = context + rng.randint(30, 90)
        first_out = rng.randint(30, 80)
        u = task.chat(sub, sub_start + 0.01, first_prompt, first_out)
        latency = rng.lognormvariate(-0.7, 1.0)
        task.span(sub, "execute_tool search", "execute_tool", u, u + latency)
        result = int(rng.lognormvariate(6.2, 0.8))  # tool results from a few dozen to a few thousand tokens
        second_prompt = first_prompt + first_out + min(max(result, 20), 3000)
        answer = rng.randint(60, 140)
        done = task.chat(sub, u + latency + 0.01, second_prompt, answer)
        task.spans[[s["spanId"] for s in task.spans].index(sub)]["endTimeUnixNano"] = str(int(done * 1e9))
        answers.append(answer)
        ends.append(done)
    think = rng.expovariate(1 / 0.3)
    join_start = max(ends) + think
    join_end = task.chat(root, join_start, context + 20 + sum(answers), rng.randint(100, 200))
    task.spans[0]["endTimeUnixNano"] = str(int((join_end + 0.01) * 1e9))
    export = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent-sample"}}]},
                "scopeSpans": [{"scope": {"name": "bakeoff.sample"}, "spans": task.spans}],
            }
        ]
    }
    return orjson.dumps(export)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("traces/agent-otel-sample.jsonl"))
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--tasks", type=int, default=8)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    epoch = 1_767_000_000.0  # a fixed wall-clock start, so the file does not change between runs
    lines, at = [], epoch
    for index in range(args.tasks):
        lines.append(make_task(rng, index, at))
        at += rng.expovariate(0.5)
    args.out.write_bytes(b"\n".join(lines) + b"\n")
    print(f"{args.out}: {args.tasks} agent tasks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
