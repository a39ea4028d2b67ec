"""``bakeoff trace inspect`` and ``bakeoff trace convert``: a trace looked at before it is run.

Both read a trace exactly as a ``kind: trace`` workload would (same parser, filters and
window), so what ``inspect`` shows is what a campaign replays, and a converted file
replays the same requests under ``format: bakeoff``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from bakeoff.errors import SpecError
from bakeoff.workloads.traces.formats import FORMATS, detect_format, write_bakeoff

# The workload model and the trace readers are imported when the command runs: `bakeoff` builds
# every command's options from this module, and --help should not load them.
if TYPE_CHECKING:
    from bakeoff.workloads.kinds import Trace


def add_trace_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    trace = sub.add_parser("trace", help="inspect a production trace, or convert it to bakeoff's JSONL")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    inspect = trace_sub.add_parser("inspect", help="count, duration, arrival rate over time, lengths, prefix reuse")
    convert = trace_sub.add_parser("convert", help="write a trace in bakeoff's JSONL (format: bakeoff)")
    for parser in (inspect, convert):
        parser.add_argument("file", type=Path, help="the trace file")
        parser.add_argument("--format", choices=FORMATS, help="the file's format (default: told from its first line)")
        parser.add_argument(
            "--block-size",
            type=int,
            help="mooncake: tokens per hash id (default: 512); otel: the cache block reuse is counted in (default: 16)",
        )
        parser.add_argument("--model", action="append", default=[], help="burstgpt: keep this Model, repeatable")
        parser.add_argument("--log-type", action="append", default=[], help="burstgpt: keep this Log Type, repeatable")
        parser.add_argument("--start-s", type=float, default=0.0, help="window start, trace seconds")
        parser.add_argument("--duration-s", type=float, help="window length, trace seconds (default: to the end)")
        parser.add_argument("--max-requests", type=int, help="keep the window's first N requests (default: all)")
        parser.add_argument("--time-scale", type=float, default=1.0, help="1.0 real time, 0.5 twice as fast")
    inspect.add_argument("--bin-s", type=float, help="arrival-rate bin width in seconds (default: span / 20)")
    inspect.add_argument(
        "--cache-block",
        type=int,
        help="also count the reuse at this KV-cache block size in tokens, e.g. 16 (default: the trace's block)",
    )
    inspect.add_argument("--json", action="store_true", help="print the figures as JSON")
    convert.add_argument("--out", type=Path, required=True, help="the .jsonl file to write")


def trace_workload(args: argparse.Namespace) -> Trace:
    """The workload a campaign would write for these options; errors name the option."""
    from pydantic import ValidationError

    from bakeoff.schema import flag_errors
    from bakeoff.workloads.kinds import Trace

    if not args.file.is_file():
        raise SpecError(f"{args.file}: no such trace file")
    fmt = args.format or detect_format(args.file)
    values = {
        "path": args.file,
        "format": fmt,
        "start_s": args.start_s,
        "duration_s": args.duration_s,
        "max_requests": args.max_requests,
        "time_scale": args.time_scale,
        "block_size": args.block_size,
        "models": args.model,
        "log_types": args.log_type,
    }
    try:
        return Trace.model_validate(values)
    except ValidationError as exc:
        # Name the command-line option, not the workload field it fills.
        raise SpecError(
            flag_errors(exc, lambda loc: "--" + ("-".join(map(str, loc)).replace("_", "-") or "options"))
        ) from None


def cmd_trace(args: argparse.Namespace) -> int:
    from bakeoff.results.store import atomic_write_bytes
    from bakeoff.workloads.traces.inspect import render, summarize_trace
    from bakeoff.workloads.traces.loading import load_trace

    wl = trace_workload(args)
    if args.trace_command == "inspect":
        if args.bin_s is not None and args.bin_s <= 0:
            raise SpecError(f"--bin-s must be more than 0 seconds, got {args.bin_s}")
        if args.cache_block is not None and args.cache_block <= 0:
            raise SpecError(f"--cache-block must be 1 token or more, got {args.cache_block}")
        summary = summarize_trace(wl, args.bin_s, args.cache_block)
        print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() if args.json else render(summary))
        return 0
    trace = load_trace(wl)
    if args.out.suffix != ".jsonl":
        raise SpecError(f"--out: {args.out} should end in .jsonl (bakeoff traces are JSON lines)")
    atomic_write_bytes(args.out, write_bakeoff(trace, wl.time_scale))
    left = sum(trace.left_out.values())
    note = f" ({left} rows left out: {', '.join(trace.left_out)})" if left else ""
    print(f"{args.out}: {len(trace.rows)} requests from {args.file} ({wl.format}){note}", file=sys.stderr)
    return 0
