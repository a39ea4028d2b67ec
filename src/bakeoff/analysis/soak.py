"""A soak run read back window by window, and its trends judged (:mod:`bakeoff.analysis.drift`).

A soak (:class:`bakeoff.workloads.kinds.Soak`) is one long run; this module cuts it into
consecutive windows of ``window_s`` and gives each (:class:`SoakWindow`):

- throughput: output tok/s from the chunks that arrived in it, requests/s that ended in it;
- latency of the requests *sent* in it (from the scheduled time in open loop): P50 and P99 of
  TTFT and TPOT, each with its n (P99 of a few dozen requests is near their maximum: read n);
- failures by kind, preemptions (the server's counter over the window);
- memory: the engine's (its process tree's RSS on CPU, NVML used on its pinned GPUs; the
  window's mean), the KV pool's usage, and what the weights plus the KV pool do not account
  for (:class:`bakeoff.results.memory.MemoryAccount`): ``unaccounted = memory - weights - pool``.

Records and telemetry each count from their own start (the series opens just before the
first measured request, milliseconds apart), so windows of tens of seconds line up.

:func:`soak_result` judges the trends over the windows after ``settle_windows``: P99 TTFT and
P99 TPOT against ``latency_margin`` x their mean, the unaccounted memory against
``memory_margin`` x the engine's mean memory. The report's soak section
(:mod:`bakeoff.report.soak`) and the advisor's ``max_model_len`` cap read these.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bakeoff.analysis.drift import Trend, trend
from bakeoff.observe.telemetry_series import SERIES_FILE, read_series
from bakeoff.results.formulas import latency_origin_ns, nearest_rank, tpot_ms, ttft_ms
from bakeoff.results.memory import MEMORY_FILE, MemoryAccount, read_memory
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import RECORDS_PARQUET, SUMMARY, read_records, read_summary

_MEMORY_COLUMN = {"rss": "rss_bytes", "nvml": "gpu_mem_used_bytes"}


class SoakWindow(BaseModel):
    """One window of a soak: what was sent in it and what the server held meanwhile."""

    index: int
    start_s: float
    end_s: float
    sent: int
    output_tok_s: float
    req_s: float
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    ttft_n: int = 0
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    tpot_n: int = 0
    failures: dict[str, int] = {}
    preemptions: float | None = None
    memory_bytes: float | None = None
    kv_usage: float | None = None
    unaccounted_bytes: float | None = None

    @property
    def mid_s(self) -> float:
        return (self.start_s + self.end_s) / 2


class SoakResult(BaseModel):
    """A soak run's windows, its memory account and its trends."""

    window_s: float
    settle_windows: int
    windows: list[SoakWindow]
    account: MemoryAccount | None = None
    trends: list[Trend] = []

    def trend_of(self, metric: str) -> Trend | None:
        return next((t for t in self.trends if t.metric == metric), None)


P99_TTFT = "P99 TTFT"
P99_TPOT = "P99 TPOT"
UNACCOUNTED = "unaccounted memory"


def _p(values: list[float], percentile: float) -> float | None:
    return nearest_rank(values, percentile) if values else None


def windows(
    records: list[RequestRecord],
    window_s: float,
    series: Any = None,
    account: MemoryAccount | None = None,
    duration_s: float | None = None,
) -> list[SoakWindow]:
    """Cut a soak's measured records (and its telemetry frame, if any) into windows of ``window_s``.

    ``duration_s``: the soak's planned length; the windows stop there (the tail of requests still
    decoding after it belongs to no window), or earlier where the run was cut short.
    """
    measured = [r for r in records if not r.warmup]
    if not measured or window_s <= 0:
        return []
    origin = min(latency_origin_ns(r) for r in measured)
    last = max(latency_origin_ns(r) for r in measured)
    count = math.floor((last - origin) / 1e9 / window_s) + 1
    if duration_s is not None:
        count = min(count, max(math.floor(duration_s / window_s + 1e-9), 1))
    out = []
    for k in range(count):
        lo_ns, hi_ns = origin + int(k * window_s * 1e9), origin + int((k + 1) * window_s * 1e9)
        sent = [r for r in measured if lo_ns <= latency_origin_ns(r) < hi_ns]
        ok = [r for r in sent if r.ok]
        ttft = [v for r in ok if (v := ttft_ms(r)) is not None]
        tpot = [v for r in ok if (v := tpot_ms(r)) is not None]
        tokens = sum(_tokens_between(r, lo_ns, hi_ns) for r in measured if r.ok)
        ended = sum(1 for r in measured if lo_ns <= r.end_ns < hi_ns)
        window = SoakWindow(
            index=k,
            start_s=k * window_s,
            end_s=(k + 1) * window_s,
            sent=len(sent),
            output_tok_s=tokens / window_s,
            req_s=ended / window_s,
            ttft_p50_ms=_p(ttft, 50),
            ttft_p99_ms=_p(ttft, 99),
            ttft_n=len(ttft),
            tpot_p50_ms=_p(tpot, 50),
            tpot_p99_ms=_p(tpot, 99),
            tpot_n=len(tpot),
            failures=dict(Counter(str(r.error_kind) for r in sent if not r.ok)),
        )
        if series is not None:
            _add_telemetry(window, series, account)
        out.append(window)
    return out


def _tokens_between(r: RequestRecord, lo_ns: int, hi_ns: int) -> float:
    """Output tokens of ``r`` whose chunks arrived in [lo, hi), by the chunks' token shares."""
    shares = r.chunk_tokens if len(r.chunk_tokens) == len(r.chunk_ns) else [1] * len(r.chunk_ns)
    total = sum(shares)
    if not total:
        return 0.0
    inside = sum(t for at, t in zip(r.chunk_ns, shares, strict=True) if lo_ns <= at < hi_ns)
    return r.completion_tokens * inside / total


def _add_telemetry(window: SoakWindow, series: Any, account: MemoryAccount | None) -> None:
    rows = series[(series["t_s"] >= window.start_s) & (series["t_s"] < window.end_s)]
    if rows.empty:
        return
    if "preemptions" in rows and rows["preemptions"].notna().any():
        before = series[series["t_s"] < window.start_s]["preemptions"].dropna()
        start = float(before.iloc[-1]) if not before.empty else float(rows["preemptions"].dropna().iloc[0])
        window.preemptions = max(float(rows["preemptions"].dropna().iloc[-1]) - start, 0.0)
    if "kv_cache_usage" in rows and rows["kv_cache_usage"].notna().any():
        window.kv_usage = float(rows["kv_cache_usage"].mean())
    column = _MEMORY_COLUMN.get(account.source) if account is not None else None
    if column is None:
        column = next((c for c in ("gpu_mem_used_bytes", "rss_bytes") if c in rows), None)
    if column is not None and column in rows and rows[column].notna().any():
        window.memory_bytes = float(rows[column].mean())
        accounted = account.accounted_bytes if account is not None else None
        if accounted is not None:
            window.unaccounted_bytes = window.memory_bytes - accounted


def judge(found: list[SoakWindow], settle_windows: int, latency_margin: float, memory_margin: float) -> list[Trend]:
    """The trends of P99 TTFT, P99 TPOT and the unaccounted memory over the settled windows."""
    judged = found[settle_windows:]
    times = [w.mid_s for w in judged]
    trends = []
    for metric, values in ((P99_TTFT, [w.ttft_p99_ms for w in judged]), (P99_TPOT, [w.tpot_p99_ms for w in judged])):
        present = [v for v in values if v is not None]
        margin = latency_margin * (sum(present) / len(present)) if present else 0.0
        trends.append(trend(metric, "ms", times, values, margin))
    memory = [w.memory_bytes for w in judged if w.memory_bytes is not None]
    if memory:
        margin = memory_margin * sum(memory) / len(memory) / 2**20
        unaccounted = [None if w.unaccounted_bytes is None else w.unaccounted_bytes / 2**20 for w in judged]
        trends.append(trend(UNACCOUNTED, "MiB", times, unaccounted, margin))
    return trends


def is_soak(spec: dict[str, Any] | None) -> bool:
    return bool(spec) and spec is not None and spec.get("kind") == "soak"


def soak_result(run_dir: Path) -> SoakResult | None:
    """A soak run folder read back (None for a run of another kind, or one without records)."""
    summary_path, records_path = run_dir / SUMMARY, run_dir / RECORDS_PARQUET
    if not summary_path.is_file() or not records_path.is_file():
        return None
    summary = read_summary(summary_path)
    spec = summary.workload.spec if summary.workload is not None else None
    if not is_soak(spec):
        return None
    assert spec is not None
    window_s, settle = float(spec["window_s"]), int(spec.get("settle_windows", 1))
    account = read_memory(run_dir / MEMORY_FILE) if (run_dir / MEMORY_FILE).is_file() else None
    series = read_series(run_dir / SERIES_FILE) if (run_dir / SERIES_FILE).is_file() else None
    found = windows(read_records(records_path), window_s, series, account, float(spec["duration_s"]))
    trends = judge(found, settle, float(spec.get("latency_margin", 0.10)), float(spec.get("memory_margin", 0.02)))
    return SoakResult(window_s=window_s, settle_windows=settle, windows=found, account=account, trends=trends)
