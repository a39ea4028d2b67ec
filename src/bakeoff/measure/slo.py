"""SLOs: presets, whether a run meets one, and the search for the highest rate that does.

A run meets an SLO when its P99 TTFT, P99 TPOT and P99 E2E are within every bound set
(MLPerf's server scenario judges the same tails). For a reasoning model ``ttfa_ms`` bounds
the time to the first *answer* token, after the thinking (TTFT there is the first thinking
token); on a model that does not reason TTFA is TTFT. The search re-times one fixed request
set to new arrival rates, so every rate and every backend still sees the same requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import Field

from bakeoff.results.summary import RunSummary, Stat
from bakeoff.schema import Strict
from bakeoff.workloads.kinds import OpenLoop
from bakeoff.workloads.plans import RunPlan, arrival_times, retime

# MLPerf-Inference-style latency bounds (TTFT ms, TPOT ms) for common model sizes.
SLO_PRESETS: dict[str, tuple[float, float]] = {
    "mlperf-llama3.1-8b": (2000.0, 100.0),
    "mlperf-llama2-70b": (2000.0, 200.0),
    "mlperf-llama2-70b-interactive": (450.0, 40.0),
    "mlperf-llama3.1-405b": (6000.0, 175.0),
}


SloPreset = Literal["mlperf-llama3.1-8b", "mlperf-llama2-70b", "mlperf-llama2-70b-interactive", "mlperf-llama3.1-405b"]


class Slo(Strict):
    """Service-level objectives; a request meets the SLO when it meets every bound set."""

    preset: SloPreset | None = Field(default=None, description="MLPerf-style TTFT/TPOT bounds")
    ttft_ms: Annotated[float, Field(gt=0)] | None = None
    ttfa_ms: Annotated[float, Field(gt=0, description="time to first answer token (reasoning models)")] | None = None
    tpot_ms: Annotated[float, Field(gt=0)] | None = None
    e2e_ms: Annotated[float, Field(gt=0)] | None = None


def resolve_slo(slo: Slo) -> Slo:
    """Fill TTFT/TPOT bounds from the preset unless the campaign set them explicitly."""
    if slo.preset is None:
        return slo
    ttft, tpot = SLO_PRESETS[slo.preset]
    return slo.model_copy(update={"ttft_ms": slo.ttft_ms or ttft, "tpot_ms": slo.tpot_ms or tpot})


def slo_pairs(summary: RunSummary, slo: Slo) -> tuple[tuple[Stat, float | None], ...]:
    """Each metric the SLO can bound, with its bound in this run (None: unbounded)."""
    latency = summary.latency
    # A run without reasoning has no TTFA distribution: its answer starts at TTFT.
    ttfa = latency.ttfa_ms if latency.ttfa_ms.n else latency.ttft_ms
    return (
        (latency.ttft_ms, slo.ttft_ms),
        (ttfa, slo.ttfa_ms),
        (latency.tpot_ms, slo.tpot_ms),
        (latency.e2e_ms, slo.e2e_ms),
    )


def run_meets_slo(summary: RunSummary, slo: Slo) -> bool | None:
    """P99 of every bounded metric within its bound; None when the SLO sets no bound."""
    bounds = slo_pairs(summary, slo)
    if all(bound is None for _, bound in bounds):
        return None
    if summary.requests.ok == 0 or summary.requests.failed > 0:
        return False
    return all(bound is None or (stat.p99 is not None and stat.p99 <= bound) for stat, bound in bounds)


def search_max_rate(
    template: RunPlan,
    workload: OpenLoop,
    slo: Slo,
    tried: dict[float, RunSummary],
    execute: Callable[[RunPlan], RunSummary],
) -> dict[str, Any]:
    """Bisect (geometrically) between the best passing and the first failing rate.

    ``tried`` maps the rates already run to their summaries; ``execute`` runs one more plan.
    """
    verdicts = {rate: run_meets_slo(s, slo) for rate, s in tried.items()}
    for step in range(workload.search_steps):
        passing = [r for r, ok in verdicts.items() if ok]
        failing = [r for r, ok in verdicts.items() if ok is False and r > max(passing, default=0.0)]
        low = max(passing, default=None)
        high = min(failing, default=None)
        if low is None and high is not None:
            rate = high / 2  # nothing passed yet: halve until something does
        elif high is None and low is not None:
            rate = low * 2  # everything passed: double until something fails
        elif low is not None and high is not None:
            if high / low < 1 + workload.search_tolerance:
                break
            rate = math.sqrt(low * high)
        else:
            break
        times = arrival_times(
            len(template.requests), rate, workload.arrival, workload.burstiness, workload.seed + 1000 + step
        )
        plan = replace(template, name=f"search-r{rate:.3g}", rate=rate, requests=retime(template.requests, times))
        verdicts[rate] = run_meets_slo(execute(plan), slo)
    best = max((r for r, ok in verdicts.items() if ok), default=None)
    return {
        "slo": slo.model_dump(),
        "max_rate_meeting_slo": best,
        "tried": {f"{r:.4g}": ok for r, ok in sorted(verdicts.items())},
    }
