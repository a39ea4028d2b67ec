"""The verdict among N servers: one family-wise level over every claim, the choice of the best included.

Error rates are simulated through :func:`bakeoff.analysis.verdict.judge` (the code the report
renders, :mod:`bakeoff.analysis.verdict_rates`), seeded. Each bound is a one-sided binomial
one: a true rate of 5% exceeds it by chance once in a thousand runs of the test, while the
per-pair tests this replaced (11-13% false among three identical servers, 30% among six) fail
it. ``benchmarks/verdict_error_rates.py`` gives the figures with more campaigns.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bakeoff.analysis.best import NOISE_SHARE, family, noise_test
from bakeoff.analysis.verdict import campaign_design, verdicts
from bakeoff.analysis.verdict_rates import level_rates
from bakeoff.report.tables import verdict_section
from verdict_planted import campaign

LEVEL = 0.05
CAMPAIGNS = 500


def bound(campaigns: int, rate: float = LEVEL) -> float:
    """The share of ``campaigns`` a true ``rate`` stays under 999 times in 1000."""
    return float(stats.binom.ppf(0.999, campaigns, rate)) / campaigns


@pytest.mark.parametrize(("servers", "repeats"), [(3, 3), (3, 5), (6, 3), (6, 5)])
def test_identical_servers_get_a_false_claim_in_at_most_5_percent_of_campaigns(servers: int, repeats: int) -> None:
    found = level_rates([1.0] * servers, repeats, campaigns=CAMPAIGNS, seed=10 * servers + repeats)
    assert found.false <= bound(CAMPAIGNS), found
    assert found.rules.get("pooled", 0.0) > 0.9  # equal noise in the same rounds: pooled, but for the noise test


def test_the_framework_verdicts_second_choice_adds_no_false_claim() -> None:
    frameworks = ["a", "a", "b", "b", "c", "c"]
    found = level_rates([1.0] * 6, 3, backends=frameworks, campaigns=CAMPAIGNS, seed=7)
    assert found.false <= bound(CAMPAIGNS) and found.false_frameworks <= found.false, found


def test_repeats_auto_holds_the_level_over_every_look() -> None:
    found = level_rates([1.0] * 3, 0, auto=(2, 5), campaigns=300, seed=8)
    assert found.false <= bound(300), found


def test_a_server_40_percent_faster_among_three_is_named_the_winner_at_5_repeats() -> None:
    found = level_rates([1.4, 1.0, 1.0], 5, campaigns=300, seed=9)
    # 81% over 2000 campaigns; per-pair tests at 5% each found 82%: honesty not bought with blindness.
    assert found.named["s0"] >= 0.70 and found.false <= bound(300), found
    unpaired = level_rates([1.4, 1.0, 1.0], 5, paired=False, campaigns=300, seed=9)
    assert unpaired.rules == {"pairwise": 1.0} and unpaired.named["s0"] < found.named["s0"]


def test_the_pooled_rule_is_tukeys_range_over_the_two_way_fit() -> None:
    rng = np.random.default_rng(3)
    logs = rng.standard_normal((4, 5)) * 0.1 + rng.standard_normal(5) * 0.05 + np.array([[0.3], [0.0], [0.02], [0.1]])
    samples = {f"s{i}": {r + 1: math.exp(v) for r, v in enumerate(row)} for i, row in enumerate(logs)}
    fam = family(samples, "higher", paired=True)
    assert fam.kind == "pooled" and "Tukey's studentized range" in fam.rule
    # The two-way ANOVA by its sums of squares: total - servers - rounds.
    grand = logs.mean()
    servers = 5 * np.square(logs.mean(axis=1) - grand).sum()
    rounds = 4 * np.square(logs.mean(axis=0) - grand).sum()
    error = np.square(logs - grand).sum() - servers - rounds
    df = 3 * 4
    q = stats.studentized_range.ppf(1 - LEVEL * (1 - NOISE_SHARE), 4, df)
    half = q * math.sqrt(error / df / 5)
    d = logs[0].mean() - logs[1].mean()
    won = fam.versus("s0", "s1")
    assert won.method == "Tukey's range on round-pooled log values" and won.p is None
    assert (won.ratio, won.lo, won.hi) == pytest.approx((math.exp(d), math.exp(d - half), math.exp(d + half)))
    assert won.outcome == "win" and "5% family-wise over 4 servers, 12 df" in won.text()


def test_where_noise_cannot_be_pooled_each_pair_is_tested_at_the_level_over_the_pairs() -> None:
    values = {"a": [100.0, 104.0, 98.0], "b": [90.0, 93.0, 88.0], "c": [99.0, 101.0, 97.0]}
    unpaired = family(values, "higher", paired=False)
    assert unpaired.kind == "pairwise" and "repeats not interleaved" in unpaired.rule
    d = unpaired.versus("b", "a")
    assert d.method == "Welch t on log values" and d.alpha == pytest.approx(LEVEL / 3)
    assert "Bonferroni over 3 pairs" in d.text()
    # One server's rounds swing 40% while the others' move together: its noise is not theirs.
    loud = [100.0, 140.0, 75.0, 130.0, 80.0, 120.0]
    quiet = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0]
    slots = {"a": loud, "b": quiet, "c": [v * 0.9 for v in quiet], "d": [v * 1.01 for v in quiet]}
    noisy = family({k: dict(enumerate(v, start=1)) for k, v in slots.items()}, "higher", paired=True)
    _, p = noise_test(np.log(np.array(list(slots.values()))))
    assert p < LEVEL * NOISE_SHARE and noisy.kind == "pairwise" and "a's noise is far from the others'" in noisy.rule
    assert noisy.versus("c", "b").method == "paired t on log ratios"


def test_equal_noise_is_sent_to_the_fallback_at_the_noise_tests_share_of_the_level() -> None:
    rng = np.random.default_rng(4)
    rejected = [noise_test(rng.standard_normal((3, 4)))[1] < LEVEL * NOISE_SHARE for _ in range(1000)]
    assert sum(rejected) / 1000 <= bound(1000, LEVEL * NOISE_SHARE)


def test_the_report_names_the_rule_and_its_level_for_its_servers(tmp_path: Path) -> None:
    runs = {
        "a": {4: [100.0, 104.0, 98.0, 102.0]},
        "b": {4: [103.0, 99.0, 101.0, 100.0]},
        "c": {4: [79.0, 78.0, 81.0, 77.5]},
    }
    folder = campaign(tmp_path, runs)
    (found,) = verdicts(folder)
    assert found.levels[4.0].family is not None and found.levels[4.0].family.kind == "pooled"
    text = verdict_section(folder)
    assert "compared by Tukey's studentized range at 4% over the log noise pooled across 3 servers" in text
    assert "5% family-wise over every comparison, the choice of the best included" in text
    assert "c: -2" in text and "5% family-wise over 3 servers, 6 df" in text
    two = campaign(tmp_path / "two", {k: runs[k] for k in ("a", "c")})
    assert "compared by one pair: the paired t by round on log values at 5%" in verdict_section(two)


def test_repeats_auto_splits_the_family_level_over_its_looks(tmp_path: Path) -> None:
    runs = {"a": {4: [100.0, 104.0, 98.0]}, "b": {4: [101.0, 103.0, 98.5]}, "c": {4: [78.0, 81.0, 76.5]}}
    folder = campaign(tmp_path, runs, repeats="auto", min_repeats=2, max_repeats=5)
    assert campaign_design(folder).alpha == pytest.approx(LEVEL / 4)
    (found,) = verdicts(folder)
    level = found.levels[4.0]
    assert level.family is not None and "1.25% family-wise" in level.family.rule
