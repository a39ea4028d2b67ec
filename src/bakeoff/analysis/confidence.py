"""How sure a figure is: Student-t intervals across repeats; comparing servers is :mod:`.significance`.

A cell is measured ``repeats`` times (:func:`bakeoff.campaign.cells.order_repeats`); each repeat
gives one value of every figure (its P50, P99, throughput, goodput). The figure reported is
the mean over repeats with its Student-t interval (the t distribution the comparisons use:
a bootstrap over 2-5 values sees only their spread and is far too narrow); with one repeat
there is no interval, and the report says so. Each estimate keeps its values by repeat
(slot), which is what :func:`bakeoff.analysis.significance.decide` pairs.

A percentile a repeat's sample cannot support (P99 of 32 requests: the largest sample
stretched) is carried as unsupported with the reason, never as a number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bakeoff.analysis.significance import ALPHA, mean_interval
from bakeoff.results.formulas import needed_samples
from bakeoff.results.metric_table import BY_KEY
from bakeoff.results.summary import PERCENTILES, STAT_LABELS, RunSummary, StatName, percentile_supported

LEVEL = 1 - ALPHA


@dataclass(frozen=True)
class Estimate:
    """One figure over a cell's repeats: mean, interval, how many repeats and samples per repeat."""

    metric: str
    stat: StatName | None
    value: float | None
    lo: float | None
    hi: float | None
    repeats: int
    samples: int | None  # fewest samples behind the statistic in any repeat (None: a run-level figure)
    unsupported: str | None = None
    values: tuple[float, ...] = ()  # one per repeat
    by_slot: dict[int, float] = field(default_factory=dict)  # repeat (round) -> value; empty when slots repeat

    @classmethod
    def over(
        cls,
        values: Sequence[float],
        samples: int | None,
        metric: str = "",
        stat: StatName | None = None,
        by_slot: dict[int, float] | None = None,
    ) -> Estimate:
        """The mean of one value per repeat (at least one), with its Student-t interval."""
        interval = mean_interval(values)
        lo, hi = interval if interval is not None else (None, None)
        return cls(
            metric, stat, float(np.mean(values)), lo, hi, len(values), samples, None, tuple(values), by_slot or {}
        )

    @property
    def cv(self) -> float | None:
        """Run-to-run noise: the coefficient of variation across repeats (None below two)."""
        if len(self.values) < 2 or not self.value:
            return None
        return float(np.std(self.values, ddof=1)) / abs(self.value)

    @property
    def supported(self) -> bool:
        return self.unsupported is None and self.value is not None

    def text(self, digits: int = 1) -> str:
        """``12.3 [11.0, 13.5] (n=3×128)``, or why there is no number."""
        if self.unsupported is not None:
            return f"unsupported: {self.unsupported}"
        if self.value is None:
            return "-"
        n = f"n={self.repeats}" + (f"×{self.samples}" if self.samples is not None else "")
        if self.lo is None or self.hi is None:
            return f"{self.value:,.{digits}f} ({n}, no interval from one repeat)"
        return f"{self.value:,.{digits}f} [{self.lo:,.{digits}f}, {self.hi:,.{digits}f}] ({n})"


def estimate(summaries: Sequence[RunSummary], metric: str, stat: StatName | None = None) -> Estimate:
    """``metric`` (a metric-table key) over the repeats in ``summaries``, with its interval."""
    row = BY_KEY[metric]
    values: list[float] = []
    slots: list[int] = []
    samples: list[int] = []
    for summary in summaries:
        if row.read is None:
            dist = row.stat(summary)
            name: StatName = stat or "p50"
            if dist.unsupported is not None:
                return Estimate(metric, stat, None, None, None, len(summaries), dist.n, dist.unsupported)
            if not percentile_supported(name, dist.n):
                need = _needed(name)
                why = f"{STAT_LABELS[name]} needs ≥{need} samples per run, a repeat had {dist.n}"
                return Estimate(metric, stat, None, None, None, len(summaries), dist.n, why)
            samples.append(dist.n)
        value = row.value(summary, stat)
        if value is not None:
            values.append(value)
            slots.append(summary.workload.repeat)
    if not values:
        return Estimate(metric, stat, None, None, None, len(summaries), min(samples, default=None))
    # Slots pair repeats across servers only when each names one repeat (older runs all say 1).
    by_slot = dict(zip(slots, values, strict=True)) if len(set(slots)) == len(slots) else {}
    return Estimate.over(values, min(samples, default=None), metric, stat, by_slot)


def _needed(name: StatName) -> int:
    return needed_samples(name)


def supported_estimate(summaries: Sequence[RunSummary], metric: str, stat: StatName) -> Estimate:
    """``stat`` over the repeats where every repeat supports it, else the highest percentile below that does.

    The report's one support rule for figures across repeats (P90 where a repeat's 24 requests
    cannot support a P99); the estimate's ``stat`` says which it is.
    """
    found = estimate(summaries, metric, stat)
    if found.supported or stat not in PERCENTILES or found.samples is None or BY_KEY[metric].read is not None:
        return found
    for lower in reversed([p for p in PERCENTILES if PERCENTILES[p] < PERCENTILES[stat]]):
        below = estimate(summaries, metric, lower)
        if below.supported:
            return below
    return found
