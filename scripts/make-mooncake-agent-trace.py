#!/usr/bin/env python3
"""Write traces/mooncake-agent-sample.jsonl: a small synthetic agent trace in Mooncake's layout.

Mooncake's FAST'25 release (conversation, tool-agent and synthetic traces) is JSON lines of
``timestamp`` (ms since the first request), ``input_length``, ``output_length`` and
``hash_ids``: one id per 512-token block of the prompt, each id naming the whole prefix up to
that block's end (a partial last block gets its own id), new prefixes taking the next integer.
The real files cannot be downloaded on this project's machines; this stand-in has their
layout and agent traffic's shape: every task starts from one shared system prompt with tool
schemas, a planner turn, two to four sub-agents branching from its context at the same
moment, each answering after a tool result of very different size (log-normal), and the
planner's join of their answers. Tasks arrive as a Poisson process. ``bakeoff trace inspect``
reads the call trees back from the hash ids alone. Deterministic: the same seed writes a
byte-identical file.

    .venv/bin/python scripts/make-mooncake-agent-trace.py [--out traces/mooncake-agent-sample.jsonl] [--seed 5]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

import orjson
from prefix_blocks import Segment, block_ids

BLOCK = 512
SYSTEM_AND_TOOLS = (0, 1536)  # segment 0: the system prompt and tool schemas every task starts with


@dataclass
class Call:
    at_ms: int
    segments: list[Segment]
    output: int

    @property
    def prompt(self) -> int:
        return sum(n for _, n in self.segments)


class Segments:
    """Hands out fresh segment ids: each stands for text no other segment holds."""

    def __init__(self) -> None:
        self.next = 1

    def new(self, tokens: int) -> Segment:
        self.next += 1
        return (self.next - 1, tokens)


def ms(tokens_in: int, tokens_out: int) -> int:
    # About 0.5 ms per prompt token of prefill on a busy server and 25 ms per output token.
    return round(0.5 * tokens_in + 25 * tokens_out)


def make_task(rng: random.Random, seg: Segments, start_ms: int) -> list[Call]:
    # The task text and each sub-agent's brief run past a block boundary, so each call sends a
    # block of its own and the ids can tell whose context its children extend.
    planner = Call(start_ms, [SYSTEM_AND_TOOLS, seg.new(rng.randint(600, 1400))], rng.randint(80, 200))
    context = [*planner.segments, seg.new(planner.output)]  # the planner's reply, resent as text
    branch_ms = start_ms + ms(planner.prompt, planner.output)
    calls, answers, ends = [planner], [], []
    for _ in range(rng.randint(2, 4)):
        first = Call(branch_ms, [*context, seg.new(rng.randint(450, 900))], rng.randint(30, 80))
        tool_ms = round(1000 * rng.lognormvariate(-0.7, 1.0))
        result = seg.new(min(max(int(rng.lognormvariate(6.2, 0.8)), 20), 3000))
        second_ms = first.at_ms + ms(first.prompt, first.output) + tool_ms
        second = Call(second_ms, [*first.segments, seg.new(first.output), result], rng.randint(60, 140))
        calls += [first, second]
        answers.append(seg.new(second.output))
        ends.append(second.at_ms + ms(second.prompt, second.output))
    think_ms = round(1000 * rng.expovariate(1 / 0.3))
    calls.append(Call(max(ends) + think_ms, [*context, *answers], rng.randint(100, 250)))
    return calls


def hash_ids(calls: list[Call]) -> list[list[int]]:
    """One id per block: the id of the prompt's whole prefix up to that block's end."""
    return block_ids((c.segments for c in calls), BLOCK)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("traces/mooncake-agent-sample.jsonl"))
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    seg = Segments()
    calls: list[Call] = []
    at = 0
    for _ in range(args.tasks):
        calls += make_task(rng, seg, at)
        at += round(1000 * rng.expovariate(0.25))
    calls.sort(key=lambda c: c.at_ms)  # stable: a task's calls keep their order on equal stamps
    rows = [
        orjson.dumps({"timestamp": c.at_ms, "input_length": c.prompt, "output_length": c.output, "hash_ids": ids})
        for c, ids in zip(calls, hash_ids(calls), strict=True)
    ]
    args.out.write_bytes(b"\n".join(rows) + b"\n")
    print(f"{args.out}: {args.tasks} agent tasks, {len(rows)} calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
