"""Is the load generator ever what limits a measurement? Measure its cost and its error.

Drives the reference server (its own process, exactly known timing) through the real
client and closed-loop load generator at several concurrency levels and reports, per level:

- client CPU microseconds per content chunk: process CPU time of this process (the client
  alone; the server runs elsewhere) over the measured phase, divided by chunks received;
- timing error: measured mean TTFT and TPOT against the configured values, in percent;
- the server's own schedule lateness and CPU, to tell client error from server error.

Targets: at most 25 us of client CPU per chunk, and TTFT and TPOT errors under 1 % at
concurrency 128. Usage::

    python benchmarks/loadgen_overhead.py --out overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from dataclasses import replace
from typing import Any

import orjson
import uvloop

from bakeoff.client import ClientSettings, PlannedRequest, StreamingClient
from bakeoff.loadgen import closed_loop
from bakeoff.metrics import itl_ms, tpot_ms, ttft_ms
from bakeoff.records import RequestRecord
from bakeoff.refserver import MODEL, serve_reference
from bakeoff.telemetry import parse_prometheus

CPU_TARGET_US = 25.0
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
ERROR_TARGET_PCT = 1.0


def server_counters(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
        return parse_prometheus(resp.read().decode())


def requests_for(count: int, max_tokens: int, first_id: int) -> list[PlannedRequest]:
    prompt = " ".join(f"p{i}" for i in range(64))
    return [
        PlannedRequest(first_id + i, "completions", max_tokens, prompt=prompt, prompt_tokens=64)
        for i in range(count)
    ]


async def drive(
    settings: ClientSettings, level: int, count: int, max_tokens: int
) -> tuple[list[RequestRecord], float]:
    """Run staggered lead-in requests, then the measured ones; return all records and CPU s.

    Identical requests started together stay in lock-step, and every round would begin
    with ``level`` requests sent at once: a burst that measures queueing in both HTTP
    stacks, not per-request overhead. Lead-in requests of spread lengths (negative ids,
    left out of timing statistics) phase-shift the workers as real length mixes do.
    """
    records: list[RequestRecord] = []
    lead_in = [
        replace(item, max_tokens=1 + i * max_tokens // level)
        for i, item in enumerate(requests_for(level, max_tokens, -level))
    ]
    async with StreamingClient(settings) as client:
        cpu_start = time.process_time()
        await closed_loop(
            client, lead_in + requests_for(count, max_tokens, 0), level, records.append
        )
        cpu = time.process_time() - cpu_start
    return records, cpu


def measure_level(base_url: str, args: argparse.Namespace, level: int) -> dict[str, Any]:
    settings = ClientSettings(base_url=base_url, model=MODEL, stall_timeout_s=30.0)
    count = max(level * args.rounds, args.min_requests)
    before = server_counters(base_url)
    wall_start = time.perf_counter()
    with asyncio.Runner(loop_factory=LOOPS[args.loop]) as runner:
        records, cpu_s = runner.run(drive(settings, level, count, args.output_tokens))
    wall_s = time.perf_counter() - wall_start
    after = server_counters(base_url)
    # CPU is shared by every request, so it is divided by every chunk; timing is judged
    # on measured requests only.
    chunks = sum(len(r.chunk_ns) for r in records)
    ok = [r for r in records if r.ok and r.request_id >= 0]
    ttfts = [v for r in ok if (v := ttft_ms(r)) is not None]
    tpots = [v for r in ok if (v := tpot_ms(r)) is not None]
    itls = sorted(g for r in ok for g in itl_ms(r))
    headers = [(r.headers_ns - r.start_ns) / 1e6 for r in ok]
    server_chunks = after["bakeoff_ref_chunks_total"] - before["bakeoff_ref_chunks_total"]
    late_ms = (after["bakeoff_ref_late_seconds_sum"] - before["bakeoff_ref_late_seconds_sum"]) * 1e3
    server_cpu = after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]
    # Several tokens per chunk: chunk gaps are ``itl``, so TPOT is the spread over the tokens.
    n_chunks = -(-args.output_tokens // args.tokens_per_chunk)
    expected_tpot = (n_chunks - 1) * args.itl_ms / (args.output_tokens - 1)
    ttft_mean = statistics.fmean(ttfts) if ttfts else float("nan")
    tpot_mean = statistics.fmean(tpots) if tpots else float("nan")
    return {
        "concurrency": level,
        "requests": len(ok),
        "failed": sum(not r.ok for r in records),
        "chunks": chunks,
        "wall_s": wall_s,
        "client_cpu_s": cpu_s,
        "client_cpu_us_per_chunk": cpu_s / chunks * 1e6 if chunks else None,
        "client_cpu_share": cpu_s / wall_s,
        "ttft_ms_mean": ttft_mean,
        "ttft_ms_p99": sorted(ttfts)[int(0.99 * (len(ttfts) - 1))] if ttfts else None,
        "ttft_error_pct": (ttft_mean - args.ttft_ms) / args.ttft_ms * 100,
        "headers_ms_mean": statistics.fmean(headers) if headers else None,
        "tpot_ms_mean": tpot_mean,
        "tpot_error_pct": (tpot_mean - expected_tpot) / expected_tpot * 100,
        "itl_ms_p50": itls[len(itls) // 2] if itls else None,
        "itl_ms_p99": itls[int(0.99 * (len(itls) - 1))] if itls else None,
        "server_late_ms_mean": late_ms / server_chunks if server_chunks else None,
        "server_cpu_us_per_chunk": server_cpu / server_chunks * 1e6 if server_chunks else None,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'conc':>5} {'reqs':>5} {'fail':>4} {'chunks':>7} {'cli us/chunk':>12} {'cli cpu%':>8} "
        f"{'hdr ms':>6} {'TTFT ms':>8} {'TTFT err%':>9} {'TPOT ms':>8} {'TPOT err%':>9} {'ITL p99':>8} "
        f"{'srv late ms':>11} {'srv us/chunk':>12}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['concurrency']:>5} {r['requests']:>5} {r['failed']:>4} {r['chunks']:>7} "
            f"{r['client_cpu_us_per_chunk'] or 0:>12.1f} {r['client_cpu_share'] * 100:>8.1f} "
            f"{r['headers_ms_mean'] or 0:>6.2f} {r['ttft_ms_mean']:>8.2f} {r['ttft_error_pct']:>+9.2f} {r['tpot_ms_mean']:>8.3f} "
            f"{r['tpot_error_pct']:>+9.2f} {r['itl_ms_p99'] or 0:>8.2f} "
            f"{r['server_late_ms_mean'] or 0:>11.3f} {r['server_cpu_us_per_chunk'] or 0:>12.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--levels", default="1,32,128,256", help="comma-separated concurrency levels"
    )
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=25.0)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="requests per level = rounds x level")
    parser.add_argument("--min-requests", type=int, default=4)
    parser.add_argument("--loop", choices=sorted(LOOPS), default="asyncio")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    with serve_reference(
        ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens_per_chunk=args.tokens_per_chunk
    ) as base_url:
        rows = [measure_level(base_url, args, level) for level in levels]
    print(table(rows))
    gate = next((r for r in rows if r["concurrency"] == 128), None)
    passed = gate is not None and (
        (gate["client_cpu_us_per_chunk"] or 0) <= CPU_TARGET_US
        and abs(gate["ttft_error_pct"]) < ERROR_TARGET_PCT
        and abs(gate["tpot_error_pct"]) < ERROR_TARGET_PCT
    )
    config = {k: v for k, v in vars(args).items() if k != "out"}
    result = {
        "config": config,
        "targets": {"cpu_us_per_chunk": CPU_TARGET_US, "error_pct": ERROR_TARGET_PCT},
        "passed_at_128": passed,
        "levels": rows,
    }
    with open(args.out, "wb") as handle:
        handle.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"targets at concurrency 128 {'met' if passed else 'MISSED'}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
