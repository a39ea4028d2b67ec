"""The rendered report in headless Chromium: self-contained, every image decoded, no console error.

A small campaign against the reference server speaking vLLM's wire protocol (its
``/metrics`` gives the telemetry series) is run end to end, and the HTML it renders is
opened with the network cut off (tests/browser.py: a script in the page records console
errors, uncaught errors and every resource fetched, and ``--dump-dom`` prints what it saw).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

import prerequisites
from bakeoff.campaign.execute import run_campaign
from browser import open_in_chromium

BACKEND = """\
name: refvllm-{label}
display_name: reference server in vLLM's wire profile (test)
runtime: process
accelerator: cpu
command: ["{python}", "-m", "bakeoff.ref.server", "--port", "{port}", "--model", "{served_model_name}",
          "--profile", "vllm", "--ttft-ms", "5", "--itl-ms", "{itl}"]
health: {path: /health, timeout_s: 20, interval_s: 0.1}
metrics:
  path: /metrics
  names:
    running: "vllm:num_requests_running"
    waiting: "vllm:num_requests_waiting"
    kv_cache_usage: "vllm:kv_cache_usage_perc"
    generation_tokens: "vllm:generation_tokens_total"
cache_reset: {kind: none}
"""


def campaign(model: Path) -> str:
    return f"""\
name: browser-check
model: {{path: {model}, served_name: m}}
servers:
  - {{backend: refvllm-fast, label: fast}}
  - {{backend: refvllm-slow, label: slow}}
workloads:
  - {{kind: concurrency, name: sweep, levels: [1, 4], requests_per_level: 8, min_duration_s: 0, warmup_requests: 1,
      input_len: 16, output_len: 16}}
slo: {{ttft_ms: 500, tpot_ms: 50}}
repeats: 1
measure_warm_restart: false
"""


def test_report_opens_in_chromium_self_contained_with_every_figure(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prerequisites.chromium()
    (tmp_path / "backends").mkdir()
    for label, itl in (("fast", "8"), ("slow", "16")):
        # {python}, {port} and {served_model_name} are the launcher's to fill in.
        spec = BACKEND.replace("{label}", label).replace("{itl}", itl)
        (tmp_path / "backends" / f"refvllm-{label}.yaml").write_text(spec)
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.setenv("BAKEOFF_HISTORY", str(tmp_path / "history"))  # the archive of this run stays in tmp
    path = tmp_path / "c.yaml"
    path.write_text(campaign(tiny_model))
    report = run_campaign(path, out_dir=tmp_path / "out")
    series = sorted((tmp_path / "out" / "cells").rglob("telemetry.parquet"))
    assert len(series) == 4  # two servers x two levels, each with its series

    seen = open_in_chromium(report, tmp_path)
    assert seen["errors"] == [], seen["errors"]
    assert seen["fetched"] == [], "the report must not reach the network"
    assert seen["undecoded"] == [] and isinstance(seen["images"], int) and seen["images"] >= 3
    headings = " | ".join(str(h) for h in seen["headings"])  # type: ignore[attr-defined]
    # The report opens with its verdict (two servers swept: one is drawn); the findings follow.
    assert "Verdict" in headings and "Findings" in headings
    assert headings.index("Verdict") < headings.index("Findings")
    assert "Pareto front" in headings and "Tuning advice" in headings
    assert "Server telemetry" in report.read_text()


def test_a_page_that_links_a_local_file_is_not_self_contained(tmp_path: Path) -> None:
    """The check itself: a figure linked from disk (beside the page, or by a file: URL) counts as
    fetched, as a network one would; only data: and blob: URLs are inside the page."""
    pixel = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    )
    (tmp_path / "beside.png").write_bytes(pixel)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "absolute.png").write_bytes(pixel)
    inline = "data:image/png;base64," + base64.b64encode(pixel).decode()
    page = tmp_path / "page.html"
    page.write_text(
        "<html><head><title>t</title></head><body><h1>Report</h1>"
        f'<img src="beside.png"><img src="{(tmp_path / "elsewhere" / "absolute.png").as_uri()}">'
        f'<img src="{inline}"></body></html>'
    )
    seen = open_in_chromium(page, tmp_path)
    fetched = sorted(str(u) for u in seen["fetched"])  # type: ignore[attr-defined]
    assert fetched == [(tmp_path / "beside.png").as_uri(), (tmp_path / "elsewhere" / "absolute.png").as_uri()]
    assert seen["images"] == 3 and seen["undecoded"] == [] and seen["errors"] == []
