"""One configuration against another over their repeats: the test ``bakeoff tune`` picks and judges with.

The tuner asks one question many times — is finalist ``a`` better than ``b`` (another
finalist, the untuned start, another framework's pick) by more than ``min_effect``? — and
wants one of four answers: ``win``, ``loss``, ``equivalent`` or ``undecided``, with the ratio
``a / b`` and a sentence for the report. This module is the single place that answer comes
from: the campaign verdict's test (:func:`bakeoff.analysis.significance.decide`: Welch's t on
log values, an equivalence margin of ``min_effect``). The tune's repeats run back to back per
round, not paired by slot, so the test is unpaired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bakeoff.analysis.significance import MIN_EFFECT, Outcome, decide, mean_interval


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: the outcome for ``a``, the ratio ``a / b``, and the report's sentence."""

    outcome: Outcome
    ratio: float | None
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
    found = decide(list(a), list(b), better, min_effect=min_effect)
    return Comparison(found.outcome, found.ratio, found.text())


def interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The interval of the mean of one configuration's repeats (None below two)."""
    return mean_interval(values)
