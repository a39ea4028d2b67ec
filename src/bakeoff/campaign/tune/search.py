"""The search: one seeded Optuna study per group, asked and told trial by trial (probe, prune, gate)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.storages import JournalStorage
from optuna.trial import TrialState

from bakeoff.backends.knobs import broken_constraints, check_knob
from bakeoff.backends.spec import KnobValue
from bakeoff.campaign import quality
from bakeoff.campaign.tune.figures import WORST, _gpus, figures, objective, ranked_goodput
from bakeoff.campaign.tune.folder import Target, _add_server, measure
from bakeoff.campaign.tune.space import Group, trial_label
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.errors import LaunchError, ServerDiedError, SpecError
from bakeoff.results.layout import (
    QUALITY_FILE,
)

PRUNE_PERCENTILE = 25.0  # "clearly bad": a probe in the worst quarter of the probes so far
optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tune prints its own line per trial


# --- the search --------------------------------------------------------------------------------


def _study(storage: JournalStorage, group: Group, tune: TuneSpec, index: int) -> optuna.Study:
    directions: list[Literal["minimize", "maximize"]] = ["maximize"] * (2 if tune.objective == "pareto" else 1)
    startup = max(2, min(5, tune.trials // 3))  # random trials before TPE models the space
    sampler = optuna.samplers.TPESampler(seed=tune.seed + index, n_startup_trials=startup)
    pruner = optuna.pruners.PercentilePruner(PRUNE_PERCENTILE, n_startup_trials=startup, n_warmup_steps=0)
    return optuna.create_study(
        study_name=group.label,
        storage=storage,
        sampler=sampler,
        pruner=pruner if tune.prune and tune.objective != "pareto" else optuna.pruners.NopPruner(),
        directions=directions,
        load_if_exists=True,
    )


def _requeue_interrupted(study: optuna.Study) -> int:
    """Trials a crash or Ctrl-C left running: failed, and their knobs queued to be measured again."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in running:
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params)
    return len(running)


def _counted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that used the budget: finished or pruned (interrupted ones are measured again)."""
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def _spent_s(study: optuna.Study) -> float:
    return sum(float(t.user_attrs.get("seconds", 0.0)) for t in _counted(study))


def _knob_values(group: Group, params: dict[str, Any]) -> dict[str, KnobValue]:
    knobs: dict[str, KnobValue] = dict(group.server.knobs)
    for name, value in params.items():
        knobs[name] = check_knob(group.backend, name, value)
    return knobs


def search(out: Path, group: Group, target: Target, study: optuna.Study, base_cell: Path) -> None:
    """Run ``group``'s trials until its budget is spent (counting what an earlier run of the tune did)."""
    tune = target.spec
    requeued = _requeue_interrupted(study)
    if requeued:
        target.say(f"tune {group.label}: {requeued} interrupted trial(s) measured again")
    while len(_counted(study)) < tune.trials:
        if tune.time_budget_s is not None and _spent_s(study) >= tune.time_budget_s:
            target.say(f"tune {group.label}: time budget of {tune.time_budget_s:g} s spent")
            break
        trial = study.ask(group.distributions())
        try:
            _run_trial(out, group, target, study, trial, base_cell)
        except KeyboardInterrupt:
            study.tell(trial.number, state=TrialState.FAIL)
            study.enqueue_trial(trial.params)  # measured again (its finished cells kept) on the next run
            raise


def _run_trial(
    out: Path, group: Group, target: Target, study: optuna.Study, trial: optuna.Trial, base_cell: Path
) -> None:
    tune = target.spec
    started = time.monotonic()
    knobs = _knob_values(group, trial.params)
    label = trial_label(group.label, knobs)
    trial.set_user_attr("label", label)
    trial.set_user_attr("knobs", knobs)
    worst = [WORST] * len(study.directions)

    def finish(state: str, note: str, values: list[float] | None = None, **attrs: Any) -> None:
        for key, value in {"state": state, "note": note, **attrs}.items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("seconds", round(time.monotonic() - started, 1))
        if state == "pruned":
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, values if values is not None else worst)
        shown = {k: knobs[k] for k in group.knobs}
        target.say(f"tune {group.label}: trial {trial.number} {shown}: {state} {note}".rstrip())

    broken = broken_constraints(group.space, group.backend, knobs)
    if broken:
        finish("skipped", "breaks " + "; ".join(broken))
        return
    server = {**group.server.model_dump(mode="json", exclude_none=True), "label": label, "knobs": knobs}
    try:
        _add_server(out, server)
        gpus = _gpus(knobs, group.backend)
        if tune.prune and tune.objective != "pareto":
            probe = figures(measure(out, label, target.probe, check_quality=False, runner=target.runner), target, gpus)
            trial.report(ranked_goodput(probe), 0)  # goodput at the load (or its miss), whatever the objective
            if trial.should_prune():
                finish("pruned", f"probe {_outcome(probe)} in the worst quarter", figures=probe)
                return
        cell_dir = measure(out, label, target.workload, runner=target.runner)
    except (LaunchError, ServerDiedError, SpecError) as exc:
        finish("failed", str(exc).splitlines()[0][:300])
        return
    found = figures(cell_dir, target, gpus)
    passed, why = quality.gate(
        cell_dir / QUALITY_FILE, base_cell / QUALITY_FILE, tune.quality.min_agreement, tune.quality.max_rate_drop
    )
    if passed is False:
        finish("rejected", "failed the quality gate", figures=found, quality=why)
        return
    value = objective(found, target)
    finish("complete", _outcome(found), value, figures=found, quality=why, slo_miss=found.get("slo_miss"))


def _outcome(found: dict[str, Any]) -> str:
    """A trial's line: its figure and whether the SLO held, or by how much no request met it."""
    figure = found.get("figure")
    if figure is None:
        return "no run at the load"
    if figure <= 0 and found.get("slo_miss_text"):
        return f"0, {found['slo_miss_text']}"
    return f"{figure:.4g} ({'SLO met' if found['slo_met'] else 'SLO missed'})"
