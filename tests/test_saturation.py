"""Sweeps that stop at saturation: which run saturates a server, and when a sweep may stop raising the load."""

from __future__ import annotations

from pathlib import Path

from bakeoff.analysis.saturation import saturated_at, saturation, sweep_may_stop
from bakeoff.analysis.verdict import saturation_notes
from bakeoff.campaign.cell_run import run_sweep
from bakeoff.measure.slo import Slo
from bakeoff.results.store import write_json
from bakeoff.results.summary import RunSummary
from bakeoff.workloads.plans import RunPlan
from plan_workloads import CLOSED
from verdict_planted import run

SLO = Slo(ttft_ms=500.0)


def test_a_run_saturates_by_missing_the_slo_or_by_queueing_without_more_throughput() -> None:
    assert saturation(run(100.0, p99_ttft=900.0), None, SLO) == "missed the SLO"
    below = run(100.0, concurrency=4, e2e_p50=1000.0)
    assert saturation(run(180.0, concurrency=8, e2e_p50=1100.0), below, SLO) is None  # batching still pays
    flat = saturation(run(102.0, concurrency=8, e2e_p50=1900.0), below, SLO)
    assert flat is not None and flat.startswith("over-saturated: throughput +2% while median E2E latency +90%")


def test_a_sweep_stops_only_once_every_server_has_saturated() -> None:
    slo_misses = {4.0: [run(100.0)], 16.0: [run(150.0, concurrency=16, p99_ttft=900.0)]}
    runs = {"a": slo_misses, "b": {4.0: [run(90.0)], 16.0: [run(140.0, concurrency=16)]}}
    assert saturated_at(runs["a"], SLO) == 16.0 and saturated_at(runs["b"], SLO) is None
    assert not sweep_may_stop(runs, ["a", "b", "c"], "c", 16.0, SLO)  # b still meets it at 16
    assert sweep_may_stop({"a": slo_misses}, ["a", "c"], "c", 16.0, SLO)
    assert not sweep_may_stop({"a": slo_misses}, ["a", "c"], "c", 8.0, SLO)  # a sustained more than 8
    assert not sweep_may_stop({}, ["a", "c"], "c", 16.0, SLO)  # a not measured yet: it may sustain more


def test_run_sweep_skips_the_levels_above_the_stop_and_says_where_and_why() -> None:
    plans = [RunPlan(f"c{c}", "closed", CLOSED, concurrency=c) for c in (1, 4, 16, 64)]
    ran: list[str] = []

    def execute(plan: RunPlan) -> RunSummary:
        ran.append(plan.name)
        return run(100.0, concurrency=plan.concurrency or 1, p99_ttft=900.0 if plan.name == "c4" else 100.0)

    def stop_here(result: RunSummary, below: RunSummary | None, level: float) -> str | None:
        return saturation(result, below, SLO)

    stopped = run_sweep(plans, {}, execute, stop_here)
    assert ran == ["c1", "c4"]
    assert stopped == {"after": "c4", "why": "missed the SLO", "skipped": ["c16", "c64"]}
    assert run_sweep(plans[:2], {}, execute, stop_here) is None  # stopping at the last level skips nothing


def test_the_report_lists_skipped_levels_as_skipped(tmp_path: Path) -> None:
    cell = tmp_path / "cells" / "a__sweep"
    stop = {"after": "c4", "why": "missed the SLO", "skipped": ["c16", "c64"]}
    write_json(cell / "cell.json", {"server": {"label": "a"}, "backend": "x", "workload": "sweep", "saturation": stop})
    (note,) = saturation_notes(tmp_path)
    assert "stopped raising the load after c4 (missed the SLO" in note and "skipped, not missing: c16, c64" in note
