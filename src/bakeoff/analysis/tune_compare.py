"""One configuration against another over their repeats: the test ``bakeoff tune`` picks and judges with.

The tuner asks one question many times — is finalist ``a`` better than ``b`` (another
finalist, the untuned start, another framework's pick) by more than ``min_effect``? — and
wants one of four answers: ``win``, ``loss``, ``equivalent`` or ``undecided``, with the ratio
``a / b`` and a sentence for the report. This module is the single place that answer comes
from: the campaign verdict's test (:func:`bakeoff.analysis.significance.decide`: Welch's t on
log values, an equivalence margin of ``min_effect``). The tune's repeats run back to back per
round, not paired by slot, so the test is unpaired.

Goodput is 0 for a run where no request met the SLO, and a ratio of zeros is no ratio (the
test works on logs). :func:`compare_goodput` therefore compares goodput wherever a repeat of
either side has requests within the SLO, and where every repeat of both sides has none, the
SLO miss factor instead (the largest median-to-bound ratio, :func:`bakeoff.measure.slo.slo_miss`;
lower is better), saying so in its sentence. Where some repeats reached the SLO and others did
not, goodput has no ratio either: the question becomes how often each side reached it, asked with
Fisher's exact test on the repeats with goodput above 0 (two-sided, at the verdict's ``ALPHA``):
a side that met the SLO in 4 of 4 repeats against 0 of 4 wins (p = 0.03); 3 of 3 against 0 of 3
(p = 0.1) stays ``undecided``, with what each side did. Never a ratio or a win on zeros.

A tune compares within a family — its finalists and the untuned start, or the groups' picks —
after choosing the best of it, so a caller passes the family's size (``among``): each test then
runs at ``ALPHA`` / the pairs of the family (:func:`bakeoff.analysis.best.pairwise`, Bonferroni
over every pair: the tune's repeats do not pair by round, so noise is not pooled), which keeps
every claim of the family, the choice included, at ``ALPHA``, and each sentence says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bakeoff.analysis.best import level_text, pairwise
from bakeoff.analysis.significance import ALPHA, MIN_EFFECT, Outcome, decide, mean_interval

Basis = Literal["figure", "slo_miss", "slo_reached"]
NO_SLO_MET = (
    "no configuration met the SLO at this load: compared by how far each missed it (median TTFT/TPOT against the bound)"
)


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: the outcome for ``a``, the ratio ``a / b``, and the report's sentence."""

    outcome: Outcome
    ratio: float | None
    text: str
    # slo_miss: the ratio is of SLO miss factors (lower is better); slo_reached: decided on how
    # many repeats reached the SLO at all (no ratio)
    basis: Basis = "figure"

    @property
    def change(self) -> float | None:
        return None if self.ratio is None else self.ratio - 1.0


def compare(
    a: Sequence[float],
    b: Sequence[float],
    better: Literal["higher", "lower"] = "higher",
    *,
    min_effect: float = MIN_EFFECT,
    among: int = 2,
) -> Comparison:
    """``a`` against ``b`` over their repeats (one figure per repeat), two of a family of ``among``."""
    alpha, family = pairwise(ALPHA, among)
    found = decide(list(a), list(b), better, min_effect=min_effect, alpha=alpha, family=family)
    return Comparison(found.outcome, found.ratio, found.text())


def compare_goodput(
    a: Sequence[float],
    b: Sequence[float],
    a_miss: Sequence[float],
    b_miss: Sequence[float],
    *,
    min_effect: float = MIN_EFFECT,
    among: int = 2,
) -> Comparison:
    """Goodput ``a`` against ``b`` (one figure per repeat), or their SLO misses where neither met the SLO once.

    ``among``: the size of the family the two belong to.
    """
    if a and b and all(v <= 0 for v in (*a, *b)) and a_miss and b_miss:
        alpha, family = pairwise(ALPHA, among)
        found = decide(list(a_miss), list(b_miss), "lower", min_effect=min_effect, alpha=alpha, family=family)
        return Comparison(found.outcome, found.ratio, f"{NO_SLO_MET}: {found.text(unit='SLO miss')}", "slo_miss")
    if any(v <= 0 for v in (*a, *b)):  # some repeats without a request in the SLO: no ratio to test
        return _reached_more_often(a, b, among)
    return compare(a, b, min_effect=min_effect, among=among)


def _reached_more_often(a: Sequence[float], b: Sequence[float], among: int) -> Comparison:
    """Which side reached the SLO (goodput above 0) in more of its repeats, by Fisher's exact test."""
    # scipy.stats costs about 1.5 s to import; only a tune where some repeats met no SLO needs it.
    from scipy.stats import fisher_exact

    a_met, b_met = (sum(1 for v in side if v > 0) for side in (a, b))
    table = [[a_met, len(a) - a_met], [b_met, len(b) - b_met]]
    p = float(fisher_exact(table, alternative="two-sided").pvalue)
    alpha, family = pairwise(ALPHA, among)
    level = f", {family}" if family else f" at {level_text(alpha)}"
    within = (
        f"requests within the SLO in {_share(a)} repeats against {_share(b)} (Fisher's exact test p = {p:.2g}{level})"
    )
    if p < alpha:
        outcome: Outcome = "win" if a_met / len(a) > b_met / len(b) else "loss"
        return Comparison(outcome, None, f"{outcome}: {within}", "slo_reached")
    return Comparison("undecided", None, f"undecided: {within}; a goodput of 0 has no ratio to test")


def _share(values: Sequence[float]) -> str:
    return f"{sum(1 for v in values if v > 0)} of {len(values)}"


def interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The interval of the mean of one configuration's repeats (None below two)."""
    return mean_interval(values)
