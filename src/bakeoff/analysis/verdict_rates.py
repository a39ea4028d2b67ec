"""The verdict's error rates among N servers by simulation, through the code that renders it.

:mod:`.error_rates` simulates one pair of servers through the pairwise test. A campaign's
verdict does more: it *chooses* the best of N servers at a load, tests every other against
it, and names each framework's best configuration against the best framework's (a second
choice). Those choices are where false claims come from, so this module draws whole
campaigns — log-normal noise of a given CV per run, a round effect every server shares
(what an interleaved campaign pairs away), true ratios chosen per server — as
:class:`~bakeoff.results.summary.RunSummary` repeats and judges each with
:func:`bakeoff.analysis.verdict.judge`, the function the report calls.

A level's claims are false when they say a server loses to the best while it is truly at
least as good, or that it is equivalent to the best while truly further than ``min_effect``
from it ("X wins" is the conjunction of losses, so it is false when one of them is). The
framework verdict's claims are judged the same way.

``benchmarks/verdict_error_rates.py`` prints these rates; ``tests/test_verdict_rates.py`` bounds them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bakeoff.analysis.significance import ALPHA, MIN_EFFECT, look_alpha, planned_looks
from bakeoff.analysis.verdict import Design, LevelVerdict, Runs, Standing, judge, undecided
from bakeoff.measure.slo import Slo
from bakeoff.results.summary import Latency, Requests, RunSummary, Throughput, Tokens, WorkloadInfo

LOAD = 4
_TEMPLATE = RunSummary(
    requests=Requests(ok=100, failed=0),
    latency=Latency(),
    throughput=Throughput(output_tok_s=1.0, total_tok_s=1.0, req_s=1.0, window_s=1.0),
    tokens=Tokens(prompt=0, completion=0),
)


@dataclass(frozen=True)
class LevelRates:
    """Shares of simulated campaigns."""

    false: float  # some claim of the level's verdict (or the framework verdict) was false
    false_frameworks: float  # some claim of the framework verdict was false
    named: dict[str, float]  # server -> share of campaigns naming it the level's winner
    rules: dict[str, float]  # the rule the level's verdict ran (bakeoff.analysis.best.Rule) -> share of campaigns


def _repeat(value: float, repeat: int) -> RunSummary:
    """One repeat of a closed-loop run at ``LOAD`` with output tok/s ``value`` (the figure an unbounded SLO ranks)."""
    return _TEMPLATE.model_copy(
        update={
            "throughput": Throughput(output_tok_s=value, total_tok_s=value, req_s=value, window_s=1.0),
            "workload": WorkloadInfo(run=f"c{LOAD}", mode="closed", concurrency=LOAD, repeat=repeat),
        }
    )


def _false(standings: Sequence[Standing], truth: dict[str, float], min_effect: float) -> bool:
    """Whether any standing's claim against the first (the chosen best) is false, given true log figures."""
    if not standings or standings[0].against_best is not None:
        return False
    best = truth[standings[0].server]
    margin = math.log1p(min_effect)
    for s in standings[1:]:
        d = s.against_best
        if d is None:
            continue
        gap = truth[s.server] - best
        if (d.outcome == "loss" and gap >= 0) or (d.outcome == "equivalent" and abs(gap) > margin + 1e-12):
            return True
    return False


def level_rates(
    ratios: Sequence[float],
    repeats: int,
    *,
    backends: Sequence[str] | None = None,
    cv: float = 0.12,
    drift: float = 0.05,
    paired: bool = True,
    auto: tuple[int, int] | None = None,
    campaigns: int = 600,
    seed: int = 1,
    min_effect: float = MIN_EFFECT,
    alpha: float = ALPHA,
) -> LevelRates:
    """Shares over ``campaigns`` of the verdict at one load of servers whose true figures are ``ratios``.

    ``backends``: each server's framework (default: one framework, no framework verdict);
    ``drift``: SD on the log scale of the effect a round shares across servers; ``paired``:
    the campaign interleaved (each repeat's round is known) or not. ``auto``: (min_repeats,
    max_repeats) of ``repeats: auto`` — ``repeats`` is then ignored: the verdict is taken after
    every round from the first, each at ``alpha`` / the planned looks, until
    :func:`bakeoff.analysis.verdict.undecided` finds nothing left open, as a campaign stops.
    """
    rng = np.random.default_rng(seed)
    names = [f"s{i}" for i in range(len(ratios))]
    truth = {name: math.log(r) for name, r in zip(names, ratios, strict=True)}
    backend_of = dict(zip(names, backends, strict=True)) if backends is not None else dict.fromkeys(names, "x")
    sigma = math.sqrt(math.log1p(cv * cv))
    first, most = auto if auto is not None else (repeats, repeats)
    level = look_alpha(alpha, planned_looks(first, most)) if auto is not None else alpha
    design = Design(min_effect, level, paired)
    false = false_frameworks = 0
    named: dict[str, int] = dict.fromkeys(names, 0)
    rules: dict[str, int] = {}
    for _ in range(campaigns):
        rounds = rng.standard_normal(most) * drift
        logs = rng.standard_normal((len(names), most)) * sigma + rounds
        for n in range(first, most + 1):
            runs: Runs = {
                name: {float(LOAD): [_repeat(100.0 * math.exp(truth[name] + x), r + 1) for r, x in enumerate(row[:n])]}
                for name, row in zip(names, logs, strict=True)
            }
            found = judge("w", "concurrency", runs, Slo(), design, backend_of)
            if not undecided([found]):
                break
        verdict: LevelVerdict = found.levels[float(LOAD)]
        fw = found.frameworks.get(float(LOAD))
        wrong_fw = fw is not None and fw.best is not None and _false([fw.best, *fw.others], truth, min_effect)
        false += _false(verdict.standings, truth, min_effect) or wrong_fw
        false_frameworks += wrong_fw
        if verdict.winner is not None:
            named[verdict.winner] += 1
        rule = verdict.family.kind if verdict.family is not None else "none"
        rules[rule] = rules.get(rule, 0) + 1
    return LevelRates(
        false / campaigns,
        false_frameworks / campaigns,
        {k: v / campaigns for k, v in named.items()},
        {k: v / campaigns for k, v in rules.items()},
    )
