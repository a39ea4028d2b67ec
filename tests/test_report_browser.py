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
from browser import WINDOW, open_in_chromium, screenshot

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
repeats: 2
measure_warm_restart: false
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> tuple[Path, dict[str, object]]:
    """A two-server, two-level, two-round campaign against the reference server, rendered and opened once."""
    prerequisites.chromium()
    tmp_path = tmp_path_factory.mktemp("browser")
    (tmp_path / "backends").mkdir()
    for label, itl in (("fast", "8"), ("slow", "16")):
        # {python}, {port} and {served_model_name} are the launcher's to fill in.
        spec = BACKEND.replace("{label}", label).replace("{itl}", itl)
        (tmp_path / "backends" / f"refvllm-{label}.yaml").write_text(spec)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BAKEOFF_BACKENDS_DIR", str(tmp_path / "backends"))
        env.setenv("BAKEOFF_HISTORY", str(tmp_path / "history"))  # the archive of this run stays in tmp
        path = tmp_path / "c.yaml"
        path.write_text(campaign(tiny_model))
        report = run_campaign(path, out_dir=tmp_path / "out", cell_notebooks=False)  # the report is under test
    return report, open_in_chromium(report, tmp_path)


def test_report_opens_in_chromium_self_contained_with_every_figure(rendered: tuple[Path, dict[str, object]]) -> None:
    report, seen = rendered
    series = sorted((report.parent / "cells").rglob("telemetry.parquet"))
    assert len(series) == 8  # two servers x two levels x two rounds, each with its series
    assert seen["errors"] == [], seen["errors"]
    assert seen["fetched"] == [], "the report must not reach the network"
    assert seen["undecoded"] == [] and isinstance(seen["images"], int) and seen["images"] >= 4
    headings = " | ".join(str(h) for h in seen["headings"])  # type: ignore[attr-defined]
    # The report opens with its decision, then the evidence: the verdict in full before the findings.
    assert headings.index("The decision") < headings.index("The evidence") < headings.index("Verdict")
    assert headings.index("Verdict") < headings.index("Findings")
    assert "Pareto front" in headings and "Tuning advice" in headings
    assert "Server telemetry" in report.read_text()
    # The per-run table is one click away, not a screen of rows; energy, measured nowhere, is one line.
    html = report.read_text()
    assert "<details><summary><b>Every run: the headline figures</b> (8 rows)" in html
    assert html.count("Energy not measured in any run") == 2  # the first screen's note and the energy section's


def test_the_first_screen_shows_the_decision_and_its_chart(
    rendered: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    report, seen = rendered
    viewport, boxes = seen["viewport"], seen["boxes"]
    assert isinstance(viewport, dict) and isinstance(boxes, dict)
    assert viewport["width"] == WINDOW[0], viewport
    fold = viewport["height"]
    # The verdict, the headline chart and what to try next all end within the window's first screen.
    for part in ("bakeoff-answer", "bakeoff-headline-chart", "bakeoff-next"):
        assert part in boxes, sorted(boxes)
        assert 0 < boxes[part]["bottom"] <= fold, (part, boxes[part], fold)
    # Side by side at this width: the chart is no thumbnail, and starts level with the answer.
    chart, answer = boxes["bakeoff-headline-chart"], boxes["bakeoff-answer"]
    assert chart["width"] >= 400 and abs(chart["top"] - answer["top"]) < 200, (chart, answer)
    # The answer names the faster server (half the inter-token gap) as the pick at every load, never the slower.
    rows = answer["text"]
    assert "concurrency 1" in rows and "concurrency 4" in rows and "slow wins" not in rows
    assert rows.count("fast") >= 2, rows
    assert "Which of fast, slow serves" in boxes["bakeoff-decision"]["text"]
    png = screenshot(report, tmp_path / "first-screen.png", tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
