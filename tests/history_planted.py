"""Planted campaign folders for the history and compare tests: known values, known intervals.

A folder written here has the layout ``campaign run`` writes (campaign.yaml, cells/CELL/
cell.json, runs/RUN/summary.json and run.json), with the numbers the test chose, so a
verdict can be checked against what was planted rather than against a measurement.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from bakeoff.results.store import write_json, write_summary
from bakeoff.results.summary import (
    Latency,
    Provenance,
    Requests,
    RunSummary,
    Stat,
    Throughput,
    Tokens,
    WorkloadInfo,
)

T0 = dt.datetime(2026, 1, 5, 2, 0, tzinfo=dt.UTC)


def summary(
    tpot_ms: float,
    tok_s: float,
    *,
    started: dt.datetime = T0,
    version: str = "0.31.0",
    digest: str = "sha256:aaa",
    repeat: int = 1,
    n: int = 200,
) -> RunSummary:
    """One repeat of a run with TPOT P50 ``tpot_ms`` and ``tok_s`` output tok/s, ``n`` requests measured."""
    return RunSummary(
        requests=Requests(ok=n, failed=0),
        latency=Latency(
            tpot_ms=Stat(n=n, mean=tpot_ms, p50=tpot_ms, p90=tpot_ms * 1.1, p99=tpot_ms * 1.2),
            ttft_ms=Stat(n=n, mean=50.0, p50=50.0, p99=80.0),
            e2e_ms=Stat(n=n, mean=1000.0, p50=1000.0, p99=1500.0),
        ),
        throughput=Throughput(output_tok_s=tok_s, total_tok_s=tok_s * 2, req_s=tok_s / 64, window_s=30.0),
        tokens=Tokens(prompt=200 * 256, completion=200 * 64),
        workload=WorkloadInfo(run="c8", mode="closed", concurrency=8, repeat=repeat),
        provenance=Provenance(
            started_at=(started + dt.timedelta(minutes=repeat)).isoformat(),
            finished_at=(started + dt.timedelta(minutes=repeat, seconds=50)).isoformat(),
            framework_version=version,
            image="vllm/vllm-openai:v0.31.0",
            image_digest=digest,
            machine="1x NVIDIA H200 (driver 570.86)",
        ),
    )


def repeats(tpot_ms: float, tok_s: float, noise: float = 0.005, **kwargs: Any) -> list[RunSummary]:
    """Three repeats spread +-``noise`` (a share) around the planted values: what the interval sees."""
    return [
        summary(tpot_ms * (1 + f * noise), tok_s * (1 - f * noise), repeat=i, **kwargs)
        for i, f in enumerate((-1.0, 0.0, 1.0), start=1)
    ]


def campaign_folder(
    folder: Path,
    runs: dict[str, list[RunSummary]],
    *,
    name: str = "nightly",
    regression: dict[str, Any] | None = None,
    knobs: dict[str, Any] | None = None,
    quality: dict[str, dict[str, float | None]] | None = None,
) -> Path:
    """A campaign folder: per server label in ``runs``, a cell per repeat (workload ``w``, run ``c8``)."""
    body: dict[str, Any] = {"name": name, "model": {"hf_id": "org/model"}, "servers": [], "workloads": []}
    if regression is not None:
        body["regression"] = regression
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "campaign.yaml").write_text(yaml.safe_dump(body))
    for label, repeated in runs.items():
        for run in repeated:
            r = run.workload.repeat
            cell = folder / "cells" / (f"{label}__w" if r == 1 else f"{label}__w__r{r}")
            server = {"label": label, "backend": "vllm", "knobs": knobs or {"max_num_seqs": 64}}
            write_json(
                cell / "cell.json",
                {"server": server, "backend": "vllm", "workload": "w", "repeat": r, "status": "ok"},
            )
            run_dir = cell / "runs" / "c8"
            write_summary(run_dir / "summary.json", run)
            write_json(
                run_dir / "run.json",
                {
                    "server": {"backend": "vllm", "label": label, "knobs": server["knobs"], "image_digest": "x"},
                    "machine": {"hostname": "gpu1", "gpu": "NVIDIA H200", "gpu_count": 1, "gpu_driver": "570.86"},
                    "started_at": run.provenance.started_at,
                },
            )
            if quality and label in quality:
                write_json(cell / "quality.json", {"rates": quality[label], "answers": []})
    return folder
