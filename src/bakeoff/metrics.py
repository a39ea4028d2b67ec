"""Metrics from raw request records, exactly as the report glossary defines them.

- TTFT: request sent -> first chunk carrying generated content (role-only chunks excluded).
- TTFB: request sent -> first SSE event of any kind (what some tools call TTFT).
- E2E: request sent -> end of stream.
- TPOT: (E2E - TTFT) / (output tokens - 1), output tokens from the server's usage.
- ITL: gaps between consecutive content chunks; per token: each gap / tokens in its chunk.
- Throughput over the measured window (first send -> last end of measured requests):
  output tok/s, total tok/s, req/s; tok/s per user = 1000 / TPOT ms;
  goodput = requests meeting every SLO bound per second.
- Short completions: requests that ended, without error, before the ``max_tokens`` the
  plan asked for (counted from the server's usage). ``ignore_eos`` does not cover every
  end-of-sequence id on every server and model, so a run can come out shorter than
  planned; such a run carries a warning, since its throughput is not the planned load's.
Failed requests are counted by kind and excluded from latency statistics, never dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import numpy as np

from bakeoff.records import RequestRecord
from bakeoff.specs import Slo

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}
NS_PER_MS = 1e6


def stats(values: Iterable[float]) -> dict[str, float | None]:
    """Mean and the standard percentiles; all None when there are no values."""
    arr = np.fromiter(values, dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, **dict.fromkeys(PERCENTILES)} | {"count": 0}
    pct = np.percentile(arr, list(PERCENTILES.values()))
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    out.update({k: float(v) for k, v in zip(PERCENTILES, pct, strict=True)})
    out["count"] = int(arr.size)
    return out


def ttft_ms(r: RequestRecord) -> float | None:
    return (r.first_token_ns - r.start_ns) / NS_PER_MS if r.first_token_ns else None


def ttfb_ms(r: RequestRecord) -> float | None:
    return (r.first_event_ns - r.start_ns) / NS_PER_MS if r.first_event_ns else None


def e2e_ms(r: RequestRecord) -> float:
    return (r.end_ns - r.start_ns) / NS_PER_MS


def tpot_ms(r: RequestRecord) -> float | None:
    first = ttft_ms(r)
    if first is None or r.completion_tokens < 2:
        return None
    return (e2e_ms(r) - first) / (r.completion_tokens - 1)


def itl_ms(r: RequestRecord) -> list[float]:
    ns = r.chunk_ns
    return [(b - a) / NS_PER_MS for a, b in pairwise(ns)]


def itl_per_token_ms(r: RequestRecord) -> list[float]:
    """Each gap divided by the tokens the later chunk carried (several-token chunks)."""
    gaps = itl_ms(r)
    tokens = r.chunk_tokens[1:] if len(r.chunk_tokens) == len(r.chunk_ns) else [1] * len(gaps)
    return [g / t for g, t in zip(gaps, tokens, strict=True) if t > 0]


def meets_slo(r: RequestRecord, slo: Slo) -> bool:
    if not r.ok:
        return False
    checks = ((slo.ttft_ms, ttft_ms(r)), (slo.tpot_ms, tpot_ms(r)), (slo.e2e_ms, e2e_ms(r)))
    return all(bound is None or (value is not None and value <= bound) for bound, value in checks)


def window_s(records: list[RequestRecord]) -> float:
    if not records:
        return 0.0
    start = min(r.start_ns for r in records)
    end = max(r.end_ns for r in records)
    return max(end - start, 1) / 1e9


def latency_block(ok: list[RequestRecord]) -> dict[str, Any]:
    tpots = [t for t in map(tpot_ms, ok) if t is not None]
    return {
        "ttft_ms": stats(v for v in map(ttft_ms, ok) if v is not None),
        "ttfb_ms": stats(v for v in map(ttfb_ms, ok) if v is not None),
        "tpot_ms": stats(tpots),
        "itl_ms": stats(g for r in ok for g in itl_ms(r)),
        "itl_per_token_ms": stats(g for r in ok for g in itl_per_token_ms(r)),
        "e2e_ms": stats(map(e2e_ms, ok)),
        "tok_s_per_user": stats(1000.0 / t for t in tpots if t > 0),
    }


def summarize(records: list[RequestRecord], slo: Slo | None = None) -> dict[str, Any]:
    """The ``summary.json`` body for one run; warm-up records are left out."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    seconds = window_s(measured)
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    summary: dict[str, Any] = {
        "requests": {
            "ok": len(ok),
            "failed": len(failed),
            "warmup": len(records) - len(measured),
            "failed_by_kind": dict(Counter(str(r.error_kind) for r in failed)),
        },
        **latency_block(ok),
        "throughput": {
            "output_tok_s": out_tokens / seconds if seconds else 0.0,
            "total_tok_s": (out_tokens + in_tokens) / seconds if seconds else 0.0,
            "req_s": len(ok) / seconds if seconds else 0.0,
            "window_s": seconds,
        },
        "tokens": {
            "prompt": in_tokens,
            "completion": out_tokens,
            "usage_sources": dict(Counter(r.usage_source for r in ok)),
            "chunks_per_output_token": (sum(len(r.chunk_ns) for r in ok) / out_tokens if out_tokens else None),
        },
        "short_completions": short_completions(ok),
    }
    scheduled = [r for r in measured if r.scheduled_ns]
    if scheduled:
        summary["queue_delay_ms"] = stats((r.start_ns - r.scheduled_ns) / NS_PER_MS for r in scheduled)
    if slo is not None and any(v is not None for v in slo.model_dump().values()):
        good = sum(meets_slo(r, slo) for r in measured)
        summary["slo"] = {
            **slo.model_dump(),
            "met": good,
            "attainment": good / len(measured) if measured else 0.0,
            "goodput_req_s": good / seconds if seconds else 0.0,
        }
    groups = sorted({r.group for r in ok if r.group and r.turn < 0})
    if groups:
        summary["by_group"] = {g: latency_block([r for r in ok if r.group == g]) for g in groups}
    turns = sorted({r.turn for r in ok if r.turn >= 0})
    if turns:
        summary["ttft_ms_by_turn"] = {
            str(t): stats(v for r in ok if r.turn == t if (v := ttft_ms(r)) is not None)["p50"] for t in turns
        }
    return summary


def short_completions(ok: list[RequestRecord]) -> dict[str, Any]:
    """How many completed requests fell short of their planned output, with a warning if any.

    Only requests with a planned length and a server token count are checked (``checked``).
    """
    checked = [r for r in ok if r.max_tokens > 0 and r.usage_source == "server"]
    short = [r for r in checked if r.short]
    planned = sum(r.max_tokens for r in checked)
    missing = sum(r.max_tokens - r.completion_tokens for r in short)
    warning = None
    if short:
        warning = (
            f"{len(short)} of {len(checked)} requests ended before their planned max_tokens "
            f"({missing} of {planned} planned output tokens not generated): an end-of-sequence id "
            "that ignore_eos does not cover stopped them. Send min_tokens (request.min_tokens: true "
            "in the backend YAML) if the server accepts it, or compare these runs as shorter ones."
        )
    return {
        "checked": len(checked),
        "count": len(short),
        "share": len(short) / len(checked) if checked else 0.0,
        "tokens_missing": missing,
        "tokens_planned": planned,
        "warning": warning,
    }


def cost_per_million_tokens(cost_per_hour_usd: float | None, output_tok_s: float) -> float | None:
    """Dollars per million output tokens at the measured throughput."""
    if cost_per_hour_usd is None or output_tok_s <= 0:
        return None
    return cost_per_hour_usd / (output_tok_s * 3600.0) * 1e6
