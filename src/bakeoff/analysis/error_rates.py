"""The verdict's error rates by simulation: how often it calls a win it should not, and finds one it should.

Two servers' repeat values are drawn (seeded numpy) with a true ratio between them and
per-run noise of a given coefficient of variation, either normal (``mean * (1 + cv * z)``) or
log-normal (``mean * exp(sigma * z)`` with the same CV, skewed), plus optionally a drift that
slot ``r`` shares across servers (what interleaving lets pairing cancel). Each draw is judged
by :func:`bakeoff.analysis.significance.decide_many`, the code the verdict runs, with fixed
repeats or with ``repeats: auto`` (a look after every round from ``min_repeats``, each at
``alpha / looks``, stopping at the first decided look).

``benchmarks/verdict_error_rates.py`` prints these rates; ``tests/test_significance.py`` bounds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bakeoff.analysis.significance import ALPHA, MIN_EFFECT, OUTCOMES, Floats, decide_many, look_alpha, planned_looks

Noise = Literal["normal", "lognormal"]
WIN, LOSS, EQUIVALENT, UNDECIDED = (OUTCOMES.index(o) for o in ("win", "loss", "equivalent", "undecided"))


def draw(
    rng: np.random.Generator, draws: int, repeats: int, cv: float, noise: Noise, drift: float = 0.0
) -> tuple[Floats, Floats]:
    """Log values of two identical-mean servers (draws x repeats each); ``drift``: CV of a shared per-slot factor."""
    shared = rng.standard_normal((draws, repeats)) * drift

    def one() -> Floats:
        z = rng.standard_normal((draws, repeats))
        if noise == "normal":
            logs: Floats = np.log(np.maximum(1.0 + cv * z, 1e-6)) + shared
            return logs
        skewed: Floats = math.sqrt(math.log1p(cv * cv)) * z + shared
        return skewed

    return one(), one()


@dataclass(frozen=True)
class Rates:
    win: float  # a called better than b
    loss: float  # a called worse than b
    equivalent: float
    undecided: float
    mean_repeats: float  # repeats per server used (auto: where it stopped)

    @property
    def called(self) -> float:
        """Win or loss: between identical servers, the false-win rate."""
        return self.win + self.loss


def rates(
    repeats: int,
    *,
    ratio: float = 1.0,
    cv: float = 0.12,
    noise: Noise = "lognormal",
    paired: bool = False,
    auto: tuple[int, int] | None = None,
    drift: float = 0.0,
    draws: int = 4000,
    seed: int = 1,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
) -> Rates:
    """Outcome shares of ``a`` (true ratio ``ratio`` against ``b``, higher better) over ``draws`` campaigns.

    ``auto``: (min_repeats, max_repeats) — ``repeats`` is then ignored.
    """
    rng = np.random.default_rng(seed)
    most = auto[1] if auto is not None else repeats
    log_a, log_b = draw(rng, draws, most, cv, noise, drift)
    log_a = log_a + math.log(ratio)
    if auto is None:
        found = decide_many(log_a, log_b, "higher", paired=paired, min_effect=min_effect, alpha=alpha).outcome
        used = np.full(draws, float(repeats))
    else:
        lo, hi = auto
        level = look_alpha(alpha, planned_looks(lo, hi))
        found = np.full(draws, UNDECIDED)
        used = np.full(draws, float(hi))
        open_ = np.ones(draws, dtype=bool)
        for n in range(lo, hi + 1):
            look = decide_many(
                log_a[:, :n], log_b[:, :n], "higher", paired=paired, min_effect=min_effect, alpha=level
            ).outcome
            stop = open_ & (look != UNDECIDED)
            found[stop], used[stop] = look[stop], n
            open_ &= ~stop
    win, loss, equivalent, undecided = (float(np.mean(found == code)) for code in (WIN, LOSS, EQUIVALENT, UNDECIDED))
    return Rates(win, loss, equivalent, undecided, float(used.mean()))
