"""Planted campaign folders for the verdict tests: repeat values chosen by the test, so outcomes are known.

A folder written here has the layout ``campaign run`` writes (campaign.yaml, cells/CELL/cell.json,
runs/RUN/summary.json), one cell per server and repeat of workload ``sweep``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bakeoff.results.store import write_json, write_summary
from bakeoff.results.summary import (
    HostLoad,
    Latency,
    Requests,
    RunSummary,
    SloResult,
    Stat,
    Throughput,
    Tokens,
    WorkloadInfo,
)


def run(
    tok_s: float,
    *,
    concurrency: int = 4,
    repeat: int = 1,
    p99_ttft: float = 100.0,
    n: int = 200,
    e2e_p50: float = 1000.0,
    host: HostLoad | None = None,
) -> RunSummary:
    """One repeat of a closed-loop run: ``tok_s`` output tok/s, goodput a tenth of it, TTFT P99 ``p99_ttft``."""
    ttft = Stat(n=n, mean=50.0, p50=50.0, p99=p99_ttft)
    e2e = Stat(n=n, mean=e2e_p50, p50=e2e_p50, p99=e2e_p50 * 1.2)
    return RunSummary(
        requests=Requests(ok=n, failed=0),
        latency=Latency(ttft_ms=ttft, tpot_ms=Stat(n=n, p50=10.0, p99=12.0), e2e_ms=e2e),
        throughput=Throughput(output_tok_s=tok_s, total_tok_s=tok_s, req_s=tok_s / 10, window_s=10.0),
        tokens=Tokens(prompt=0, completion=0),
        slo=SloResult(ttft_ms=500.0, met=n, attainment=1.0, goodput_req_s=tok_s / 10),
        workload=WorkloadInfo(run=f"c{concurrency}", mode="closed", concurrency=concurrency, repeat=repeat),
        host=host,
    )


def campaign(
    tmp_path: Path,
    runs: dict[str, dict[int, list[float]]],
    backends: dict[str, str] | None = None,
    busy: dict[tuple[str, int], HostLoad] | None = None,
    samples: int = 200,
    **spec: object,
) -> Path:
    """server -> concurrency -> output tok/s of each repeat, as a campaign folder (backend x unless named).

    ``busy``: (server, repeat) -> the host load that run was measured under; ``samples``: requests per run.
    """
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump({"name": "t", "slo": {"ttft_ms": 500}, **spec}))
    for server, by_level in runs.items():
        for level, values in by_level.items():
            for repeat, tok_s in enumerate(values, start=1):
                folder = tmp_path / "cells" / (f"{server}__sweep" + (f"__r{repeat}" if repeat > 1 else ""))
                backend = (backends or {}).get(server, "x")
                info = {"server": {"label": server}, "backend": backend, "workload": "sweep", "repeat": repeat}
                write_json(folder / "cell.json", info)
                slow = 900.0 if level == 16 and server == "b" else 100.0  # b misses the SLO at 16
                host = (busy or {}).get((server, repeat))
                summary = run(tok_s, concurrency=level, repeat=repeat, p99_ttft=slow, host=host, n=samples)
                write_summary(folder / "runs" / f"c{level}" / "summary.json", summary)
    return tmp_path
