#!/usr/bin/env python3
"""Write the small synthetic traces under traces/, one per format bakeoff replays.

The public traces (Mooncake FAST'25, Azure LLM inference 2023/2024, BurstGPT) cannot be
downloaded on this project's machines; these stand-ins have their layouts and their
troubles: bursts over a Poisson background, heavy-tailed (log-normal) lengths, and shared
prefixes (a few applications' system prompts, and conversations whose every turn resends
the history). Deterministic: the same seed writes byte-identical files.

    .venv/bin/python scripts/make-traces.py [--out traces] [--seed 7]

Block ids are assigned the way Mooncake's release hashes prompts (scripts/prefix_blocks.py):
equal ids mean equal prefixes.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from prefix_blocks import Segment
from prefix_blocks import block_ids as prefix_block_ids


@dataclass
class Request:
    at_s: float
    segments: list[Segment]
    output: int
    session: int
    app: int

    @property
    def prompt(self) -> int:
        return sum(n for _, n in self.segments)


def arrivals(
    gen: np.random.Generator, count: int, rate: float, bursts: list[tuple[float, float, float]]
) -> list[float]:
    """``count`` session starts: Poisson at ``rate``, times ``factor`` inside each (start, length, factor) burst."""
    times, now = [], 0.0
    while len(times) < count:
        factor = next((f for s, n, f in bursts if s <= now < s + n), 1.0)
        now += float(gen.exponential(1.0 / (rate * factor)))
        times.append(now)
    return times


def lognormal(gen: np.random.Generator, median: float, sigma: float, low: int, high: int) -> int:
    return int(np.clip(round(float(gen.lognormal(np.log(median), sigma))), low, high))


def stream(seed: int, sessions: int, max_prompt: int) -> list[Request]:
    """Conversations of 1-6 turns on one of four applications, each with its own system prompt."""
    gen = np.random.default_rng(seed)
    system = [(1000 + a, int(n)) for a, n in enumerate((768, 1280, 384, 1792))]  # segment ids 1000+ are prompts
    starts = arrivals(gen, sessions, rate=0.5, bursts=[(15.0, 6.0, 8.0), (55.0, 4.0, 10.0)])
    next_segment, requests = 1, []
    for session, start in enumerate(starts):
        app = int(gen.choice(4, p=[0.4, 0.3, 0.2, 0.1]))
        history: list[Segment] = [system[app]]
        at = start
        for _turn in range(int(gen.integers(1, 7))):
            user = (next_segment, lognormal(gen, 90, 1.1, 4, 1500))
            next_segment += 1
            if sum(n for _, n in history) + user[1] > max_prompt:
                break
            output = lognormal(gen, 24, 0.9, 2, 256)
            requests.append(Request(at, [*history, user], output, session, app))
            reply = (next_segment, output)  # the reply is resent, as text, on the next turn
            next_segment += 1
            history = [*history, user, reply]
            at += float(gen.exponential(6.0)) + 1.0
    return sorted(requests, key=lambda r: r.at_s)


def block_ids(requests: list[Request], block_size: int) -> list[list[int]]:
    """Mooncake-style ids: one per block, the id of the whole prefix up to that block's end."""
    return prefix_block_ids((r.segments for r in requests), block_size)


def mooncake(requests: list[Request], block_size: int) -> bytes:
    lines = [
        orjson.dumps(
            {"timestamp": round(r.at_s * 1000), "input_length": r.prompt, "output_length": r.output, "hash_ids": ids}
        )
        for r, ids in zip(requests, block_ids(requests, block_size), strict=True)
    ]
    return b"\n".join(lines) + b"\n"


def bakeoff(requests: list[Request], block_size: int) -> bytes:
    lines = [orjson.dumps({"bakeoff_trace": 1, "block_size": block_size, "source": "scripts/make-traces.py"})]
    for r, ids in zip(requests, block_ids(requests, block_size), strict=True):
        item = {"arrival_s": round(r.at_s, 3), "prompt_tokens": r.prompt, "output_tokens": r.output}
        lines.append(orjson.dumps({**item, "session_id": f"s{r.session}", "block_ids": ids}))
    return b"\n".join(lines) + b"\n"


def azure(requests: list[Request]) -> bytes:
    base = dt.datetime(2023, 11, 16, 18, 15, 46)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
    for r in requests:
        stamp = base + dt.timedelta(seconds=r.at_s)
        # The release writes 7 fractional digits (100 ns ticks).
        writer.writerow([stamp.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", r.prompt, r.output])
    return out.getvalue().encode()


def burstgpt(requests: list[Request], seed: int) -> bytes:
    gen = np.random.default_rng(seed + 1)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"])
    for r in requests:
        model = "GPT-4" if r.app == 3 or gen.random() < 0.15 else "ChatGPT"
        log_type = "Conversation log" if r.app < 2 else "API log"
        response = 0 if gen.random() < 0.03 else r.output  # the release keeps failed requests, with 0 tokens
        writer.writerow([f"{r.at_s:.0f}", model, r.prompt, response, r.prompt + response, log_type])
    return out.getvalue().encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "traces")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    chat = stream(args.seed, sessions=70, max_prompt=3500)
    files = {
        "mooncake-sample.jsonl": mooncake(chat, 512),
        "bakeoff-sample.jsonl": bakeoff(stream(args.seed + 1, sessions=40, max_prompt=1500), 16),
        "azure-sample.csv": azure(stream(args.seed + 2, sessions=90, max_prompt=3500)),
        "burstgpt-sample.csv": burstgpt(stream(args.seed + 3, sessions=90, max_prompt=3500), args.seed),
    }
    for name, data in files.items():
        (args.out / name).write_bytes(data)
        rows = data.count(b"\n") - (0 if name.startswith("mooncake") else 1)  # less the header line
        print(f"{args.out / name}: {rows} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
