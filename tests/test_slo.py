"""SLO presets, run verdicts and the highest-rate search (with a synthetic server model)."""

from __future__ import annotations

import pytest

from bakeoff.measure.slo import SLO_PRESETS, Slo, resolve_slo, run_meets_slo, search_max_rate, slo_miss
from bakeoff.results.summary import Latency, Requests, RunSummary, Stat, Throughput, Tokens
from bakeoff.workloads.kinds import OpenLoop
from bakeoff.workloads.plans import PlannedRequest, RunPlan
from plan_workloads import OPEN


def fake_summary(ttft_p99: float, tpot_p99: float, failed: int = 0) -> RunSummary:
    return RunSummary(
        requests=Requests(ok=10, failed=failed),
        latency=Latency(ttft_ms=Stat(n=10, p99=ttft_p99), tpot_ms=Stat(n=10, p99=tpot_p99), e2e_ms=Stat(n=10, p99=1.0)),
        throughput=Throughput(output_tok_s=1.0, total_tok_s=1.0, req_s=1.0, window_s=10.0),
        tokens=Tokens(prompt=10, completion=10),
    )


def test_preset_fills_bounds_but_explicit_values_win() -> None:
    slo = resolve_slo(Slo(preset="mlperf-llama2-70b-interactive"))
    assert (slo.ttft_ms, slo.tpot_ms) == SLO_PRESETS["mlperf-llama2-70b-interactive"]
    assert resolve_slo(Slo(preset="mlperf-llama3.1-8b", ttft_ms=500)).ttft_ms == 500


def test_run_verdict_uses_p99_and_failures() -> None:
    slo = Slo(ttft_ms=2000, tpot_ms=100)
    assert run_meets_slo(fake_summary(1999, 99), slo) is True
    assert run_meets_slo(fake_summary(2001, 99), slo) is False
    assert run_meets_slo(fake_summary(100, 101), slo) is False
    assert run_meets_slo(fake_summary(100, 50, failed=1), slo) is False
    assert run_meets_slo(fake_summary(100, 50), Slo()) is None


def test_the_slo_miss_is_the_worst_median_against_its_bound() -> None:
    summary = fake_summary(20000, 300)
    summary.latency.ttft_ms.p50, summary.latency.tpot_ms.p50 = 13_800.0, 150.0
    miss = slo_miss(summary, Slo(ttft_ms=2000, tpot_ms=100))
    assert miss is not None and miss.metric == "TTFT" and miss.factor == pytest.approx(6.9)
    assert miss.text() == "SLO missed by 6.9x (TTFT P50 13.8 s vs 2 s)"  # the median, not the P99 of 20 s
    # A model that does not reason: its TTFA bound is read against TTFT.
    ttfa = slo_miss(summary, Slo(ttfa_ms=1000, tpot_ms=100))
    assert ttfa is not None and ttfa.metric == "TTFA" and ttfa.factor == pytest.approx(13.8)
    tpot = slo_miss(summary, Slo(ttft_ms=20_000, tpot_ms=100))
    assert tpot is not None and tpot.metric == "TPOT" and tpot.text().startswith("SLO missed by 1.5x")
    assert slo_miss(summary, Slo()) is None


def test_search_converges_on_the_knee() -> None:
    # A server whose P99 TTFT explodes past 6.0 req/s.
    def ttft_at(rate: float) -> float:
        return 300.0 if rate <= 6.0 else 5000.0

    requests = [PlannedRequest(i, "completions", 8, prompt="x", arrival_s=i * 0.5) for i in range(20)]
    template = RunPlan("r1", "open", OPEN, rate=2.0, requests=requests)
    wl = OpenLoop(rates=[2.0, 16.0], input_len=8, output_len=8, slo_search=True, search_steps=8, search_tolerance=0.05)
    seen: list[RunPlan] = []

    def execute(plan: RunPlan) -> RunSummary:
        seen.append(plan)
        assert [r.prompt for r in plan.requests] == [r.prompt for r in requests]  # same requests
        assert plan.rate is not None
        return fake_summary(ttft_at(plan.rate), 20.0)

    slo = Slo(ttft_ms=2000, tpot_ms=100)
    result = search_max_rate(template, wl, slo, {2.0: fake_summary(300, 20), 16.0: fake_summary(5000, 20)}, execute)
    assert result["max_rate_meeting_slo"] == pytest.approx(6.0, rel=0.06)
    assert result["max_rate_meeting_slo"] <= 6.0
    span = seen[-1].requests[-1].arrival_s
    assert span == pytest.approx(19 / seen[-1].rate, rel=0.6)  # re-timed to the new rate
