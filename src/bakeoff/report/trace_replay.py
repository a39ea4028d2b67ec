"""The trace-replay part of the comparison report: load over time, and who kept up.

A trace's offered load changes from second to second, so its figures are time series:
offered (scheduled) against achieved (completed) request rate, and TTFT and TPOT by the
time each request was scheduled, beside the arrival rate that caused them. Latency by
prefix-sharing class says whether requests whose prefix was sent before are served faster
(they are when the server's prefix cache works). Designed reuse beside the server's hit
rate is :func:`bakeoff.report.sweeps.prefix_cache_table`, as for conversations. Kept apart from
:mod:`bakeoff.report.tables` to keep that module small; the notebook calls both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bakeoff.results.formulas import NS_PER_MS, shown, tpot_ms, ttft_ms
from bakeoff.results.layout import load_cells
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import RECORDS_PARQUET, read_records
from bakeoff.results.summary import RunSummary
from bakeoff.workloads.traces.rows import SHARING_CLASSES

TIME_BINS = 24


@dataclass
class TraceRun:
    server: str
    workload: str
    run: str
    folder: Path
    summary: RunSummary


def trace_runs(campaign_dir: Path) -> list[TraceRun]:
    """Every trace replay of the campaign, one per server and trace workload."""
    return [
        TraceRun(cell.label, cell.workload, run, cell.dir / "runs" / run, summary)
        for cell in load_cells(campaign_dir)
        for run, summary in cell.summaries.items()
        if summary.trace
    ]


def trace_table(campaign_dir: Path) -> pd.DataFrame:
    """Per server and trace: what was sent, how late, how fast it was served, what was reused."""
    rows = []
    for tr in trace_runs(campaign_dir):
        s, info = tr.summary, tr.summary.trace or {}
        pc = s.prefix_cache
        rows.append(
            {
                "server": tr.server,
                "workload": tr.workload,
                "requests": info.get("requests"),
                "ok": s.requests.ok,
                "failed": s.requests.failed,
                "clipped to context": info.get("clipped"),
                "left out": sum((info.get("left_out") or {}).values()),
                "offered req/s": info.get("offered_rate"),
                "achieved req/s": s.throughput.req_s,
                "send lateness P99 ms": shown(s.queue_delay_ms, "p99") if s.queue_delay_ms else None,
                "TTFT P50 ms": shown(s.latency.ttft_ms, "p50"),
                "TTFT P99 ms": shown(s.latency.ttft_ms, "p99"),
                "TPOT P50 ms": shown(s.latency.tpot_ms, "p50"),
                "designed reuse": pc.designed_reuse if pc else None,
                "server hit rate": pc.server_hit_rate if pc else None,
            }
        )
    return pd.DataFrame(rows).round(3)


def sharing_class_table(campaign_dir: Path) -> pd.DataFrame:
    """Latency by prefix-sharing class: how much of each request's prompt an earlier one sent."""
    rows = []
    for tr in trace_runs(campaign_dir):
        for group in SHARING_CLASSES:
            block = tr.summary.by_group.get(group)
            if block is None:
                continue
            rows.append(
                {
                    "server": tr.server,
                    "workload": tr.workload,
                    "prefix shared": group,
                    "n": block.ttft_ms.n,
                    "TTFT P50 ms": shown(block.ttft_ms, "p50"),
                    "TTFT P99 ms": shown(block.ttft_ms, "p99"),
                    "TPOT P50 ms": shown(block.tpot_ms, "p50"),
                    "E2E P50 ms": shown(block.e2e_ms, "p50"),
                }
            )
    return pd.DataFrame(rows).round(2)


def timeline(records: list[RequestRecord], bin_s: float | None = None) -> pd.DataFrame:
    """Per time bin of a replay: offered and achieved req/s, TTFT and TPOT P50 of its arrivals.

    Time is seconds after the first scheduled send. Offered counts requests scheduled in a
    bin, achieved those that completed in it; latency belongs to the bin a request was
    scheduled in, so a burst and the latency it caused line up.
    """
    measured = [r for r in records if not r.warmup and r.scheduled_ns]
    if not measured:
        return pd.DataFrame(columns=["t_s", "offered_rps", "achieved_rps", "ttft_p50_ms", "tpot_p50_ms"])
    origin = min(r.scheduled_ns for r in measured)
    sched = np.array([(r.scheduled_ns - origin) / 1e9 for r in measured])
    ends = np.array([(r.end_ns - origin) / 1e9 for r in measured if r.ok])
    span = max(float(sched.max()), float(ends.max()) if ends.size else 0.0)
    width = bin_s or max(span / TIME_BINS, 1e-3)
    edges = np.arange(0.0, span + width, width)
    if edges.size < 2:
        edges = np.array([0.0, width])
    offered, _ = np.histogram(sched, bins=edges)
    achieved, _ = np.histogram(ends, bins=edges)
    which = np.clip(np.digitize(sched, edges) - 1, 0, edges.size - 2)
    ttft: list[list[float]] = [[] for _ in range(edges.size - 1)]
    tpot: list[list[float]] = [[] for _ in range(edges.size - 1)]
    for index, r in zip(which, measured, strict=True):
        if r.ok and (first := ttft_ms(r)) is not None:
            ttft[index].append(first)
        if r.ok and (step := tpot_ms(r)) is not None:
            tpot[index].append(step)
    return pd.DataFrame(
        {
            "t_s": edges[:-1],
            "offered_rps": offered / width,
            "achieved_rps": achieved / width,
            "ttft_p50_ms": [float(np.median(v)) if v else np.nan for v in ttft],
            "tpot_p50_ms": [float(np.median(v)) if v else np.nan for v in tpot],
        }
    )


def lateness_ms(records: list[RequestRecord]) -> list[float]:
    """How late each measured request was sent after its scheduled time."""
    return [(r.start_ns - r.scheduled_ns) / NS_PER_MS for r in records if not r.warmup and r.scheduled_ns]


def _timelines(campaign_dir: Path, workload: str, bin_s: float | None) -> pd.DataFrame:
    frames = []
    for tr in trace_runs(campaign_dir):
        path = tr.folder / RECORDS_PARQUET
        if tr.workload != workload or not path.is_file():
            continue
        frame = timeline(read_records(path), bin_s)
        frame["server"] = tr.server
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def trace_figure(campaign_dir: Path, workload: str, bin_s: float | None = None) -> Any:
    """Offered vs achieved rate, and TTFT / TPOT over time beside the arrival rate, per server."""
    import matplotlib.pyplot as plt  # deferred: only the figures need the plotting libraries
    import seaborn as sns

    data = _timelines(campaign_dir, workload, bin_s)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    if data.empty:
        plt.close(fig)
        return fig
    servers = sorted(data["server"].unique())
    palette = dict(zip(servers, sns.color_palette(n_colors=len(servers)), strict=True))  # one colour per server
    # The schedule is the same for every server: the offered rate is drawn once, in grey.
    offered = data[data["server"] == servers[0]]
    axes[0].plot(offered["t_s"], offered["offered_rps"], color="0.4", linestyle="--", label="offered")
    sns.lineplot(data=data, x="t_s", y="achieved_rps", hue="server", palette=palette, ax=axes[0], marker="o")
    for ax, column, title in ((axes[1], "ttft_p50_ms", "TTFT P50 ms"), (axes[2], "tpot_p50_ms", "TPOT P50 ms")):
        sns.lineplot(data=data, x="t_s", y=column, hue="server", palette=palette, ax=ax, marker="o")
        ax.set_ylabel(title)
        rate = ax.twinx()
        rate.fill_between(offered["t_s"], offered["offered_rps"], step="post", color="0.85", zorder=0)
        rate.set_ylabel("arrivals req/s (grey)")
        ax.set_zorder(rate.get_zorder() + 1)
        ax.patch.set_visible(False)
    axes[0].set_ylabel("req/s")
    titles = ("offered (dashed) vs completed req/s", "TTFT by scheduled time", "TPOT by scheduled time")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("s since the first scheduled request")
        ax.grid(alpha=0.3)
    fig.suptitle(f"trace replay: {workload}")
    fig.tight_layout()
    plt.close(fig)  # shown once, by the notebook's display()
    return fig
