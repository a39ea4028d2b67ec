"""The verdict's test: agreement with scipy, and its error rates by seeded simulation (false wins, power)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from bakeoff.analysis.error_rates import rates
from bakeoff.analysis.significance import decide, detectable_log, repeats_needed

LEVEL = 0.05
ALLOWANCE = 0.012  # about 3 standard errors of a 5% rate over 4000 draws


def test_welch_and_paired_agree_with_scipy_on_log_values() -> None:
    a, b = [104.0, 97.0, 111.0, 101.0], [92.0, 99.0, 88.0, 95.0]
    welch = decide(a, b, "higher")
    ref = stats.ttest_ind(np.log(a), np.log(b), equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert welch.method == "Welch t on log values" and welch.p == pytest.approx(ref.pvalue)
    assert (welch.lo, welch.hi) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    paired = decide(dict(enumerate(a)), dict(enumerate(b)), "higher", paired=True)
    ref_rel = stats.ttest_rel(np.log(a), np.log(b))
    ci_rel = ref_rel.confidence_interval(0.95)
    assert paired.method == "paired t on log ratios" and paired.p == pytest.approx(ref_rel.pvalue)
    assert (paired.lo, paired.hi) == pytest.approx((math.exp(ci_rel.low), math.exp(ci_rel.high)))


def test_pairing_needs_common_rounds_and_noise_free_ratios_are_exact() -> None:
    # Rounds 1 and 3 only on one side each: one common slot is no pair, so Welch is used.
    lone = decide({1: 100.0, 2: 104.0}, {2: 101.0, 3: 99.0}, "higher", paired=True)
    assert lone.method == "Welch t on log values"
    same = decide([100.0, 100.0], [100.0, 100.0], "higher")
    assert same.outcome == "equivalent" and same.ratio == pytest.approx(1.0)
    faster = decide([130.0, 130.0], [100.0, 100.0], "higher")
    assert faster.outcome == "win" and faster.change == pytest.approx(0.30) and faster.lo == faster.hi
    assert decide([130.0, 130.0], [100.0, 100.0], "lower").outcome == "loss"
    # Significant but smaller than the margin, and not shown inside it: neither a win nor equivalent.
    small = decide([103.0, 103.5, 102.5], [100.0, 100.5, 99.5], "higher", min_effect=0.05)
    assert small.p is not None and small.p < LEVEL and small.outcome in ("equivalent", "undecided")
    assert small.outcome != "win"
    bad = decide([0.0, 1.0], [1.0, 1.0], "higher")
    assert bad.outcome == "undecided" and bad.why is not None and "positive" in bad.why


def test_the_repeats_needed_are_the_fewest_that_detect_min_effect() -> None:
    noise, effect = 0.12, 0.05
    n = repeats_needed(noise, effect, LEVEL, paired=False)
    assert n is not None and n > 10  # 12% noise cannot tell 5% with a handful of repeats

    def detects(k: int) -> bool:
        return detectable_log(noise * math.sqrt(2 / k), 2 * k - 2, LEVEL) <= math.log1p(effect)

    assert detects(n) and not detects(n - 1)
    assert repeats_needed(0.0, effect, LEVEL, paired=False) == 2
    unclear = decide([100.0, 112.0, 88.0], [103.0, 94.0, 109.0], "higher")
    assert unclear.outcome == "undecided" and unclear.needed is not None and unclear.needed > 3
    assert f"{unclear.needed} repeats would tell a 5% difference" in unclear.text()


@pytest.mark.parametrize("noise", ["normal", "lognormal"])
@pytest.mark.parametrize("paired", [False, True])
def test_identical_servers_are_called_different_at_most_5_percent_of_the_time(noise: str, paired: bool) -> None:
    for n in (2, 3, 5, 10):
        found = rates(n, noise=noise, paired=paired, seed=n)
        assert found.called <= LEVEL + ALLOWANCE, (n, found)
    for auto in ((2, 5), (2, 10)):
        found = rates(0, noise=noise, paired=paired, auto=auto, seed=auto[1])
        assert found.called <= LEVEL + ALLOWANCE, (auto, found)


def test_without_the_look_correction_auto_repeats_would_call_false_wins() -> None:
    # The same sequential rule at the full level on every look: what the Bonferroni split prevents.
    naive = rates(0, auto=(2, 10), alpha=0.05 * 9, seed=3)
    assert naive.called > LEVEL + ALLOWANCE


def test_a_30_percent_difference_is_found_at_5_repeats_with_12_percent_noise() -> None:
    assert rates(5, ratio=1.3, seed=11).win >= 0.80
    # Paired rounds give up degrees of freedom; they pay where a round's drift hits both servers.
    # 12% per run, half of its variance a drift the round shares (cv and drift 8.5% each).
    paired = rates(5, ratio=1.3, cv=0.085, drift=0.085, paired=True, seed=12)
    unpaired = rates(5, ratio=1.3, cv=0.085, drift=0.085, paired=False, seed=12)
    assert paired.win >= 0.80 and paired.win > unpaired.win + 0.03
    auto = rates(0, ratio=1.3, auto=(2, 10), seed=13)
    assert auto.win >= 0.80 and auto.mean_repeats < 10 and auto.loss == 0.0


def test_every_verdict_states_the_difference_its_repeats_could_detect() -> None:
    won = decide([130.0, 128.0, 133.0], [100.0, 101.0, 99.0], "higher")
    assert won.outcome == "win" and "3 repeats detect a " in won.text() and "would tell" not in won.text()
    # An open question also says how many repeats would settle the practical margin.
    open_question = decide([104.0, 96.0, 110.0], [100.0, 93.0, 107.0], "higher")
    assert open_question.outcome == "undecided" and "would tell a 5% difference" in open_question.text()
