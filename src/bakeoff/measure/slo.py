"""SLOs: presets, whether a run meets one, and the search for the highest rate that does.

A run meets an SLO when its P99 TTFT, P99 TPOT and P99 E2E are within every bound set
(MLPerf's server scenario judges the same tails). For a reasoning model ``ttfa_ms`` bounds
the time to the first *answer* token, after the thinking (TTFT there is the first thinking
token); on a model that does not reason TTFA is TTFT. The search re-times one fixed request
set to new arrival rates, so every rate and every backend still sees the same requests.

Where a run met no bound at all, :func:`slo_miss` says how far it was: the largest ratio of a
bounded metric's median to its bound (``bakeoff tune`` ranks and compares by it when nothing
met the SLO).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
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


SLO_METRICS = ("TTFT", "TTFA", "TPOT", "E2E")  # what each entry of slo_pairs measures, in its order


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


def _ms(value: float) -> str:
    return f"{value / 1000:.3g} s" if value >= 1000 else f"{value:.3g} ms"


@dataclass(frozen=True)
class SloMiss:
    """How far a run's median was from the SLO: ``factor`` is P50 / bound of its worst bounded metric."""

    factor: float
    metric: str  # TTFT, TTFA, TPOT or E2E
    p50_ms: float
    bound_ms: float

    def text(self) -> str:
        """``SLO missed by 6.9x (TTFT P50 13.9 s vs 2 s)``, or how close a median within the SLO came."""
        where = f"{self.metric} P50 {_ms(self.p50_ms)} vs {_ms(self.bound_ms)}"
        if self.factor > 1:
            factor = f"{self.factor:.1f}" if self.factor < 10 else f"{self.factor:,.0f}"
            return f"SLO missed by {factor}x ({where})"
        return f"median within the SLO ({where})"


def slo_miss(summary: RunSummary, slo: Slo) -> SloMiss | None:
    """The largest P50 / bound over the metrics the SLO bounds (None: it bounds none, or nothing was measured).

    The median, not the P99 the SLO is judged on: where goodput is 0 the typical request missed,
    and its median says by how much; it moves smoothly with the knobs (a signal a search can
    follow) and is set by half the requests, not by the slowest one or two of a short run (at
    tens of requests a run the P99 is about the maximum).
    """
    found = [
        SloMiss(stat.p50 / bound, name, stat.p50, bound)
        for name, (stat, bound) in zip(SLO_METRICS, slo_pairs(summary, slo), strict=True)
        if bound is not None and stat.p50 is not None
    ]
    return max(found, key=lambda m: m.factor, default=None)


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
