"""One configuration against another over their repeats: the test ``bakeoff tune`` picks and judges with.

The tuner asks one question many times — is finalist ``a`` better than ``b`` (another
finalist, the untuned start, another framework's pick) by more than ``min_effect``? — and
wants one of four answers: ``win``, ``loss``, ``equivalent`` or ``undecided``, with the ratio
``a / b`` and a sentence for the report. This module is the single place that answer comes
from, so the statistical test behind it is changed here and nowhere else.

Today it is the campaign verdict's bootstrap of the difference of means
(:func:`bakeoff.analysis.confidence.difference`), a win or loss only when that interval excludes
0 *and* the ratio is at least ``min_effect`` from 1; there is no equivalence outcome, so what is
not a win or loss is ``undecided``. The sound test of issue [11]
(``bakeoff.analysis.significance.decide``: Welch / paired t on log values, with an equivalence
margin) replaces the body of :func:`compare` when it lands, and its ``mean_interval`` that of
:func:`interval`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bakeoff.analysis.confidence import bootstrap_mean, difference

Outcome = Literal["win", "loss", "equivalent", "undecided"]
MIN_EFFECT = 0.05


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: the outcome for ``a``, the ratio of their means, and the report's sentence."""

    outcome: Outcome
    ratio: float | None  # mean(a) / mean(b)
    text: str

    @property
    def change(self) -> float | None:
        return None if self.ratio is None else self.ratio - 1.0


def compare(
    a: Sequence[float],
    b: Sequence[float],
    better: Literal["higher", "lower"] = "higher",
    *,
    min_effect: float = MIN_EFFECT,
) -> Comparison:
    """``a`` against ``b`` over their repeats (one figure per repeat)."""
    if len(a) < 2 or len(b) < 2:
        return Comparison("undecided", _ratio(a, b), f"{min(len(a), len(b))} repeat(s) on one side: no noise to judge")
    found = difference(a, b, better)
    ratio = _ratio(a, b)
    big = ratio is not None and abs(ratio - 1.0) >= min_effect
    outcome: Outcome = found.outcome if found.outcome != "tie" and big else "undecided"
    change = f"{ratio - 1:+.1%}" if ratio is not None else "no ratio"
    why = "" if outcome != "undecided" else f" (interval holds 0 or the change is under {min_effect:.0%})"
    return Comparison(outcome, ratio, f"{change}, difference {found.text()} → {outcome}{why}")


def _ratio(a: Sequence[float], b: Sequence[float]) -> float | None:
    if not a or not b or float(np.mean(b)) <= 0:
        return None
    return float(np.mean(a)) / float(np.mean(b))


def interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The interval of the mean of one configuration's repeats (None below two)."""
    return bootstrap_mean(values)
