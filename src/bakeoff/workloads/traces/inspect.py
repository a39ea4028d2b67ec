"""What ``bakeoff trace inspect`` says about a trace before anyone replays it.

Request count, duration, the arrival rate over time (how bursty it is), prompt and output
length distributions (how heavy the tails are), sessions, and the prefix reuse its block
ids design. Every figure is computed from the rows as the replay would send them
(filters, window and ``time_scale`` applied).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bakeoff.workloads.kinds import Trace
from bakeoff.workloads.traces.hash_tree import hash_tree_shape, render_hash_shape
from bakeoff.workloads.traces.loading import load_trace
from bakeoff.workloads.traces.otel import render_shape, tree_shape
from bakeoff.workloads.traces.rows import (
    SHARING_CLASSES,
    cache_block_reuse,
    reuse_share,
    reused_tokens,
    sharing_class,
)

QUANTILES = (50, 90, 99)
RATE_BINS = 20


def _lengths(values: list[int]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    out = {"mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max())}
    out.update({f"p{q}": float(np.percentile(arr, q)) for q in QUANTILES})
    return out


def arrival_rate(arrivals_s: list[float], bin_s: float) -> list[tuple[float, float]]:
    """(bin start s, arrivals per second in that bin) over the whole span."""
    if not arrivals_s:
        return []
    edges = np.arange(0.0, max(arrivals_s) + bin_s, bin_s)
    if len(edges) < 2:
        edges = np.array([0.0, bin_s])
    counts, _ = np.histogram(arrivals_s, bins=edges)
    return [(float(start), float(n) / bin_s) for start, n in zip(edges[:-1], counts, strict=True)]


def summarize_trace(wl: Trace, bin_s: float | None = None, cache_block: int | None = None) -> dict[str, Any]:
    """The figures ``inspect`` prints, as a JSON-ready mapping.

    ``cache_block``: the KV-cache block (tokens) the reuse is also counted at (default: the trace's own).
    """
    trace = load_trace(wl)
    arrivals = [row.at_s * wl.time_scale for row in trace.rows]
    span = arrivals[-1] if arrivals else 0.0
    width = bin_s or max(span / RATE_BINS, 1e-3)
    rates = arrival_rate(arrivals, width)
    block_size = trace.block_size if any(r.blocks for r in trace.rows) else 0
    sent = [(r.prompt_tokens, r.blocks) for r in trace.rows]
    reused = reused_tokens(sent, block_size) if block_size else [0] * len(sent)
    classes = [sharing_class(n, r.prompt_tokens) for n, r in zip(reused, trace.rows, strict=True)]
    peak = max((r for _, r in rates), default=0.0)
    mean = (len(arrivals) - 1) / span if span > 0 else None
    tree, tree_kind = None, ""
    if trace.format == "otel":
        tree, tree_kind = tree_shape(trace.source), "spans"
    elif trace.format == "mooncake" and block_size:
        tree, tree_kind = hash_tree_shape(trace.rows, block_size), "hash"
    cache = cache_block or block_size
    return {
        "tree": tree,
        "tree_kind": tree_kind,
        "source": str(trace.source),
        "format": trace.format,
        "rows_in_file": trace.rows_in_file,
        "left_out": trace.left_out,
        "requests": len(trace.rows),
        "duration_s": span,
        "time_scale": wl.time_scale,
        "mean_rate": mean,
        "peak_rate": peak,
        "peak_to_mean": peak / mean if mean else None,
        "rate_bin_s": width,
        "rate_over_time": rates,
        "prompt_tokens": _lengths([r.prompt_tokens for r in trace.rows]),
        "output_tokens": _lengths([r.output_tokens for r in trace.rows]),
        "sessions": len({r.session for r in trace.rows if r.session}),
        "block_size": block_size,
        "distinct_blocks": len({b for r in trace.rows for b in r.blocks}),
        "designed_reuse": reuse_share(sent, block_size),
        "cache_block": cache,
        "cache_block_reuse": cache_block_reuse(sent, block_size, cache) if block_size else 0.0,
        "sharing_classes": {c: classes.count(c) for c in SHARING_CLASSES},
    }


def _bar(value: float, peak: float, width: int = 40) -> str:
    return "#" * (round(width * value / peak) if peak else 0)


def render(summary: dict[str, Any]) -> str:
    """The summary as the terminal shows it."""
    s = summary
    mean = f"{s['mean_rate']:.2f}" if s["mean_rate"] is not None else "-"
    lines = [
        f"{s['source']} ({s['format']})",
        f"requests      {s['requests']} of {s['rows_in_file']} rows"
        + (f"; left out: {', '.join(f'{n} {why}' for why, n in s['left_out'].items())}" if s["left_out"] else ""),
        f"duration      {s['duration_s']:.1f} s (time_scale {s['time_scale']:g})",
        f"arrival rate  mean {mean} req/s, peak {s['peak_rate']:.2f} req/s over {s['rate_bin_s']:.1f} s bins",
    ]
    for name in ("prompt_tokens", "output_tokens"):
        d = s[name]
        lines.append(
            f"{name:13} mean {d['mean']:.0f}, p50 {d['p50']:.0f}, p90 {d['p90']:.0f}, p99 {d['p99']:.0f}, "
            f"max {d['max']:.0f}"
        )
    if s["sessions"]:
        lines.append(f"sessions      {s['sessions']}")
    if s.get("tree"):
        lines += render_hash_shape(s["tree"]) if s["tree_kind"] == "hash" else render_shape(s["tree"])
    if s["block_size"]:
        classes = ", ".join(f"{n} {c}" for c, n in s["sharing_classes"].items())
        lines.append(
            f"prefix reuse  {s['designed_reuse']:.1%} of prompt tokens repeat an earlier prefix "
            f"({s['distinct_blocks']} distinct blocks of {s['block_size']} tokens; requests: {classes})"
        )
        how = (
            "exact"
            if s["cache_block"] == s["block_size"]
            else "whole cache blocks of it; a lower bound: a block id that differs may still share its first tokens"
            if s["cache_block"] < s["block_size"]
            else "whole cache blocks of it, each reused only when all its block ids match"
        )
        lines.append(f"              {s['cache_block_reuse']:.1%} at a {s['cache_block']}-token cache block ({how})")
    else:
        lines.append("prefix reuse  none designed: the format has no block ids, every prompt is unique")
    lines.append("arrival rate over time (req/s):")
    peak = s["peak_rate"]
    lines += [f"  {start:8.1f} s {rate:7.2f} {_bar(rate, peak)}" for start, rate in s["rate_over_time"]]
    return "\n".join(lines)
