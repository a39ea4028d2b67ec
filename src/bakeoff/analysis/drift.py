"""Is a soak's series drifting? The slope over windows with its interval, judged against a margin.

A soak (:mod:`bakeoff.analysis.soak`) gives one value per window: P99 TTFT, the memory no
part accounts for. :func:`trend` fits a least-squares line through them (window mid-times in
seconds) and states the change it implies over the soak (slope x span) with a two-sided
``level`` interval from Student's t on n - 2 degrees of freedom. The verdict:

=========== =========================================================================
drifting    the whole interval lies above ``+margin``: it grows, by more than the margin
improving   the whole interval lies below ``-margin``
flat        the whole interval lies within ``±margin``: any drift is smaller than the margin
undecided   the interval reaches across a margin: these windows cannot say (run longer)
=========== =========================================================================

Judged by its interval, never by the fitted slope alone: a short soak with noisy windows
gets "undecided", not a guess. The interval treats windows as independent; consecutive
windows of one server share its state, so read a barely-decided verdict with care.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel
from scipy.special import stdtrit

Verdict = Literal["drifting", "improving", "flat", "undecided", "too few windows"]
LEVEL = 0.95
MIN_WINDOWS = 3


class Trend(BaseModel):
    """One series' fitted change over the soak, its interval, and what that says."""

    metric: str
    unit: str
    n: int
    span_s: float
    change: float | None = None  # slope x span: the growth the line implies over the soak
    low: float | None = None
    high: float | None = None
    margin: float
    level: float = LEVEL
    verdict: Verdict

    def line(self) -> str:
        """``P99 TTFT (ms): +41 [+30, +52] over 110 s, margin ±8: drifting``."""
        if self.change is None or self.low is None or self.high is None:
            return f"{self.metric}: {self.verdict} ({self.n} windows)"
        return (
            f"{self.metric} ({self.unit}): {self.change:+.3g} [{self.low:+.3g}, {self.high:+.3g}] over "
            f"{self.span_s:.0f} s, margin ±{self.margin:.3g}: {self.verdict}"
        )


def trend(
    metric: str,
    unit: str,
    times_s: Sequence[float],
    values: Sequence[float | None],
    margin: float,
    level: float = LEVEL,
) -> Trend:
    """The change ``values`` show over ``times_s`` (windows without a value left out), judged against ``margin``."""
    if margin < 0 or not math.isfinite(margin):
        raise ValueError(f"margin must be a finite number >= 0, got {margin}")
    points = [(t, v) for t, v in zip(times_s, values, strict=True) if v is not None and math.isfinite(v)]
    n = len(points)
    span = points[-1][0] - points[0][0] if n >= 2 else 0.0
    if n < MIN_WINDOWS or span <= 0:
        return Trend(metric=metric, unit=unit, n=n, span_s=span, margin=margin, level=level, verdict="too few windows")
    xs = [t for t, _ in points]
    ys = [v for _, v in points]
    slope, stderr = least_squares(xs, ys)
    half = float(stdtrit(n - 2, 0.5 + level / 2)) * stderr if n > 2 else math.inf
    change, low, high = slope * span, (slope - half) * span, (slope + half) * span
    return Trend(
        metric=metric,
        unit=unit,
        n=n,
        span_s=span,
        change=change,
        low=low,
        high=high,
        margin=margin,
        level=level,
        verdict=_verdict(low, high, margin),
    )


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """The least-squares slope of ``ys`` on ``xs`` and its standard error (0 where the fit is exact
    or has no residual degrees of freedom), as ``scipy.stats.linregress`` gives them; written out
    because importing ``scipy.stats`` costs every report kernel and ``bakeoff`` process ~0.7 s of CPU."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    if n <= 2:
        return slope, 0.0
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, math.sqrt(residual / (n - 2) / sxx)


def _verdict(low: float, high: float, margin: float) -> Verdict:
    if low > margin:
        return "drifting"
    if high < -margin:
        return "improving"
    if -margin <= low and high <= margin:
        return "flat"
    return "undecided"
