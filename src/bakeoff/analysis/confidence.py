"""How sure a figure is: bootstrap intervals across repeats, and wins that exceed the noise.

A cell is measured ``repeats`` times (:func:`bakeoff.campaign.cells.order_repeats`); each repeat
gives one value of every figure (its P50, P99, throughput, goodput). The figure reported is
the mean over repeats with a percentile-bootstrap interval (numpy, a fixed seed, so a report
renders the same twice); with one repeat there is no interval, and the report says so.

A percentile a repeat's sample cannot support (P99 of 32 requests: the largest sample
stretched) is carried as unsupported with the reason, never as a number. A difference
between two servers is a *win* only when the bootstrap interval of the difference of their
means excludes 0; otherwise it is a *tie*.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bakeoff.results.metric_table import BY_KEY
from bakeoff.results.summary import STAT_LABELS, RunSummary, StatName, percentile_supported

LEVEL = 0.95
RESAMPLES = 4000
SEED = 20240611  # fixed: the same runs give the same intervals on every render


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


def bootstrap_mean(values: Sequence[float], seed: int = SEED) -> tuple[float, float] | None:
    """Percentile-bootstrap interval (``LEVEL``) of the mean; None below two values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(RESAMPLES, arr.size))].mean(axis=1)
    tail = (1.0 - LEVEL) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def estimate(summaries: Sequence[RunSummary], metric: str, stat: StatName | None = None) -> Estimate:
    """``metric`` (a metric-table key) over the repeats in ``summaries``, with its interval."""
    row = BY_KEY[metric]
    values: list[float] = []
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
    if not values:
        return Estimate(metric, stat, None, None, None, len(summaries), min(samples, default=None))
    interval = bootstrap_mean(values)
    lo, hi = interval if interval is not None else (None, None)
    return Estimate(metric, stat, float(np.mean(values)), lo, hi, len(values), min(samples, default=None))


def _needed(name: StatName) -> int:
    n = 1
    while not percentile_supported(name, n):
        n += 1
    return n


Outcome = Literal["win", "tie", "loss"]


@dataclass(frozen=True)
class Difference:
    """``a`` minus ``b`` (means over repeats), its interval, and whether it beats the noise."""

    diff: float
    lo: float | None
    hi: float | None
    relative: float | None  # diff / mean of b
    outcome: Outcome  # for a, where ``better`` says which direction is good

    def text(self, unit: str = "") -> str:
        rel = f" ({self.relative:+.1%})" if self.relative is not None else ""
        if self.lo is None or self.hi is None:
            return f"{self.diff:+,.2f}{unit}{rel}, no interval (one repeat): a tie"
        return f"{self.diff:+,.2f}{unit}{rel} [{self.lo:+,.2f}, {self.hi:+,.2f}]"


def difference(a: Sequence[float], b: Sequence[float], better: Literal["higher", "lower"]) -> Difference:
    """Bootstrap the difference of means, resampling each side's repeats independently.

    ``win``: the interval excludes 0 on ``a``'s good side; ``loss``: on its bad side; else ``tie``.
    Without two repeats on each side nothing can be told from the noise: always a tie.
    """
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = float(xa.mean() - xb.mean())
    relative = diff / float(xb.mean()) if xb.mean() else None
    if xa.size < 2 or xb.size < 2:
        return Difference(diff, None, None, relative, "tie")
    rng = np.random.default_rng(SEED)
    ma = xa[rng.integers(0, xa.size, size=(RESAMPLES, xa.size))].mean(axis=1)
    mb = xb[rng.integers(0, xb.size, size=(RESAMPLES, xb.size))].mean(axis=1)
    tail = (1.0 - LEVEL) / 2 * 100
    lo, hi = (float(v) for v in np.percentile(ma - mb, [tail, 100 - tail]))
    sign = 1.0 if better == "higher" else -1.0
    if lo > 0 or hi < 0:
        good = (lo > 0) == (sign > 0)
        outcome: Outcome = "win" if good else "loss"
    else:
        outcome = "tie"
    return Difference(diff, lo, hi, relative, outcome)
