"""Past one client process: does spreading the load keep TTFT and TPOT true?

Drives the reference server (exactly known timing) through ``execute_plan`` with a
closed loop at a chunk rate chosen to exceed what one client process sustains, first
from one process, then from several (:mod:`bakeoff.measure.multiload`), and prints for each:
mean TTFT and TPOT against the configured truth (percent error), each client process's
CPU share, and the server's own lateness (its pacer's mean delay per chunk), which tells
client error from server error. Also prints what ``auto`` would have chosen.

On a small host the reference server competes for the same cores as the clients: give
it few, fat chunks of work relative to the client (short ``--itl-ms`` at high
concurrency, one token per chunk) and check its lateness column before reading the
client's error. Usage::

    python benchmarks/loadgen_multiprocess.py --concurrency 256 --processes 1,2 --out multi.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import urllib.request
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import orjson

from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.measure.client import ClientSettings
from bakeoff.measure.metrics import tpot_ms, ttft_ms
from bakeoff.observe.telemetry import parse_prometheus
from bakeoff.ref.options import MODEL
from bakeoff.results.store import read_records
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.kinds import ConcurrencySweep
from bakeoff.workloads.plans import PlannedRequest, RunPlan

ERROR_TARGET_PCT = 1.0


def counters(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
        return parse_prometheus(resp.read().decode())


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """A counter's growth; the Prometheus parser may name a counter with its ``_total`` suffix."""
    key = name if name in after else f"{name}_total"
    return after.get(key, 0.0) - before.get(key, 0.0)


def plan_for(args: argparse.Namespace) -> RunPlan:
    """Warm-up at full concurrency (so ``auto`` sees the real demand), lead-in of spread lengths.

    Identical requests started together stay in lock-step; the lead-in's spread lengths
    phase-shift the workers, as real length mixes do (negative ids: left out of timing).
    """
    conc = args.concurrency
    prompt = " ".join(f"p{i}" for i in range(32))

    def req(i: int, tokens: int) -> PlannedRequest:
        return PlannedRequest(i, "completions", tokens, prompt=prompt, prompt_tokens=32)

    warm = [req(-10_000 - i, args.output_tokens) for i in range(conc)]
    lead = [req(-i - 1, 1 + i * args.output_tokens // conc) for i in range(conc)]
    measured = [req(i, args.output_tokens) for i in range(conc * args.rounds)]
    # Every measured request runs: the level's window minimum is all of them.
    return RunPlan(
        f"c{conc}",
        "closed",
        ConcurrencySweep(levels=[1], input_len=8, output_len=8),
        concurrency=conc,
        warmup=warm,
        requests=lead + measured,
        min_requests=len(measured),
    )


def measure(base_url: str, args: argparse.Namespace, processes: int | None, out: Path) -> dict[str, Any]:
    before = counters(base_url)
    target = RunTarget(ClientSettings(base_url=base_url, model=MODEL), show_progress=False)
    target.client_processes = processes
    summary = execute_plan(plan_for(args), target, out)
    after = counters(base_url)
    ok = [r for r in read_records(out / "records.parquet") if r.ok and not r.warmup and r.request_id >= 0]
    ttfts = [v for r in ok if (v := ttft_ms(r)) is not None]
    tpots = [v for r in ok if (v := tpot_ms(r)) is not None]
    n_chunks = -(-args.output_tokens // args.tokens_per_chunk)
    true_tpot = (n_chunks - 1) * args.itl_ms / (args.output_tokens - 1)
    chunks = delta(before, after, "bakeoff_ref_chunks_total")
    late_s = delta(before, after, "bakeoff_ref_late_seconds_total")
    server_cpu_s = delta(before, after, "process_cpu_seconds")
    client = summary.client
    assert client is not None
    ttft_mean, tpot_mean = statistics.fmean(ttfts), statistics.fmean(tpots)
    return {
        "processes": client.processes,
        "decided_by": client.decided_by,
        "requests": len(ok),
        "failed": summary.requests.failed,
        "ttft_ms_mean": ttft_mean,
        "ttft_error_pct": (ttft_mean - args.ttft_ms) / args.ttft_ms * 100,
        "tpot_ms_mean": tpot_mean,
        "tpot_error_pct": (tpot_mean - true_tpot) / true_tpot * 100,
        "client_cpu_util": client.cpu_util,
        "client_headroom": client.headroom,
        "auto_estimate": client.estimate,
        "server_late_ms_per_chunk": late_s * 1e3 / chunks if chunks else None,
        "server_cpu_us_per_chunk": server_cpu_s * 1e6 / chunks if chunks else None,
        "chunks_per_s_served": summary.throughput.output_tok_s / args.tokens_per_chunk,
        "load_avg_1m": os.getloadavg()[0],
    }


def line(row: dict[str, Any]) -> str:
    util = ",".join(f"{u:.2f}" for u in row["client_cpu_util"])
    late = row["server_late_ms_per_chunk"]
    return (
        f"{row['processes']:>5} {row['decided_by']:>6} {row['requests']:>5} {row['failed']:>4} "
        f"{row['ttft_ms_mean']:>8.2f} {row['ttft_error_pct']:>+9.2f} {row['tpot_ms_mean']:>8.3f} "
        f"{row['tpot_error_pct']:>+9.2f} {row['chunks_per_s_served']:>9.0f} {util:>14} "
        f"{'-' if late is None else f'{late:.3f}':>8} {row['server_cpu_us_per_chunk'] or 0:>8.1f} "
        f"{row['load_avg_1m']:>5.2f}"
    )


HEADER = (
    "procs    how  reqs fail  TTFT ms TTFT err%  TPOT ms TPOT err%  chunks/s     client cpu srv late srv us/c  load"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--processes", default="1,2", help="comma-separated client process counts; 0 = auto")
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="measured requests = rounds x concurrency")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.processes.split(",")]
    rows = []
    options = {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms, "tokens_per_chunk": args.tokens_per_chunk}
    with serve_reference(**options) as base_url, TemporaryDirectory() as tmp:
        print(HEADER, flush=True)
        for n in counts:
            row = measure(base_url, args, n or None, Path(tmp) / f"p{n}")
            rows.append(row)
            print(line(row), flush=True)
    for row in rows:
        row["within_target"] = max(abs(row["ttft_error_pct"]), abs(row["tpot_error_pct"])) < ERROR_TARGET_PCT
    verdict = "; ".join(f"{r['processes']} process(es): {'within' if r['within_target'] else 'OUTSIDE'}" for r in rows)
    print(f"TTFT and TPOT within {ERROR_TARGET_PCT:g} % of truth: {verdict}")
    result = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "cpus": os.cpu_count(), "runs": rows}
    Path(args.out).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
