"""Load from several client processes: the choice, the split, one epoch, the merged run."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.measure.client import ClientSettings
from bakeoff.measure.metrics import tpot_ms, ttft_ms
from bakeoff.measure.multiload import (
    DEFAULT_CPU_S_PER_CHUNK,
    MIN_WARMUP_CHUNKS,
    Estimate,
    clock_offset_ns,
    drive_processes,
    estimate,
    shift,
    split,
)
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import read_records
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest, RunPlan, SessionPlan
from plan_workloads import CLOSED, OPEN, SESSIONS

MODEL = "bakeoff-ref"


def requests(n: int, max_tokens: int = 8, gap_s: float = 0.0) -> list[PlannedRequest]:
    return [
        PlannedRequest(i, "completions", max_tokens, prompt=f"p{i}", prompt_tokens=4, arrival_s=i * gap_s)
        for i in range(n)
    ]


def streamed(request_id: int, chunks: int, start_ns: int, itl_ns: int) -> RequestRecord:
    record = RequestRecord(request_id, warmup=True, start_ns=start_ns, completion_tokens=chunks)
    record.chunk_ns = [start_ns + (i + 1) * itl_ns for i in range(chunks)]
    record.first_token_ns = record.chunk_ns[0]
    record.end_ns = record.chunk_ns[-1]
    return record


def test_perf_counter_is_the_system_wide_monotonic_clock_here() -> None:
    # What the merge relies on; where it does not hold the offsets still make it right.
    assert time.get_clock_info("perf_counter").implementation == time.get_clock_info("monotonic").implementation
    assert abs(clock_offset_ns()) < 1_000_000


def test_shift_moves_every_set_timestamp_and_leaves_unset_ones() -> None:
    record = streamed(1, 3, 1_000, 10)
    record.scheduled_ns = 0  # a closed-loop record has no schedule
    shift(record, 5)
    assert (record.start_ns, record.first_token_ns, record.end_ns, record.scheduled_ns) == (1_005, 1_015, 1_035, 0)
    assert record.chunk_ns == [1_015, 1_025, 1_035]


def test_split_keeps_concurrency_and_hands_out_every_request_or_session_once() -> None:
    closed = RunPlan("c", "closed", CLOSED, concurrency=7, requests=requests(20))
    shares = split(closed, 3)
    assert [s.concurrency for s in shares] == [3, 2, 2]
    assert all(s.requests is closed.requests for s in shares)  # claimed from one counter, not dealt
    opened = RunPlan("o", "open", OPEN, rate=10.0, concurrency=None, requests=requests(10, gap_s=0.1)[::-1])
    parts = split(opened, 3)
    assert sorted(r.request_id for s in parts for r in s.requests) == list(range(10))
    assert all(s.max_concurrency is None for s in parts)
    assert [r.arrival_s for r in parts[0].requests] == sorted(r.arrival_s for r in parts[0].requests)
    talks = [SessionPlan(i, "sys", ["hi"], 1, 2, 0.0) for i in range(5)]
    dealt = split(RunPlan("s", "sessions", SESSIONS, concurrency=4, sessions=talks), 2)
    assert sorted(s.session_id for share in dealt for s in share.sessions) == list(range(5))
    assert [share.concurrency for share in dealt] == [2, 2]


def test_auto_estimate_adds_processes_only_when_the_chunk_demand_needs_them() -> None:
    # Warm-up streams: 100 chunks each over 1 s, i.e. 100 chunks/s per request in flight.
    warm = [streamed(i, 100, 0, 10_000_000) for i in range(4)]
    low = estimate(RunPlan("c", "closed", CLOSED, concurrency=16), warm, cpu_s=0.01, wall_s=1.0)
    assert low.chunks_per_s == pytest.approx(1_600, rel=0.02)
    assert low.cpu_s_per_chunk == pytest.approx(0.01 / 400)
    assert low.processes(limit=8) == 1
    high = estimate(RunPlan("c", "closed", CLOSED, concurrency=512), warm, cpu_s=0.01, wall_s=1.0)
    # 51,200 chunks/s x 25 us = 1.28 cores; kept at most half busy each: 3 processes.
    assert high.processes(limit=8) == 3 and high.processes(limit=2) == 2
    # Too few warm-up chunks to trust their CPU figure: the calibrated default stands in.
    few = estimate(RunPlan("c", "closed", CLOSED, concurrency=1), warm[:1], cpu_s=1.0, wall_s=1.0)
    assert MIN_WARMUP_CHUNKS > 100 and few.cpu_s_per_chunk == DEFAULT_CPU_S_PER_CHUNK
    assert Estimate(None, 1e-3, None).processes(limit=8) == 1  # no warm-up: nothing to go on


@pytest.mark.precision
def test_open_loop_from_two_processes_keeps_one_schedule_and_exact_timings() -> None:
    plan = RunPlan("o", "open", OPEN, rate=50.0, requests=requests(24, max_tokens=6, gap_s=0.02))
    got: list[RequestRecord] = []
    with serve_reference(ttft_ms=40, itl_ms=10) as url:
        utils = asyncio.run(drive_processes(ClientSettings(base_url=url, model=MODEL), plan, 2, got.append))
    assert len(utils) == 2 and all(0 < u < 1 for u in utils)
    assert sorted(r.request_id for r in got) == list(range(24)) and all(r.ok for r in got)
    # One epoch: every scheduled time is that epoch plus the planned offset, whichever process sent it.
    planned = {p.request_id: p.arrival_s for p in plan.requests}
    epochs = {r.scheduled_ns - int(planned[r.request_id] * 1e9) for r in got}
    assert len(epochs) == 1, epochs
    # Merged onto this process's clock: no send goes out early, and each within ms of its schedule.
    assert all(0 <= r.start_ns - r.scheduled_ns < 30e6 for r in got)
    assert abs(sum(ttft_ms(r) or 0 for r in got) / len(got) - 40) < 4


@pytest.mark.precision
def test_a_run_driven_by_two_processes_records_them_and_merges_into_one_run(tmp_path: Path) -> None:
    reqs = requests(30, max_tokens=10)
    plan = RunPlan("c4", "closed", CLOSED, concurrency=4, warmup=requests(2), requests=reqs, min_requests=30)
    with serve_reference(ttft_ms=20, itl_ms=5) as url:
        target = RunTarget(ClientSettings(base_url=url, model=MODEL), show_progress=False)
        target.client_processes = 2
        summary = execute_plan(plan, target, tmp_path / "run")
    assert summary.client is not None and summary.client.processes == 2 and summary.client.decided_by == "fixed"
    assert len(summary.client.cpu_util) == 2 and summary.client.headroom is not None
    assert 0 < summary.client.headroom < 1
    records = read_records(tmp_path / "run" / "records.parquet")
    measured = [r for r in records if not r.warmup]
    assert sorted(r.request_id for r in measured) == list(range(30))  # each request exactly once
    assert summary.requests.ok == 30
    tpots = [v for r in measured if (v := tpot_ms(r)) is not None]
    assert abs(sum(tpots) / len(tpots) - 5) < 0.5


def test_auto_keeps_a_light_run_in_one_process(tmp_path: Path) -> None:
    plan = RunPlan("c2", "closed", CLOSED, concurrency=2, warmup=requests(2), requests=requests(6))
    with serve_reference(ttft_ms=5, itl_ms=5) as url:
        target = RunTarget(ClientSettings(base_url=url, model=MODEL), show_progress=False)
        summary = execute_plan(plan, target, tmp_path)
    assert summary.client is not None and summary.client.processes == 1 and summary.client.decided_by == "auto"
    assert summary.client.estimate["chunks_per_s"] is not None
