"""Fair load against the reference server: no waves in a closed loop, no coordinated omission in an open one."""

from __future__ import annotations

import statistics
from itertools import pairwise

import pytest

from bakeoff.measure.metrics import WindowTargets, summarize
from bakeoff.results.formulas import ttft_from_send_ms, ttft_ms
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.kinds import ConcurrencySweep, OpenLoop
from bakeoff.workloads.plans import PlanBuilder
from refload import drive


@pytest.mark.precision
def test_closed_loop_at_16_spreads_its_starts_and_measures_only_the_steady_state(builder: PlanBuilder) -> None:
    wl = ConcurrencySweep(
        levels=[16], requests_per_level=80, min_duration_s=0.5, warmup_requests=2, input_len=16, output_len=8
    )
    plan = builder.build(wl)[0]
    with serve_reference(ttft_ms=60, itl_ms=10) as url:  # each request lasts ~130 ms
        records = drive(url, plan)
    measured = sorted((r for r in records if not r.warmup), key=lambda r: r.start_ns)
    assert {r.slot for r in measured} == set(range(16))
    # No wave: the 16 first starts are spread over the ramp (one warm-up lifetime, ~130 ms):
    # in lock-step all 16 would start within a millisecond.
    firsts = sorted(min(r.start_ns for r in measured if r.slot == s) for s in range(16))
    gaps = [(b - a) / 1e6 for a, b in pairwise(firsts)]
    assert (firsts[-1] - firsts[0]) / 1e6 > 80
    assert 0.5 * 130 / 16 < statistics.median(gaps) < 2 * 150 / 16
    starts_ms = [r.start_ns / 1e6 for r in measured]
    assert max(sum(1 for t in starts_ms if s <= t < s + 1.0) for s in starts_ms) <= 4
    summary = summarize(records, targets=WindowTargets(plan.min_requests, plan.min_duration_s))
    window = summary.window
    assert window is not None and window.concurrency == 16 and window.minimum_met
    # The window opens when the last slot starts and closes when the first slot is not refilled.
    assert window.start_s == pytest.approx((firsts[-1] - firsts[0]) / 1e9, abs=1e-6)
    assert window.excluded_ramp >= 15 and window.excluded_tail >= 15
    assert window.requests_inside >= 48 and window.end_s - window.start_s >= 0.5
    assert window.requests_inside + window.excluded_ramp + window.excluded_tail == len(measured)
    assert summary.latency.ttft_ms.n == window.requests_inside
    # Steady state holds 16 in flight: ~16 requests per lifetime (~130-150 ms).
    assert 16 / 0.16 < summary.throughput.req_s < 16 / 0.12


@pytest.mark.precision
def test_open_loop_under_a_saturated_cap_counts_the_wait_in_ttft(builder: PlanBuilder) -> None:
    wl = OpenLoop(
        rates=[100.0],
        arrival="constant",
        requests_per_rate=30,
        max_concurrency=2,
        warmup_requests=0,
        input_len=16,
        output_len=4,
    )
    plan = builder.build(wl)[0]
    with serve_reference(ttft_ms=50, itl_ms=10) as url:  # ~80 ms each: 2 slots serve ~25 req/s of 100 offered
        records = drive(url, plan)
    assert all(r.ok for r in records)
    for r in records:
        wait_ms = (r.start_ns - r.scheduled_ns) / 1e6
        sent = ttft_from_send_ms(r)
        assert sent is not None and sent == pytest.approx(50, abs=15)  # the server's own TTFT
        assert ttft_ms(r) == pytest.approx(wait_ms + sent, abs=0.01)  # from the scheduled time: wait + server
    summary = summarize(records)
    last = max(records, key=lambda r: r.scheduled_ns)
    assert (last.start_ns - last.scheduled_ns) / 1e6 > 500  # the queue in the client grew
    assert summary.latency.ttft_ms.p50 is not None and summary.latency.ttft_from_send_ms.p50 is not None
    assert summary.latency.ttft_ms.p50 > 5 * summary.latency.ttft_from_send_ms.p50
    # Offered beside achieved: the schedule asked for 100/s, two slots gave ~25/s.
    assert summary.throughput.offered_req_s == pytest.approx(100, rel=0.01)
    assert 15 < summary.throughput.req_s < 30
