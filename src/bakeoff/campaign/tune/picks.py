"""Finalists re-measured, each group's pick against its untuned start, and the picks against each other."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from bakeoff.analysis.tune_compare import Comparison, compare, compare_goodput
from bakeoff.backends.spec import KnobValue
from bakeoff.campaign.tune.figures import figures
from bakeoff.campaign.tune.folder import Target, measure
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.results.layout import (
    cell_folder_name,
)

# --- finalists, picks, verdicts ------------------------------------------------------------------


@dataclass
class Candidate:
    """A configuration measured ``repeats`` times: a finalist, or a group's untuned start."""

    label: str
    knobs: dict[str, KnobValue]
    trial: int | None  # None: the untuned start
    values: list[float] = field(default_factory=list)  # the primary figure, one per repeat
    sustained: float = 0.0  # max_load: the highest load met in every repeat
    misses: list[float] = field(default_factory=list)  # the SLO miss at the load, one per repeat

    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0

    def miss(self) -> float:
        """The mean SLO miss over the repeats (infinite: none measured)."""
        return sum(self.misses) / len(self.misses) if self.misses else math.inf


def primary(found: dict[str, Any], target: Target) -> float | None:
    """The figure the pick and the verdicts compare: goodput at the load, or throughput per GPU (pareto)."""
    return found.get("tok_s_per_gpu") if target.spec.objective == "pareto" else found.get("figure")


def finalists(study: optuna.Study, tune: TuneSpec) -> list[optuna.trial.FrozenTrial]:
    """The best finished, quality-passing trials (pareto: of the front, by throughput per GPU)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    ok = [t for t in done if t.user_attrs.get("state") == "complete"]
    if tune.objective == "pareto":
        front = {t.number for t in study.best_trials}
        ok = [t for t in ok if t.number in front] or ok
    ok.sort(key=lambda t: (t.values[0], t.values[-1]), reverse=True)
    unique: dict[str, optuna.trial.FrozenTrial] = {}
    for t in ok:
        unique.setdefault(str(t.user_attrs["label"]), t)
    return list(unique.values())[: tune.finalists]


def remeasure(out: Path, target: Target, candidates: list[Candidate], gpus: dict[str, int]) -> None:
    """Repeats 2.. of every candidate, round by round (repeat 1 is the trial itself)."""
    for repeat in range(2, target.spec.repeats + 1):
        for c in candidates:
            measure(out, c.label, target.workload, repeat, check_quality=False, runner=target.runner)
    for c in candidates:
        repeats = range(1, target.spec.repeats + 1)
        cells = [out / "cells" / cell_folder_name(c.label, target.workload, r) for r in repeats]
        found = [figures(d, target, gpus[c.label]) for d in cells]
        c.values = [v for f in found if (v := primary(f, target)) is not None]
        c.sustained = min((float(f.get("sustained") or 0.0) for f in found), default=0.0)
        c.misses = [float(m) for f in found if (m := f.get("slo_miss")) is not None]


def _rank_key(c: Candidate, objective: str) -> tuple[float, float, float]:
    """Best first when sorted descending: the load met (max_load), the figure, then the smaller SLO miss."""
    return (c.sustained if objective == "max_load" else 0.0, c.mean(), -c.miss())


def versus(a: Candidate, b: Candidate, objective: str, min_effect: float, among: int) -> Comparison:
    """``a`` against ``b`` by the comparison test: on goodput, or on the SLO miss where neither met it once.

    ``among``: the candidates the best was chosen from, this pair included; every claim about them is
    held to one level together (:mod:`bakeoff.analysis.tune_compare`).
    """
    if objective == "pareto":  # throughput per GPU: no SLO in it
        return compare(a.values, b.values, min_effect=min_effect, among=among)
    return compare_goodput(a.values, b.values, a.misses, b.misses, min_effect=min_effect, among=among)


@dataclass
class Pick:
    group: str
    untuned: Candidate
    finalists: list[Candidate]
    chosen: Candidate
    vs_untuned: Comparison | None  # the best finalist against the untuned start
    vs_runner_up: Comparison | None  # the best finalist against the next one


def pick(group: str, untuned: Candidate, found: list[Candidate], tune: TuneSpec) -> Pick:
    """The best finalist where it wins against the untuned start; otherwise the untuned start stays."""
    ranked = sorted(found, key=lambda c: _rank_key(c, tune.objective), reverse=True)
    if not ranked:
        return Pick(group, untuned, [], untuned, None, None)
    best = ranked[0]
    among = len(ranked) + 1  # the finalists and the untuned start: one family, its best chosen from the data
    vs_untuned = versus(best, untuned, tune.objective, tune.min_effect, among)
    runner = versus(best, ranked[1], tune.objective, tune.min_effect, among) if len(ranked) > 1 else None
    higher_load = tune.objective == "max_load" and best.sustained > untuned.sustained
    chosen = best if vs_untuned.outcome == "win" or higher_load else untuned
    return Pick(group, untuned, ranked, chosen, vs_untuned, runner)


def cross_verdict(picks: list[Pick], *, tuned: bool, min_effect: float, objective: str = "goodput") -> dict[str, Any]:
    """The groups' picks (or untuned starts) against the best of them, with the comparison test."""
    chosen = [(p.group, p.chosen if tuned else p.untuned) for p in picks]
    chosen.sort(key=lambda gc: _rank_key(gc[1], "goodput"), reverse=True)  # the figure, then the smaller miss
    if not chosen:
        return {"best": None, "against": []}
    best_group, best = chosen[0]
    against = []
    for group, c in chosen[1:]:
        found = versus(best, c, objective, min_effect, len(chosen))
        against.append(
            {"group": group, "outcome": found.outcome, "change": found.change, "text": found.text,
             "basis": found.basis}
        )  # fmt: skip
    return {"best": best_group, "mean": best.mean(), "miss": best.miss() if best.misses else None, "against": against}
