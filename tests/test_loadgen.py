"""Load generators against the reference server: schedules, concurrency and conversations."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from pathlib import Path

import pytest

from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.measure.loadgen import run_plan
from bakeoff.measure.metrics import summarize
from bakeoff.results.records import RequestRecord
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.kinds import ConcurrencySweep, MultiTurn, OpenLoop
from bakeoff.workloads.plans import PlanBuilder
from refload import MODEL, drive


@pytest.mark.precision
def test_open_loop_sends_on_schedule_regardless_of_completions(builder: PlanBuilder) -> None:
    plan = builder.build(OpenLoop(rates=[40.0], requests_per_rate=60, warmup_requests=0, input_len=16, output_len=8))[0]
    with serve_reference(ttft_ms=200, itl_ms=20) as url:  # each request lasts ~340 ms >> 25 ms gaps
        records = drive(url, plan)
    assert all(r.ok for r in records)
    lateness_ms = [(r.start_ns - r.scheduled_ns) / 1e6 for r in records]
    assert max(lateness_ms) < 15  # sent when planned, not when a slot frees up
    in_flight_peak = max(sum(1 for o in records if o.start_ns <= r.start_ns < o.end_ns) for r in records)
    assert in_flight_peak >= 10  # requests overlapped: the loop did not wait for completions
    summary = summarize(records)
    assert summary.queue_delay_ms is not None and summary.queue_delay_ms.p99 is not None
    assert summary.queue_delay_ms.p99 < 15


@pytest.mark.precision
def test_closed_loop_keeps_exactly_n_in_flight(builder: PlanBuilder) -> None:
    plan = builder.build(
        ConcurrencySweep(
            levels=[4], requests_per_level=24, min_duration_s=0, warmup_requests=4, input_len=16, output_len=6
        )
    )[0]
    with serve_reference(ttft_ms=50, itl_ms=10) as url:
        records = drive(url, plan)
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 24 and sum(r.warmup for r in records) == 4
    peak = max(sum(1 for o in measured if o.start_ns <= r.start_ns < o.end_ns) for r in measured)
    assert peak == 4
    summary = summarize(records)
    # 24 requests less a ramp and a tail (about 4 each) fall inside the steady-state window.
    assert summary.window is not None and summary.window.requests_inside >= 16 and summary.window.minimum_met
    # Each request lasts ~100 ms: 24 of them 4 at a time take ~6 rounds, the window ~4 of them.
    assert 0.3 < summary.throughput.window_s < 0.6


def test_conversations_carry_the_real_replies(builder: PlanBuilder) -> None:
    plan = builder.build(
        MultiTurn(conversations=3, turns=3, system_prompt_len=40, user_len=5, output_len=4, concurrency=2)
    )[0]
    with serve_reference(ttft_ms=5, itl_ms=2) as url:
        records = drive(url, plan)
    assert len(records) == 9 and all(r.ok for r in records)
    for session in {r.group for r in records}:
        turns = sorted((r for r in records if r.group == session), key=lambda r: r.turn)
        assert [r.turn for r in turns] == [0, 1, 2]
        for before, after in pairwise(turns):
            # The reference server counts prompt words: the next prompt holds the previous
            # one, the reply it got, and the new user turn.
            reply_words = len(before.output_text.split())
            assert reply_words > 0
            assert after.prompt_tokens == before.prompt_tokens + reply_words + 5
    summary = summarize(records)
    assert set(summary.ttft_ms_by_turn) == {0, 1, 2}


def test_rerunning_a_plan_replaces_its_run_folder(builder: PlanBuilder, tmp_path: Path) -> None:
    from bakeoff.campaign.runner import RunTarget, execute_plan

    plan = builder.build(
        ConcurrencySweep(levels=[2], requests_per_level=6, warmup_requests=1, input_len=8, output_len=3)
    )[0]
    with serve_reference(ttft_ms=5, itl_ms=2) as url:
        target = RunTarget(ClientSettings(base_url=url, model=MODEL), show_progress=False)
        first = execute_plan(plan, target, tmp_path / "c2")
        second = execute_plan(plan, target, tmp_path / "c2")
    assert first.requests.ok == second.requests.ok == 6
    assert second.requests.warmup == 1
    assert len((tmp_path / "c2" / "records.jsonl").read_text().splitlines()) == 7


def test_measure_start_hook_runs_after_warm_up_and_before_the_measured_part(builder: PlanBuilder) -> None:
    plan = builder.build(
        ConcurrencySweep(levels=[3], requests_per_level=6, warmup_requests=3, input_len=8, output_len=3)
    )[0]
    events: list[str] = []

    async def main(url: str) -> list[RequestRecord]:
        async with StreamingClient(ClientSettings(base_url=url, model=MODEL)) as client:
            return await run_plan(
                client,
                plan,
                lambda r: events.append("warmup" if r.warmup else "measured"),
                show_progress=False,
                on_measure_start=lambda: events.append("start"),
            )

    with serve_reference(ttft_ms=5, itl_ms=2) as url:
        asyncio.run(main(url))
    assert events == ["warmup"] * 3 + ["start"] + ["measured"] * 6
