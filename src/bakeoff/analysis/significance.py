"""Is one server better than another? A test whose false-win rate is the stated level from 2 repeats up.

The repeat (one run of a cell) is the unit of evidence. Throughput and latency differences
are multiplicative, so every test works on log values and reports a *ratio* (``a / b``):

- **paired t on log ratios** where the campaign interleaves its repeats: repeat ``r`` of every
  server ran in the same round (slot), so the per-slot ratio cancels drift over the campaign
  (heat, a neighbour loading the host). Pairing costs degrees of freedom (``n - 1``), so it is
  chosen by the campaign's design (``interleave``), never after seeing the data;
- **Welch's t on log values** otherwise (and where fewer than two slots pair up).

The ratio's ``1 - alpha`` interval comes from the same t distribution. With the practical
margin ``min_effect`` (``m``; a ratio outside ``[1/(1+m), 1+m]`` matters) there are three
outcomes, for ``a`` against ``b``:

- ``win`` / ``loss``: the difference is significant (the interval excludes 1, p < alpha) *and*
  the point estimate is at least the margin (``|log ratio| >= log(1+m)``), on ``a``'s good or
  bad side. Between identical servers this happens at most ``alpha`` of the time;
- ``equivalent``: the whole interval lies inside ``[1/(1+m), 1+m]`` (two one-sided tests at
  ``alpha / 2`` each: stricter than the usual TOST, because the interval shown is the one judged);
- ``undecided``: neither — more repeats are needed, and :attr:`Decision.needed` says how many.

Every decision also states what the data could tell: the smallest difference these repeats
detect with 80% power at the observed noise (:attr:`Decision.detectable`), and the repeats
per server that would detect a ``min_effect`` difference (:attr:`Decision.needed`).

Repeats added until decided (``repeats: auto``) look at the data several times; each look
then tests at ``alpha / looks`` (:func:`look_alpha`, a Bonferroni split over the planned
looks), which keeps the overall false-win rate at ``alpha``.

The core (:func:`decide_many`) is vectorised over rows so the error-rate simulations test the
very code the verdict runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

# Student's t through scipy.special: ``stdtrit(df, q)`` is ``scipy.stats.t.ppf(q, df)`` and
# ``stdtr(df, -t)`` is ``scipy.stats.t.sf(t, df)`` (the very functions scipy.stats.t calls, same
# values), without importing scipy.stats, which costs over a second in every process that loads
# this module: each CLI command and each cell's notebook kernel.
from scipy.special import stdtr, stdtrit

Better = Literal["higher", "lower"]
Outcome = Literal["win", "loss", "equivalent", "undecided"]
Method = Literal["paired t on log ratios", "Welch t on log values", "Tukey's range on round-pooled log values"]
OUTCOMES: tuple[Outcome, ...] = ("win", "loss", "equivalent", "undecided")  # codes 0..3 of decide_many
DECIDED: frozenset[str] = frozenset({"win", "loss", "equivalent"})

ALPHA = 0.05
MIN_EFFECT = 0.05  # a serving team does not switch frameworks for less than 5%
POWER = 0.80
MAX_NEEDED = 10_000  # repeats beyond this are reported as "more than"

Floats = npt.NDArray[np.float64]


def look_alpha(alpha: float, looks: int) -> float:
    """The level of each look when the data is tested ``looks`` times (Bonferroni)."""
    return alpha / max(looks, 1)


def planned_looks(min_repeats: int, max_repeats: int) -> int:
    """Tests made by ``repeats: auto``: one after every round from ``min_repeats`` to ``max_repeats``."""
    return max(max_repeats - min_repeats + 1, 1)


@dataclass(frozen=True)
class Tested:
    """:func:`decide_many`'s answer, one entry per row."""

    outcome: npt.NDArray[np.int64]  # index into OUTCOMES
    log_ratio: Floats
    lo: Floats
    hi: Floats
    p: Floats
    se: Floats
    df: Floats


def decide_many(
    log_a: Floats,
    log_b: Floats,
    better: Better,
    *,
    paired: bool,
    min_effect: float = MIN_EFFECT,
    alpha: float = ALPHA,
) -> Tested:
    """Test every row of ``log_a`` (rows x repeats) against the same row of ``log_b``.

    Paired rows must have the same length, repeat ``i`` of both in slot ``i``. Rows need at
    least two repeats per side. A row without noise (every repeat identical) has an exact
    ratio: significant unless it is 1.
    """
    log_a, log_b = np.atleast_2d(log_a), np.atleast_2d(log_b)
    if paired:
        diff = log_a - log_b
        n = diff.shape[1]
        d = diff.mean(axis=1)
        se = diff.std(axis=1, ddof=1) / math.sqrt(n)
        df = np.full_like(d, n - 1.0)
    else:
        na, nb = log_a.shape[1], log_b.shape[1]
        d = log_a.mean(axis=1) - log_b.mean(axis=1)
        va, vb = log_a.var(axis=1, ddof=1) / na, log_b.var(axis=1, ddof=1) / nb
        se = np.sqrt(va + vb)
        with np.errstate(divide="ignore", invalid="ignore"):  # Welch-Satterthwaite; no noise: any df
            df = np.where(se > 0, (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1)), na + nb - 2.0)
    crit = stdtrit(df, 1 - alpha / 2)
    exact = se <= 1e-12 * np.maximum(np.abs(d), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(exact, np.inf, np.abs(d) / np.where(exact, 1.0, se))
    p = np.where(exact & (np.abs(d) <= 1e-12), 1.0, 2 * stdtr(df, -t))
    half = np.where(exact, 0.0, crit * se)
    lo, hi = d - half, d + half
    return Tested(classify(d, lo, hi, p < alpha, better, min_effect), d, lo, hi, p, se, df)


def classify(
    d: Floats, lo: Floats, hi: Floats, significant: npt.NDArray[np.bool_], better: Better, min_effect: float
) -> npt.NDArray[np.int64]:
    """Codes into OUTCOMES of log ratios ``d`` with intervals ``[lo, hi]``: the one rule every test's verdict follows.

    A win or loss is significant and at least the margin; equivalent lies wholly inside it.
    """
    margin = math.log1p(min_effect)
    good = d > 0 if better == "higher" else d < 0
    big = np.abs(d) >= margin - 1e-12
    inside = (lo >= -margin) & (hi <= margin)
    outcome = np.where(significant & big, np.where(good, 0, 1), np.where(inside, 2, 3))
    return outcome.astype(np.int64)


def detectable_log(se: float, df: float, alpha: float, power: float = POWER) -> float:
    """The smallest |log ratio| a two-sided t test at ``alpha`` detects with ``power``, at standard error ``se``."""
    return float((stdtrit(df, 1 - alpha / 2) + stdtrit(df, power)) * se)


def repeats_needed(noise: float, min_effect: float, alpha: float, *, paired: bool, power: float = POWER) -> int | None:
    """Repeats per server that detect a ``min_effect`` ratio with ``power`` at per-run ``noise`` (SD of log values).

    None: more than :data:`MAX_NEEDED`. Paired slots are taken as independent noise (the
    conservative case: drift shared by a slot only makes pairing need fewer).
    """
    target = math.log1p(min_effect)
    if noise <= 0:
        return 2

    def enough(n: int) -> bool:
        df = n - 1.0 if paired else 2.0 * n - 2.0
        return detectable_log(noise * math.sqrt(2.0 / n), df, alpha, power) <= target

    if not enough(MAX_NEEDED):
        return None
    lo, hi = 1, 2  # enough(hi) once the doubling stops; the detectable difference falls with n
    while not enough(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class Decision:
    """``a`` against ``b`` on one figure: the ratio ``a / b``, its interval, the outcome and what it could tell."""

    outcome: Outcome
    better: Better
    ratio: float | None  # a / b: geometric means (paired: geometric mean of the slot ratios)
    lo: float | None
    hi: float | None
    p: float | None
    method: Method | None
    n_a: int
    n_b: int
    noise: float | None  # run-to-run noise per server: SD of log values, about the CV
    detectable: float | None  # smallest relative difference these repeats detect (80% power)
    needed: int | None  # repeats per server to detect a min_effect difference at this noise (None: too many)
    min_effect: float
    alpha: float
    why: str | None = None  # no test could be made, and why
    family: str | None = None  # the comparison is one of several held to one level: how (bakeoff.analysis.best)

    @property
    def change(self) -> float | None:
        """``a / b - 1``: +0.14 is 14% more of the figure (which may be good or bad: see ``better``)."""
        return None if self.ratio is None else self.ratio - 1.0

    @property
    def decided(self) -> bool:
        return self.outcome in DECIDED

    def interval_text(self) -> str:
        """``+14.4% [-3.1%, +35.0%]`` (relative change of a against b), or why there is none."""
        if self.ratio is None:
            return "no ratio"
        point = f"{self.ratio - 1:+.1%}"
        if self.lo is None or self.hi is None:
            return point
        return f"{point} [{self.lo - 1:+.1%}, {self.hi - 1:+.1%}]"

    def evidence(self) -> str:
        """What the repeats could tell: the detectable difference, and the repeats a min_effect difference needs."""
        if self.why is not None:
            return self.why
        noise = f"{self.noise:.0%}" if self.noise is not None else "unknown"
        n = min(self.n_a, self.n_b)
        parts = []
        if self.detectable is not None:
            parts.append(f"{n} repeats detect a {self.detectable:.0%} difference at today's {noise} noise")
        # How many repeats would settle min_effect: only for an open question.
        if self.outcome == "undecided" and self.needed is None:
            parts.append(f"more than {MAX_NEEDED:,} repeats would be needed to tell {self.min_effect:.0%}")
        elif self.outcome == "undecided" and self.needed is not None and self.needed > n:
            parts.append(f"{self.needed} repeats would tell a {self.min_effect:.0%} difference")
        return "; ".join(parts)

    def text(self, unit: str = "", against: str | None = None) -> str:
        """``-18.0% [-25.1%, -10.2%] goodput req/s vs a (Welch t on log values, n=3 vs 3, p=0.002) → loss``.

        Every outcome adds what the repeats could tell (the difference they detect at today's
        noise; for an open question, the repeats that would settle min_effect).
        """
        if self.why is not None:
            return f"{self.outcome}: {self.why}"
        what = "".join((f" {unit}" if unit else "", f" vs {against}" if against else ""))
        how = ", ".join(
            part
            for part in (
                self.method,
                f"n={self.n_a} vs {self.n_b}",
                f"p={self.p:.2g}" if self.p is not None else None,
                self.family,
            )
            if part
        )
        text = f"{self.interval_text()}{what} ({how}) → {self.outcome}"
        evidence = self.evidence()
        return f"{text}: {evidence}" if evidence else text


def _slots(values: Sequence[float] | Mapping[int, float]) -> dict[int, float]:
    if isinstance(values, Mapping):
        return {int(k): float(v) for k, v in values.items()}
    return {i: float(v) for i, v in enumerate(values, start=1)}


def decide(
    a: Sequence[float] | Mapping[int, float],
    b: Sequence[float] | Mapping[int, float],
    better: Better,
    *,
    paired: bool = False,
    min_effect: float = MIN_EFFECT,
    alpha: float = ALPHA,
    family: str | None = None,
) -> Decision:
    """``a`` against ``b`` over their repeats (a mapping is slot -> value: repeat ``r`` ran in round ``r``).

    ``paired``: the repeats were interleaved, so the same slot is a pair; fewer than two common
    slots fall back to Welch. Below two repeats a side, or with a value that is not positive
    (a ratio needs positive figures), the outcome is ``undecided`` with the reason. ``family``:
    this comparison is one of several whose ``alpha`` was set for all of them, said how in its text.
    """
    sa, sb = _slots(a), _slots(b)

    def undecided(why: str) -> Decision:
        return Decision("undecided", better, None, None, None, None, None, len(sa), len(sb), None, None, None,
                        min_effect, alpha, why, family)  # fmt: skip

    if min(len(sa), len(sb)) < 2:
        return undecided(f"{min(len(sa), len(sb))} repeat(s) on one side: no noise to judge against (need ≥2)")
    if any(v <= 0 or not math.isfinite(v) for v in (*sa.values(), *sb.values())):
        return undecided("a repeat's figure is not positive: no ratio to test")
    common = sorted(set(sa) & set(sb))
    pair = paired and len(common) >= 2
    if pair:
        xa = np.log([sa[s] for s in common])
        xb = np.log([sb[s] for s in common])
    else:
        xa, xb = np.log(list(sa.values())), np.log(list(sb.values()))
    found = decide_many(xa[None, :], xb[None, :], better, paired=pair, min_effect=min_effect, alpha=alpha)
    d, lo, hi, se, df = (float(v[0]) for v in (found.log_ratio, found.lo, found.hi, found.se, found.df))
    if pair:
        noise = float(np.std(xa - xb, ddof=1)) / math.sqrt(2.0)
    else:
        noise = math.sqrt((float(np.var(xa, ddof=1)) + float(np.var(xb, ddof=1))) / 2.0)
    detectable = math.expm1(detectable_log(se, df, alpha)) if se > 0 else 0.0
    return Decision(
        OUTCOMES[int(found.outcome[0])],
        better,
        math.exp(d),
        math.exp(lo),
        math.exp(hi),
        float(found.p[0]),
        "paired t on log ratios" if pair else "Welch t on log values",
        len(xa),
        len(xb),
        noise,
        detectable,
        repeats_needed(noise, min_effect, alpha, paired=pair),
        min_effect,
        alpha,
        family=family,
    )


def mean_interval(values: Sequence[float], alpha: float = ALPHA) -> tuple[float, float] | None:
    """The Student-t ``1 - alpha`` interval of the mean of ``values``; None below two values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        return None
    se = float(arr.std(ddof=1)) / math.sqrt(arr.size)
    half = float(stdtrit(arr.size - 1, 1 - alpha / 2)) * se
    mean = float(arr.mean())
    return mean - half, mean + half
