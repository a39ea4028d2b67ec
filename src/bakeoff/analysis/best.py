"""Comparisons with the best of several servers: one family-wise level over every claim, the choice included.

The verdict at a load *chooses* the best server and then tests every other against it; the
framework verdict chooses each framework's best configuration and then the best of those; a
tune chooses its best finalist. A chosen lead is the largest of several noisy figures, biased
upward, and every test adds its own chance of a false claim: per-pair tests at 5% printed a
false "loses by" in 11-13% of campaigns of three identical servers and 30% of six. This module
holds all comparisons among the servers of one family (those meeting the SLO at a load) to one
level ``alpha``: the chance that *any* claim printed about them — a loss, a win, an
equivalence — is false is at most ``alpha``, whichever server the data made the best. Each
rule gives intervals that cover every pair's true ratio at once, so whatever pair a choice
lands on is covered, and a claim read off its interval holds at the family's level:

- **pooled** (three or more servers measured in the same rounds): an interleaved campaign is
  a randomized complete block design with the rounds as blocks. A two-way fit on log values
  (server + round) pools the residual noise of every server into one estimate with
  ``(k-1)(r-1)`` degrees of freedom, where a pair alone has ``r-1``, and Tukey's studentized
  range at ``alpha`` (:func:`scipy.stats.studentized_range`) spans every difference at once
  (Tukey's HSD for a block design). The extra degrees of freedom win back most of what the
  correction costs: a server truly 40% faster than two others, at 5 repeats and 12% noise, is
  named the winner about as often as by uncorrected per-pair tests.
- **corrected pairwise** where the noise cannot be pooled: repeats not paired by round (no
  blocks), or one server's noise far from the others' (Cochran's C — the largest share of the
  residual sum of squares one server holds — beyond its ``alpha / 5`` point under equal noise,
  found by a seeded simulation of the same fit: :func:`noise_test`; the range then runs at
  ``alpha * 4/5``, so the two together hold ``alpha``). Each pair is then tested on its own
  (:func:`bakeoff.analysis.significance.decide`: the paired t by round, else Welch's t on
  log values) at ``alpha`` / the number of pairs, Bonferroni over *every* pair, which covers
  any choice. Pooling a server three times noisier than the others would claim falsely in
  7-11% of campaigns; at 3-5 repeats the test catches such a server in 2% (3 servers, 3
  repeats) to 47% (6 servers, 5 repeats) of them: small campaigns cannot tell noise apart.
- **two servers**: one comparison, the paired t (Welch where repeats do not pair) at
  ``alpha``. The pooled fit of two servers is exactly the paired t.

Each :class:`Family` says which rule ran and why (:attr:`Family.rule`), for the report's
methods line. Repeats added until decided (``repeats: auto``) make a family at every look, each
at ``alpha / looks`` (:func:`bakeoff.analysis.significance.look_alpha`), so the level holds
over every look and every choice of the best made in them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.special import ndtr, stdtrit

from bakeoff.analysis.significance import (
    ALPHA,
    MIN_EFFECT,
    OUTCOMES,
    POWER,
    Better,
    Decision,
    Floats,
    classify,
    decide,
    repeats_needed,
)

Sample = Sequence[float] | Mapping[int, float]  # repeat values, or round (slot) -> value
Rule = Literal["none", "one pair", "pooled", "pairwise"]  # the rule a family ran, as the module's docstring names them
# The share of a family's level spent on testing for equal noise. A campaign's claims can be
# false when the pooled rule ran and was wrong (at most its level) or when the noise test sent
# equal-noise servers to the fallback (at most the test's level, whatever the fallback then
# says: the campaigns the test rejects are those where one server strayed, and the fallback's
# per-pair tests called a false loss in a quarter of them). Tukey's range at alpha * 0.8 and
# the test at alpha * 0.2 keep the sum at alpha.
NOISE_SHARE = 0.2
_NULL_DRAWS = 20_000  # simulated campaigns behind Cochran's C under equal noise: its 5% point within about 0.3%


def level_text(alpha: float) -> str:
    """``5%``, ``1.25%``."""
    return f"{alpha * 100:.3g}%"


def pairs(k: int) -> int:
    """Every pair among ``k`` servers: what the corrected pairwise rule divides ``alpha`` by."""
    return k * (k - 1) // 2


def pairwise(alpha: float, k: int) -> tuple[float, str | None]:
    """Each pair's level when ``k`` servers are compared pair by pair at family-wise ``alpha``, and its note."""
    m = pairs(k)
    if m <= 1:
        return alpha, None
    return alpha / m, f"at {level_text(alpha / m)}: {level_text(alpha)} family-wise, Bonferroni over {m} pairs"


def _residuals(logs: Floats) -> Floats:
    """Residuals of the two-way fit (server + round) of ``logs`` (..., servers, rounds)."""
    grand = logs.mean(axis=(-2, -1))[..., None, None]
    fitted = logs.mean(axis=-1, keepdims=True) + logs.mean(axis=-2, keepdims=True) - grand
    residual: Floats = logs - fitted
    return residual


def _cochran(logs: Floats) -> Floats:
    """Cochran's C of the fit's residuals: the largest share of the residual sum of squares one server holds."""
    per_server = np.square(_residuals(logs)).sum(axis=-1)
    total = per_server.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        share: Floats = np.where(total > 0, per_server.max(axis=-1) / np.where(total > 0, total, 1.0), 0.0)
    return share


@functools.lru_cache(maxsize=64)
def _cochran_null(servers: int, rounds: int) -> Floats:
    """Cochran's C of campaigns whose servers' noise is equal, sorted (seeded: the same answer every time).

    Its distribution depends on nothing but the design: the statistic is free of the noise's
    scale and of the rounds' and servers' effects, which the fit removes.
    """
    rng = np.random.default_rng(20_240_523)
    null: Floats = np.sort(_cochran(rng.standard_normal((_NULL_DRAWS, servers, rounds))))
    return null


def noise_test(logs: Floats) -> tuple[float, float]:
    """(Cochran's C, its p-value under equal noise) of one campaign's log values (servers x rounds)."""
    c = float(_cochran(logs))
    null = _cochran_null(*logs.shape)
    p = float(len(null) - np.searchsorted(null, c - 1e-12, side="left")) / len(null)
    return c, p


@functools.lru_cache(maxsize=256)
def _tukey(k: int, df: float, alpha: float) -> float:
    """Tukey's critical value for one difference of two means in standard errors: q(1 - alpha; k, df) / sqrt 2."""
    # scipy.stats costs over a second to import: paid only where three or more servers meet.
    from scipy.stats import studentized_range

    return float(studentized_range.ppf(1 - alpha, k, df)) / math.sqrt(2.0)


def _as_slots(sample: Sample) -> Mapping[int, float] | None:
    return sample if isinstance(sample, Mapping) else None


@dataclass(frozen=True)
class _Pooled:
    """The two-way fit of the servers' log values over their common rounds."""

    means: dict[str, float]  # server -> mean log value over the rounds
    noise: float  # residual SD of a run, pooled over every server: about the CV
    df: int
    rounds: int
    crit: float  # Tukey's, in standard errors of a difference


@dataclass(frozen=True)
class Family:
    """Every comparison among one family of servers, at one level; :meth:`versus` gives any pair's decision."""

    better: Better
    alpha: float
    min_effect: float
    kind: Rule
    rule: str  # which rule ran, at what level, and why: the report's methods line
    samples: dict[str, Sample]
    paired: bool
    pooled: _Pooled | None = None
    note: str | None = None  # what each decision's text adds: the family it belongs to

    def versus(self, a: str, b: str) -> Decision:
        """``a`` against ``b`` (both of this family), at the family's level."""
        if self.pooled is None:
            each, _ = pairwise(self.alpha, len(self.samples))
            return decide(
                self.samples[a],
                self.samples[b],
                self.better,
                paired=self.paired,
                min_effect=self.min_effect,
                alpha=each,
                family=self.note,
            )
        fit = self.pooled
        d = fit.means[a] - fit.means[b]
        se = fit.noise * math.sqrt(2.0 / fit.rounds)
        exact = se <= 1e-12 * max(abs(d), 1.0)
        half = 0.0 if exact else fit.crit * se
        significant = abs(d) > 1e-12 if exact else abs(d) > half
        code = classify(np.array([d]), np.array([d - half]), np.array([d + half]), np.array([significant]),
                        self.better, self.min_effect)  # fmt: skip
        detectable = 0.0 if exact else math.expm1((fit.crit + float(stdtrit(fit.df, POWER))) * se)
        return Decision(
            OUTCOMES[int(code[0])],
            self.better,
            math.exp(d),
            math.exp(d - half),
            math.exp(d + half),
            None,
            "Tukey's range on round-pooled log values",
            fit.rounds,
            fit.rounds,
            fit.noise,
            detectable,
            repeats_needed(fit.noise, self.min_effect, _per_pair_level(len(fit.means), self.alpha), paired=True),
            self.min_effect,
            self.alpha,
            family=self.note,
        )


@functools.lru_cache(maxsize=64)
def _per_pair_level(k: int, alpha: float) -> float:
    """The two-sided level of one pair's test that Tukey's range at ``alpha`` amounts to, with many rounds.

    What the repeats needed for a ``min_effect`` difference are counted at: with more rounds the
    range's critical value falls towards this one, so the count is neither flattering nor far off.
    """
    return float(2.0 * (1.0 - ndtr(_tukey(k, math.inf, alpha))))


def family(
    samples: Mapping[str, Sample],
    better: Better,
    *,
    paired: bool,
    min_effect: float = MIN_EFFECT,
    alpha: float = ALPHA,
) -> Family:
    """The family of ``samples`` (server -> repeat values, or round -> value where ``paired``) at level ``alpha``."""
    named = dict(samples)
    k = len(named)
    test = "the paired t by round on log values" if paired else "Welch's t on log values"
    if k < 2:
        return Family(better, alpha, min_effect, "none", "no pair to compare", named, paired)
    if k == 2:
        rule = f"one pair: {test} at {level_text(alpha)}"
        return Family(better, alpha, min_effect, "one pair", rule, named, paired)
    why = _unpoolable(named, paired)
    if why is None:
        common = sorted(set.intersection(*(set(_as_slots(s) or {}) for s in named.values())))
        logs = np.log([[(_as_slots(s) or {})[r] for r in common] for s in named.values()])
        c, p = noise_test(logs)
        test_level, range_level = alpha * NOISE_SHARE, alpha * (1 - NOISE_SHARE)
        if p >= test_level:
            df = (k - 1) * (len(common) - 1)
            noise = math.sqrt(float(np.square(_residuals(logs)).sum()) / df)
            means = dict(zip(named, (float(m) for m in logs.mean(axis=1)), strict=True))
            pooled = _Pooled(means, noise, df, len(common), _tukey(k, df, range_level))
            rule = (
                f"Tukey's studentized range at {level_text(range_level)} over the log noise pooled across {k} "
                f"servers and {len(common)} rounds (server + round fit, {df} degrees of freedom), after Cochran's C "
                f"at {level_text(test_level)} found no server's noise far from the others' (p = {p:.2g}): "
                f"{level_text(alpha)} family-wise over every comparison, the choice of the best included"
            )
            pooled_note = f"{level_text(alpha)} family-wise over {k} servers, {df} df"
            return Family(better, alpha, min_effect, "pooled", rule, named, paired, pooled, pooled_note)
        noisiest = list(named)[int(np.argmax(np.square(_residuals(logs)).sum(axis=1)))]
        why = (
            f"{noisiest}'s noise is far from the others' (Cochran's C = {c:.2f}, p = {p:.2g} < "
            f"{level_text(test_level)})"
        )
    each, note = pairwise(alpha, k)
    rule = (
        f"{test} per pair at {level_text(each)} (Bonferroni over all {pairs(k)} pairs: {level_text(alpha)} "
        f"family-wise, the choice of the best included); noise not pooled: {why}"
    )
    return Family(better, alpha, min_effect, "pairwise", rule, named, paired, None, note)


def _unpoolable(samples: Mapping[str, Sample], paired: bool) -> str | None:
    """Why the servers' noise cannot be pooled by round; None where it can (then :func:`noise_test` decides)."""
    if not paired:
        return "repeats not interleaved, so no rounds to pool over"
    slots = [_as_slots(s) for s in samples.values()]
    if any(s is None for s in slots):
        return "a server's repeats do not say their round"
    common = set.intersection(*(set(s or {}) for s in slots))
    if len(common) < 2:
        return "fewer than two rounds every server ran"
    if any(v <= 0 or not math.isfinite(v) for s in slots for r, v in (s or {}).items() if r in common):
        return "a repeat's figure is not positive"
    return None
