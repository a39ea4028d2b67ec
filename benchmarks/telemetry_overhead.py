"""Does sampling telemetry beside the load disturb the client's timing? Measure it.

Runs the same closed-loop plan against the reference server in vLLM's wire profile
(exactly known TTFT and inter-token gap, real ``/metrics``) through the real runner,
alternating runs without the sampler and with it (server metrics + the server's
process tree, at 1 s and, as a stress, at 0.1 s), and reports per setting the medians
over its runs of:

- TPOT P50 error against the configured gap, and ITL P99 minus the gap (jitter), in ms;
- the sampler's own cost: mean wall and CPU milliseconds per sample, and samples taken.

The sampler runs in a thread of the client's process, so its cost would show as
client-side delay on chunk timestamps. Usage::

    python benchmarks/telemetry_overhead.py [--runs 3] [--out telemetry_overhead.json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import orjson
import psutil

from bakeoff.backends.spec import load_backend
from bakeoff.campaign import runner
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.measure.client import ClientSettings
from bakeoff.observe.telemetry_series import SERIES_FILE, read_series
from bakeoff.ref.options import MODEL
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.kinds import ConcurrencySweep
from bakeoff.workloads.plans import PlannedRequest, RunPlan

TTFT_MS, ITL_MS, TOKENS, CONCURRENCY, REQUESTS = 20.0, 10.0, 64, 16, 96


def one_run(url: str, pid: int, interval_s: float | None, folder: Path) -> dict[str, float]:
    requests = [PlannedRequest(i, "completions", TOKENS, prompt=f"p {i}") for i in range(REQUESTS)]
    plan = RunPlan(
        "bench",
        "closed",
        ConcurrencySweep(levels=[1], input_len=8, output_len=8),
        concurrency=CONCURRENCY,
        requests=requests,
    )
    original = runner.probes_for
    if interval_s is None:
        runner.probes_for = lambda *a, **k: ([], [])  # type: ignore[assignment]
    try:
        target = RunTarget(
            ClientSettings(url, MODEL),
            load_backend("vllm"),
            show_progress=False,
            server_pid=pid,
            telemetry_interval_s=interval_s or 1.0,
        )
        summary = execute_plan(plan, target, folder)
    finally:
        runner.probes_for = original  # type: ignore[assignment]
    tpot, itl = summary.latency.tpot_ms.p50, summary.latency.itl_ms.p99
    out = {"tpot_err_ms": (tpot or 0.0) - ITL_MS, "itl_p99_excess_ms": (itl or 0.0) - ITL_MS}
    if (folder / SERIES_FILE).is_file():
        series = read_series(folder / SERIES_FILE)
        out |= {
            "sample_ms": float(series["sample_ms"].mean()),
            "sample_cpu_ms": float(series["sample_cpu_ms"].mean()),
            "samples": float(len(series)),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings: dict[str, float | None] = {"off": None, "1s": 1.0, "0.1s": 0.1}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    with serve_reference(profile="vllm", ttft_ms=TTFT_MS, itl_ms=ITL_MS) as url, tempfile.TemporaryDirectory() as tmp:
        pid = psutil.Process().children()[-1].pid  # the reference server
        for run in range(args.runs):
            for name, interval in settings.items():  # interleaved: drift favours no setting
                results[name].append(one_run(url, pid, interval, Path(tmp) / f"{name}-{run}"))
    report: dict[str, Any] = {}
    for name, runs in results.items():
        report[name] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    report["setup"] = {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "concurrency": CONCURRENCY, "runs": args.runs}
    text = orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
