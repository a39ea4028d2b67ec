"""Prefix-cache accounting of a run end to end against a server with SGLang's accounting.

Each test here failed before its fix: requests without ``prompt_tokens_details`` dropped
out of ``cached_tokens_ratio``; the server hit rate came from the last-batch gauge; the
counters' "before" snapshot was taken before warm-up; a refused cache reset passed as a
cold cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.campaign.runner import RunTarget, execute_plan, prefix_cache_block
from bakeoff.measure.client import ClientSettings
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import RUN_INFO, read_json
from bakeoff.results.summary import RunSummary
from bakeoff.workloads.kinds import MultiTurn
from bakeoff.workloads.plans import PlannedRequest, RunPlan, SessionPlan, designed_reuse, reusable_share
from fake_sglang import FakeState, serve_fake
from plan_workloads import CLOSED, SESSIONS

SYSTEM = " ".join(f"sys{i}" for i in range(16))


def sessions_plan(warmup: int = 0) -> RunPlan:
    sessions = [SessionPlan(i, SYSTEM, [f"hello u{i} t{t} a b c d" for t in range(2)], 7, 4, 0.0) for i in range(3)]
    warm = [
        PlannedRequest(-1 - i, "chat", 4, messages=[{"role": "user", "content": f"warm {i} " * 12}])
        for i in range(warmup)
    ]
    return RunPlan(
        "sessions",
        "sessions",
        MultiTurn(turns=2),
        concurrency=1,
        sessions=sessions,
        warmup=warm,
        system_prompt_tokens=16,
    )


def run(url: str, plan: RunPlan, tmp_path: Path, backend: str = "sglang") -> RunSummary:
    target = RunTarget(ClientSettings(base_url=url, model="m"), load_backend(backend), show_progress=False)
    return execute_plan(plan, target, tmp_path / plan.name)


def test_ratio_hit_rate_and_counters_cover_the_same_measured_requests(tmp_path: Path) -> None:
    state = FakeState()
    with serve_fake(state) as url:
        summary = run(url, sessions_plan(warmup=2), tmp_path)
    block = summary.prefix_cache
    assert block is not None and summary.cache_reset is not None
    # The first turn of the first conversation had nothing cached and no details in usage:
    # it still counts (as 0) in the ratio, so ratio and counters agree exactly.
    assert block.cached_tokens_ratio == pytest.approx(block.server_hit_rate)
    assert block.server_hit_unit == "tokens"
    # The counters cover the measured requests only, not the warm-up (2 x 24 words).
    assert block.server_queries == state.prompt_total - 2 * 24
    assert block.server_hit_rate != pytest.approx(state.last_rate)  # not the gauge
    assert summary.cache_reset.ok is True


def test_absent_cached_tokens_count_as_zero_only_for_backends_that_report_them() -> None:
    plan = sessions_plan()
    records = [
        RequestRecord(1, prompt_tokens=100, cached_tokens=None, usage_source="server"),
        RequestRecord(2, prompt_tokens=100, cached_tokens=80, usage_source="server"),
        RequestRecord(3, prompt_tokens=100, cached_tokens=None, usage_source="tokenizer"),
    ]
    reported = prefix_cache_block(plan, records, {}, absent_cached_is_zero=True)
    assert reported.cached_tokens_ratio == pytest.approx(80 / 200)
    unknown = prefix_cache_block(plan, records, {}, absent_cached_is_zero=False)
    assert unknown.cached_tokens_ratio == pytest.approx(80 / 100)


def test_a_reset_that_stays_refused_marks_the_run(tmp_path: Path) -> None:
    state = FakeState(refuse_resets=2)
    with serve_fake(state) as url:
        summary = run(url, sessions_plan(), tmp_path)
    assert summary.cache_reset is not None and summary.prefix_cache is not None
    assert summary.cache_reset.ok is False and summary.cache_reset.attempts == 2
    assert summary.prefix_cache.cache_emptied_before_run is False
    info = read_json(tmp_path / "sessions" / RUN_INFO)
    assert info["prefix_cache_reset_before_run"] is False and info["cache_reset"]["ok"] is False


def test_a_reset_refused_while_busy_succeeds_once_idle(tmp_path: Path) -> None:
    state = FakeState(refuse_resets=1, running_polls=2)
    with serve_fake(state) as url:
        summary = run(url, sessions_plan(), tmp_path)
    assert summary.cache_reset is not None
    assert summary.cache_reset.ok is True and summary.cache_reset.attempts == 2
    assert read_json(tmp_path / "sessions" / RUN_INFO)["prefix_cache_reset_before_run"] is True


def test_reusable_reuse_counts_whole_cache_blocks_only() -> None:
    # Two conversations of one turn sharing a 32-token system prompt, 16 user tokens each.
    sessions = [SessionPlan(i, "s", ["u"], 16, 8, 0.0) for i in range(2)]
    plan = RunPlan("chat", "sessions", SESSIONS, sessions=sessions, system_prompt_tokens=32)
    assert designed_reuse(plan) == pytest.approx(32 / 96)
    assert reusable_share(plan, 1) == designed_reuse(plan)  # a radix tree / llama.cpp reuses any token run
    assert reusable_share(plan, 16) == pytest.approx(32 / 96)  # vLLM on GPU: two whole 16-token blocks
    assert reusable_share(plan, 128) == 0.0  # vLLM-CPU: the shared 32 tokens never fill one 128-token block
    assert reusable_share(RunPlan("c1", "closed", CLOSED), 128) is None  # nothing designed
