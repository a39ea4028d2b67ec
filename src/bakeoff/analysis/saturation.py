"""When raising the load stops paying: the level a server saturates, and whether a sweep may stop there.

A run *saturates* its server when

- it misses the SLO (:func:`bakeoff.analysis.verdict.meets`: a failed request, or a bounded
  P99 beyond its bound), or
- it is *over-saturated*: throughput rose less than :data:`THROUGHPUT_GAIN` over the level
  below while median end-to-end latency rose more than :data:`LATENCY_RISE` (GuideLLM's
  over-saturation rule, reduced to two readings): more load only queues.

A concurrency or rate sweep stops raising the load once *every* server of the campaign has
saturated at or below the level just measured (:func:`sweep_may_stop`): above it no server
meets the SLO, so those levels could not change the verdict. A server not measured yet on
the workload keeps the sweep going (it may sustain more), so the first server of the first
round runs the whole sweep; counterbalanced rounds then let each stop early.
"""

from __future__ import annotations

from bakeoff.analysis.verdict import Runs, meets
from bakeoff.measure.slo import Slo
from bakeoff.results.summary import RunSummary

THROUGHPUT_GAIN = 0.05  # output tok/s up by less than 5% over the level below...
LATENCY_RISE = 0.20  # ...while median E2E latency rose by more than 20%: over-saturated


def saturation(run: RunSummary, below: RunSummary | None, slo: Slo) -> str | None:
    """Why ``run`` saturates its server (``below``: the same server's run at the level below), or None."""
    if not meets([run], slo):
        failed = run.requests.failed
        return f"{failed} request(s) failed" if failed else "missed the SLO"
    if below is None:
        return None
    tput, was_tput = run.throughput.output_tok_s, below.throughput.output_tok_s
    e2e, was_e2e = run.latency.e2e_ms.p50, below.latency.e2e_ms.p50
    if not (tput and was_tput and e2e and was_e2e):
        return None
    gain, rise = tput / was_tput - 1, e2e / was_e2e - 1
    if gain < THROUGHPUT_GAIN and rise > LATENCY_RISE:
        return f"over-saturated: throughput {gain:+.0%} while median E2E latency {rise:+.0%} over the level below"
    return None


def saturated_at(by_load: dict[float, list[RunSummary]], slo: Slo) -> float | None:
    """The lowest load at which any repeat of a server saturated (against that repeat's level below)."""
    loads = sorted(by_load)
    for i, load in enumerate(loads):
        for run in by_load[load]:
            below = None
            if i > 0:
                below = next((r for r in by_load[loads[i - 1]] if r.workload.repeat == run.workload.repeat), None)
            if saturation(run, below, slo) is not None:
                return load
    return None


def sweep_may_stop(runs: Runs, servers: list[str], this: str, load: float, slo: Slo) -> bool:
    """Every server but ``this`` (which just saturated at ``load``) has saturated at or below ``load``."""
    for server in servers:
        if server == this:
            continue
        level = saturated_at(runs.get(server, {}), slo)
        if level is None or level > load:
            return False
    return True
