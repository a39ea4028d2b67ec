"""``bakeoff tune``: each server group's best configuration under the SLO, then tuned against tuned.

Every ``servers:`` entry of a campaign is a *group*; its knobs as written are the *untuned*
start. For each group an Optuna study (TPE, seeded) searches the backend's knob space
(:mod:`bakeoff.serving.tune_space`, merged with the campaign's ``tune:`` section,
:mod:`bakeoff.campaign.tune_spec`) for the best objective at the tuned workload's load:

- ``goodput``: goodput (req/s within the SLO; output tok/s when the SLO bounds nothing);
- ``max_load``: the highest load of the workload's sweep met within the SLO;
- ``pareto``: output tok/s per GPU against tok/s per user (1000 / TPOT P50), two objectives.

A trial with nothing to show on the first two (goodput 0: no request within the SLO; no load
met) is still ranked, by how close it came: its *SLO miss* (the largest median-to-bound ratio
of the bounded metrics, :func:`bakeoff.measure.slo.slo_miss`; for ``max_load`` the lowest over
the sweep's loads) is told to Optuna as ``-miss / (1 + miss)``, between -1 and 0: below every
trial that met something, above every failed, skipped or rejected one (-1), and higher the
smaller the miss, so a search where no configuration meets the SLO still moves toward one.

Every trial is a real cell of the tune's own campaign folder (``reports/NAME-tune``): a
server entry ``GROUP-<digest of its knobs>`` appended to that folder's ``campaign.yaml`` and
measured by :func:`bakeoff.campaign.execute.run_cell` (in this process, no notebook per
trial), so the same configuration proposed twice, or a trial cut short, is measured once,
like a resumed campaign's cell (:mod:`bakeoff.campaign.resume`). A trial:

1. is skipped when its knob values break a constraint of the space;
2. runs a short *probe* (``probe_share`` of the requests) whose figure is reported to
   Optuna's percentile pruner: a trial in the worst quarter of the probes so far is pruned
   (single objective only: Optuna cannot prune multi-objective studies);
3. runs the workload at the load, then the campaign's quality set; a trial whose answers do
   not hold up against the untuned configuration's (:func:`bakeoff.campaign.quality.gate`)
   is *rejected*: listed, and told to Optuna as the worst value so the search leaves that region.

Budgets are per group and equal: ``trials`` (pruned and rejected ones count) and optionally
``time_budget_s``. The study lives in ``study.journal`` (Optuna's journal file), so a tune
stopped by Ctrl-C or a crash resumes where it was: finished trials are kept, an interrupted one
is measured again (its finished cells are not).

Then the noise-aware part: the best ``finalists`` of each group and its untuned start are
measured ``repeats`` times (repeat ``r`` of all of them, then ``r + 1``), the pick is the best
finalist only where it *wins* against the untuned start by the comparison test
(:mod:`bakeoff.analysis.tune_compare`), and the picks of the groups are compared with the same
test, beside the comparison of the untuned starts. Each of those is a family whose best was
chosen from the data (the finalists with the untuned start; the groups' picks), so its tests
share one 5% level (Bonferroni over its pairs), the choice included. Where every repeat of both sides has
goodput 0, the test compares their SLO misses instead (lower is better), and says so. The report is
:mod:`bakeoff.report.tune_report`.

``rehearse``: a GPU campaign's tune run end to end on the reference-server stand-ins of a
rehearsal (:mod:`bakeoff.campaign.rehearsal`): the campaign scaled down, the folder marked, every
line and the report tagged, and no verdict or pick presented as a finding. ``runner``: how one
cell is measured, :func:`bakeoff.campaign.execute.run_cell` here by default;
:mod:`bakeoff.cluster.ray_tune` passes one that runs it as a Ray task (the study stays here, on
the driver, asking and telling).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from pydantic import ValidationError

from bakeoff.analysis.tune_compare import Comparison, compare, compare_goodput
from bakeoff.analysis.verdict import meets
from bakeoff.campaign import quality, resume
from bakeoff.campaign.cells import Cell, expand, prepare
from bakeoff.campaign.execute import cell_fingerprint, run_cell
from bakeoff.campaign.rehearsal import gpu_host_text, rehearsal_spec, write_marker
from bakeoff.campaign.runner import salvage_runs
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.errors import LaunchError, ServerDiedError, SpecError
from bakeoff.measure.slo import Slo, resolve_slo, slo_miss
from bakeoff.models.model_source import resolve_model
from bakeoff.paths import reports_dir
from bakeoff.report import tune_report
from bakeoff.results.layout import (
    CAMPAIGN_COPY,
    QUALITY_FILE,
    REHEARSAL_TAG,
    cell_folder_name,
    is_rehearsal,
    read_campaign_copy,
)
from bakeoff.results.metric_table import BY_KEY
from bakeoff.results.store import SUMMARY, atomic_write_bytes, read_summary, write_json
from bakeoff.results.summary import RunSummary
from bakeoff.schema import format_validation_error
from bakeoff.serving.backends import BackendSpec, KnobValue, load_backend
from bakeoff.serving.containers import reap_containers
from bakeoff.serving.cpu_checks import host_cpu_flags, refusal
from bakeoff.serving.knobs import broken_constraints, check_knob, resolve_space
from bakeoff.serving.process import reap_leftovers
from bakeoff.serving.server_config import ServerConfig
from bakeoff.serving.tune_space import KnobRange, TuneSpace, ordered
from bakeoff.workloads.kinds import ConcurrencySweep, OpenLoop, Workload

STUDY_FILE = "study.journal"
RESULT_FILE = "tune.json"
SOURCE_FILE = "tune-source.yaml"  # the tune's own campaign as first written (the untuned servers)
PRUNE_PERCENTILE = 25.0  # "clearly bad": a probe in the worst quarter of the probes so far
WORST = -1.0  # told for a failed, skipped or rejected trial: below every measured one (see missed())
optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tune prints its own line per trial

# Measures one cell of the tune folder: (folder, cell, run the quality set?).
CellRunner = Callable[[Path, Cell, bool], object]


def run_here(out: Path, cell: Cell, check_quality: bool) -> object:
    """The default runner: the cell measured in this process."""
    return run_cell(out, cell.server.label, cell.workload.label, cell.repeat, check_quality=check_quality)


@dataclass
class Group:
    """One server entry of the campaign: its untuned start and the space searched from it."""

    label: str
    server: ServerConfig
    backend: BackendSpec
    space: TuneSpace
    knobs: list[str]  # searched, in cost order

    def distributions(self) -> dict[str, BaseDistribution]:
        return {name: _distribution(self.space.knobs[name], self.backend.knobs[name].type) for name in self.knobs}


@dataclass
class Target:
    """What every trial runs and how its figures are read."""

    spec: TuneSpec
    workload: str  # the trial workload's name (the tuned workload, at the load unless max_load)
    probe: str
    load: float
    slo: Slo
    loads: list[float] = field(default_factory=list)
    runner: CellRunner = run_here
    rehearse: bool = False

    def say(self, line: str) -> None:
        """A line of the tune's progress; a rehearsal's is tagged, never read as measured."""
        print(f"{REHEARSAL_TAG} {line}" if self.rehearse else line, flush=True)


def _distribution(rng: KnobRange, kind: str) -> BaseDistribution:
    if rng.choices is not None:
        return CategoricalDistribution(rng.choices)
    assert rng.low is not None and rng.high is not None
    if kind == "int":
        return IntDistribution(int(rng.low), int(rng.high), log=rng.log, step=int(rng.step or 1))
    return FloatDistribution(rng.low, rng.high, log=rng.log, step=rng.step)


# --- what is searched -------------------------------------------------------------------------


def resolve_groups(spec: CampaignSpec, tune: TuneSpec) -> list[Group]:
    """Every server entry with its space, checked against its backend before anything starts."""
    override = TuneSpace(knobs=tune.knobs, constraints=tune.constraints)
    mapped: set[str] = set()
    groups = []
    for i, server in enumerate(spec.servers):
        where = f"servers[{i}] ({server.label})"
        if server.url is not None:
            raise SpecError(f"{where}.url: bakeoff cannot restart a server it did not start; tune needs a backend")
        backend = load_backend(server.backend)
        own = backend.tune or TuneSpace()
        # The campaign's ranges and constraints apply where this backend maps the knob.
        mine = TuneSpace(
            knobs={k: v for k, v in override.knobs.items() if k in backend.knobs},
            constraints=[c for c in override.constraints if c.names() <= set(backend.knobs)],
        )
        only = [k for k in tune.only if k in backend.knobs] if tune.only is not None else None
        space = resolve_space(backend, own.merged(mine, only), f"tune ({where}, backend {backend.name})", only)
        space = _cores_only(space)
        if backend.accelerator == "cpu" and server.url is None:
            space = host_only(space, backend, host_cpu_flags())
        mapped |= set(space.knobs)
        groups.append(Group(server.label, server, backend, space, ordered(space)))
    named = set(tune.knobs) | set(tune.only or [])
    unused = sorted(named - mapped)
    if unused:
        raise SpecError(f"tune: no server's backend maps {', '.join(unused)}; remove it from tune.knobs / tune.only")
    for i, group in enumerate(groups):
        if not group.knobs:
            have = ", ".join(sorted((group.backend.tune or TuneSpace()).knobs)) or "none declared"
            raise SpecError(
                f"tune: servers[{i}] ({group.label}) has nothing to search on backend {group.backend.name!r} "
                f"(its tune: block has {have}); name some of them in tune.only, or add ranges under tune.knobs"
            )
    return groups


def _cores_only(space: TuneSpace) -> TuneSpace:
    """Thread counts above this machine's cores are not worth a trial: cut them from the space."""
    rng = space.knobs.get("threads")
    cores = os.cpu_count() or 1
    if rng is None:
        return space
    if rng.choices is not None:
        kept = [c for c in rng.choices if not isinstance(c, int | float) or c <= cores] or rng.choices[:1]
        rng = KnobRange(choices=kept)
    elif rng.high is not None and rng.high > cores and rng.low is not None:
        rng = rng.model_copy(update={"high": float(max(cores, rng.low))})
    return space.model_copy(update={"knobs": {**space.knobs, "threads": rng}})


def host_only(space: TuneSpace, backend: BackendSpec, flags: frozenset[str] | None) -> TuneSpace:
    """Choices this host's CPU cannot run (vLLM-CPU's fp8 KV cache without AVX-512) are cut from
    the space, as threads above its cores are: each would be a failed trial."""
    if flags is None:
        return space
    knobs = dict(space.knobs)
    for name, rng in space.knobs.items():
        if rng.choices is not None:
            kept = [c for c in rng.choices if refusal(backend, name, c, flags) is None]
            if len(kept) < len(rng.choices):
                cut = [c for c in rng.choices if c not in kept]
                print(f"tune: {backend.name}: {name} {', '.join(map(str, cut))} left out, this host cannot run it")
                if kept:
                    knobs[name] = KnobRange(choices=kept)
                else:
                    del knobs[name]
    return space.model_copy(update={"knobs": knobs})


def trial_workloads(wl: Workload, load: float, tune: TuneSpec) -> tuple[Workload, Workload]:
    """The workload every trial runs (at the load; the whole sweep for max_load) and its short probe."""
    if isinstance(wl, ConcurrencySweep):
        level = int(load)
        full = wl if tune.objective == "max_load" else wl.model_copy(update={"levels": [level]})
        # The probe keeps a steady-state window: at least a ramp, a tail and one level's worth.
        requests = max(math.ceil(wl.requests_for(level) * tune.probe_share), 3 * level)
        probe = wl.model_copy(update={"name": f"{wl.label}-probe", "levels": [level], "requests_per_level": requests})
        return full, probe
    assert isinstance(wl, OpenLoop)  # TuneSpec.target admitted nothing else
    rates = wl.rates if tune.objective == "max_load" else [load]
    opened = wl.model_copy(update={"rates": rates, "slo_search": False})
    requests = max(math.ceil(wl.requests_per_rate * tune.probe_share), 16)
    probe_open = wl.model_copy(
        update={"name": f"{wl.label}-probe", "rates": [load], "requests_per_rate": requests, "slo_search": False}
    )
    return opened, probe_open


def trial_label(group: str, knobs: dict[str, KnobValue]) -> str:
    """A trial's server label: its group and a digest of its knobs, so equal knobs are one cell."""
    digest = hashlib.sha256(json.dumps(knobs, sort_keys=True).encode()).hexdigest()[:8]
    return f"{group}-{digest}"


# --- the tune's campaign folder ----------------------------------------------------------------


def _source_campaign(spec: CampaignSpec, full: Workload, probe: Workload, tune: TuneSpec) -> dict[str, Any]:
    raw = spec.model_dump(mode="json", exclude_none=True)
    for key in ("tune", "max_repeats"):  # a tune's repeats are its own (finalists), never auto
        raw.pop(key, None)
    raw.update(
        name=f"{spec.name}-tune",
        workloads=[full.model_dump(mode="json", exclude_none=True), probe.model_dump(mode="json", exclude_none=True)],
        repeats=tune.repeats,
        measure_warm_restart=False,
    )
    return raw


def _add_server(out: Path, server: dict[str, Any]) -> None:
    """Append a trial's server entry to the tune folder's campaign (once per label).

    The campaign with it is checked first (knobs, context lengths against the workload): a
    trial the campaign cannot run is refused here, and never written where every later cell
    of the tune would trip over it.
    """
    raw = read_campaign_copy(out)
    if any(s.get("label") == server["label"] for s in raw["servers"]):
        return
    raw["servers"].append(server)
    try:
        spec = CampaignSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(server["label"], exc)) from exc
    expand(spec, resolve_model(spec.model).local_dir, only=[server["label"]])
    atomic_write_bytes(out / CAMPAIGN_COPY, yaml.safe_dump(raw, sort_keys=False).encode())


def measure(
    out: Path,
    label: str,
    workload: str,
    repeat: int = 1,
    *,
    check_quality: bool = True,
    runner: CellRunner = run_here,
) -> Path:
    """One cell of the tune folder, unless a finished measurement of it is there already."""
    spec = load_campaign(out / CAMPAIGN_COPY)
    cells = expand(spec, resolve_model(spec.model).local_dir, [label], rehearse=is_rehearsal(out))
    cell = next(c for c in cells if c.server.label == label and c.workload.label == workload and c.repeat == repeat)
    cell_dir = out / "cells" / cell.cell_id
    verdict = resume.cell_state(cell_dir, cell_fingerprint(cell, out))
    if verdict.state == "complete":
        return cell_dir
    if verdict.state != "new":
        resume.archive_attempt(cell_dir, verdict.reason)
    cell_dir.mkdir(parents=True, exist_ok=True)
    runner(out, cell, check_quality)
    return cell_dir


# --- figures of a cell ---------------------------------------------------------------------------


def goodput_metric(slo: Slo) -> str:
    """The verdict's figure: goodput where the SLO bounds something, else output tok/s."""
    bounded = any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))
    return "goodput_req_s" if bounded else "output_tok_s"


def _summaries(cell_dir: Path) -> list[RunSummary]:
    return [read_summary(p) for p in sorted((cell_dir / "runs").glob(f"*/{SUMMARY}"))]


def _load_of(summary: RunSummary) -> float | None:
    wl = summary.workload
    value = wl.concurrency if wl.mode == "closed" else wl.rate
    return float(value) if value is not None else None


def figures(cell_dir: Path, target: Target, gpus: int) -> dict[str, Any]:
    """A cell's figures at the load: the objective's and the Pareto plot's, and whether the SLO held."""
    runs = [s for s in _summaries(cell_dir) if not s.interrupted]
    at = [s for s in runs if _load_of(s) == target.load]
    sustained = max((load for s in runs if (load := _load_of(s)) is not None and meets([s], target.slo)), default=0.0)
    # max_load's fallback where no load is met: the closest any load of the sweep came.
    misses = [m.factor for s in runs if (m := slo_miss(s, target.slo)) is not None]
    lowest = min(misses, default=None)
    if not at:
        return {"figure": None, "slo_met": False, "sustained": sustained, "lowest_slo_miss": lowest}
    s = at[0]
    tpot = BY_KEY["tpot_ms"].value(s, "p50")
    tok_s = BY_KEY["output_tok_s"].value(s)
    miss = slo_miss(s, target.slo)
    return {
        "figure": BY_KEY[goodput_metric(target.slo)].value(s),
        "slo_met": meets([s], target.slo),
        "sustained": sustained,
        "slo_miss": miss.factor if miss is not None else None,
        "slo_miss_text": miss.text() if miss is not None else None,
        "lowest_slo_miss": lowest,
        "output_tok_s": tok_s,
        "tok_s_per_gpu": tok_s / gpus if tok_s is not None else None,
        "tok_s_per_user": 1000.0 / tpot if tpot else None,
        "ttft_ms_p99": BY_KEY["ttft_ms"].value(s, "p99"),
        "tpot_ms_p50": tpot,
    }


def missed(miss: float | None) -> float:
    """A trial that met nothing, ranked by its SLO miss: in (-1, 0), higher the smaller the miss.

    Below every positive goodput or load, above :data:`WORST`; no miss to rank by (nothing
    measured at the load) is the worst.
    """
    return WORST if miss is None else -miss / (1.0 + miss)


def ranked_goodput(found: dict[str, Any]) -> float:
    """Goodput at the load where a request met the SLO, else the trial's SLO miss (:func:`missed`)."""
    figure = found.get("figure")
    if figure is None:
        return WORST
    return float(figure) if figure > 0 else missed(found.get("slo_miss"))


def objective(found: dict[str, Any], target: Target) -> list[float]:
    """The value(s) told to Optuna: higher is better for every objective."""
    if target.spec.objective == "pareto":
        return [found.get("tok_s_per_gpu") or 0.0, found.get("tok_s_per_user") or 0.0]
    if target.spec.objective == "max_load":
        sustained = float(found.get("sustained") or 0.0)
        return [sustained if sustained > 0 else missed(found.get("lowest_slo_miss"))]
    return [ranked_goodput(found)]


def _gpus(knobs: dict[str, KnobValue], backend: BackendSpec) -> int:
    tp = knobs.get("tensor_parallel_size", 1)
    return int(tp) if backend.accelerator == "gpu" and isinstance(tp, int) and tp > 0 else 1


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


# --- end to end -------------------------------------------------------------------------------------


def _clear_leftovers(out: Path, slo: Slo) -> None:
    reap_leftovers(out / "cells")
    reap_containers(out / "cells")
    salvage_runs(out / "cells", slo)


@contextlib.contextmanager
def _tidy(out: Path, slo: Slo) -> Iterator[None]:
    """What a killed tune left (servers, unfinished runs) is cleared before, and after however it ends."""
    _clear_leftovers(out, slo)
    try:
        yield
    finally:
        _clear_leftovers(out, slo)


def tune_campaign(
    path: Path,
    out_dir: Path | None = None,
    *,
    fresh: bool = False,
    rehearse: bool = False,
    runner: CellRunner = run_here,
) -> Path:
    """Tune every server group of the campaign at ``path``; return the report (``tune.md``).

    A rehearsal goes to ``reports/NAME-tune-rehearsal`` unless told otherwise, never beside a real tune.
    """
    original = load_campaign(path)
    # A rehearsal tunes the scaled-down campaign on stand-ins; its picks are written for the original.
    spec = rehearsal_spec(original) if rehearse else original
    tune = spec.tune or TuneSpec()
    wl, load = tune.target(spec.workloads)
    groups = resolve_groups(spec, tune)
    out = (out_dir or reports_dir() / f"{spec.name}-tune{'-rehearsal' if rehearse else ''}").resolve()
    if fresh:
        resume.start_over(out)
        (out / STUDY_FILE).unlink(missing_ok=True)
    full, probe = trial_workloads(wl, load, tune)
    out.mkdir(parents=True, exist_ok=True)
    source = out / SOURCE_FILE
    atomic_write_bytes(source, yaml.safe_dump(_source_campaign(spec, full, probe, tune), sort_keys=False).encode())
    trials = read_campaign_copy(out)["servers"] if (out / CAMPAIGN_COPY).is_file() else []
    # The source is already scaled down: prepared as written (a rehearsal's own scaling would set one
    # repeat), then marked, so every cell starts the stand-ins and every summary says rehearsal.
    prepare(source, out)
    if rehearse:
        write_marker(out, path, original, command="tune")
    for server in trials:  # a resumed tune keeps the trial servers it already added
        _add_server(out, server)
    slo = resolve_slo(spec.slo)
    target = Target(tune, full.label, probe.label, load, slo, runner=runner, rehearse=rehearse)
    storage = JournalStorage(JournalFileBackend(str(out / STUDY_FILE)))
    picks: list[Pick] = []
    studies: dict[str, optuna.Study] = {}
    base_cells: dict[str, Path] = {}
    started = time.monotonic()
    with _tidy(out, slo):
        try:
            for i, group in enumerate(groups):
                target.say(f"tune {group.label}: untuned start {dict(group.server.knobs)}")
                base_cells[group.label] = base_cell = measure(out, group.label, full.label, runner=runner)
                studies[group.label] = study = _study(storage, group, tune, i)
                search(out, group, target, study, base_cell)
            for group in groups:
                picks.append(_finish_group(out, group, target, studies[group.label]))
        except KeyboardInterrupt:
            print(
                f"interrupted: finished trials are kept in {out}; run the same command again to resume",
                file=sys.stderr,
            )
            raise
    untuned = {}
    for g in groups:
        found = figures(base_cells[g.label], target, _gpus(dict(g.server.knobs), g.backend))
        untuned[g.label] = _untuned_row(g, found, target)
    result = _result(spec, tune, target, groups, studies, picks, untuned, time.monotonic() - started)
    if rehearse:
        result["rehearsal"] = {"source_campaign": str(path), "gpu_host": gpu_host_text(out)}
    write_json(out / RESULT_FILE, result)
    _write_best(original, picks, out, rehearse=rehearse)
    return tune_report.write(out, result)


def _finish_group(out: Path, group: Group, target: Target, study: optuna.Study) -> Pick:
    tune = target.spec
    untuned = Candidate(group.label, dict(group.server.knobs), None)
    found = [
        Candidate(str(t.user_attrs["label"]), dict(t.user_attrs["knobs"]), t.number) for t in finalists(study, tune)
    ]
    gpus = {c.label: _gpus(c.knobs, group.backend) for c in [untuned, *found]}
    target.say(f"tune {group.label}: re-measuring {len(found)} finalist(s) and the untuned start")
    remeasure(out, target, [untuned, *found], gpus)
    return pick(group.label, untuned, found, tune)


def _untuned_row(group: Group, found: dict[str, Any], target: Target) -> dict[str, Any]:
    """The untuned start as a row of the trial table: the searched knobs as it ran them (defaults named)."""
    knobs: dict[str, Any] = {}
    for name in group.knobs:
        set_here, default = group.server.knobs.get(name), group.backend.knobs[name].default
        knobs[name] = set_here if set_here is not None else ("default" if default is None else f"{default} (default)")
    return {
        "number": None,
        "label": group.label,
        "knobs": knobs,
        "state": "untuned",
        "values": objective(found, target),
        "figures": found,
        "quality": "the reference",
        "note": "the untuned start (repeat 1)",
        "seconds": None,
    }


def _trial_rows(group: Group, study: optuna.Study) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.FAIL:
            continue  # interrupted, and measured again as a later trial
        knobs = t.user_attrs.get("knobs", {})
        rows.append(
            {
                "number": t.number,
                "label": t.user_attrs.get("label"),
                "knobs": {k: knobs.get(k) for k in group.knobs},
                "state": t.user_attrs.get("state", t.state.name.lower()),
                "values": list(t.values) if t.values is not None else None,
                "figures": t.user_attrs.get("figures", {}),
                "quality": t.user_attrs.get("quality", "not measured"),
                "note": t.user_attrs.get("note", ""),
                "seconds": t.user_attrs.get("seconds"),
            }
        )
    return rows


def _nothing_met(rows: list[dict[str, Any]], p: Pick, target: Target) -> dict[str, Any] | None:
    """Where no trial, finalist repeat or untuned start of a group met the SLO: the one that came closest.

    None where something met it (goodput above 0, or a load met for max_load), or where the
    objective reads no SLO (pareto, or an SLO that bounds nothing).
    """
    tune = target.spec
    if tune.objective == "pareto" or goodput_metric(target.slo) != "goodput_req_s":
        return None
    candidates = [p.untuned, *p.finalists]
    key = "sustained" if tune.objective == "max_load" else "figure"
    if any((r["figures"].get(key) or 0) > 0 for r in rows) or any(
        c.sustained > 0 if tune.objective == "max_load" else any(v > 0 for v in c.values) for c in candidates
    ):
        return None
    miss_key = "lowest_slo_miss" if tune.objective == "max_load" else "slo_miss"
    ranked = [r for r in rows if r["state"] in ("untuned", "complete") and r["figures"].get(miss_key) is not None]
    if not ranked:
        return {"trial": None, "label": None, "knobs": {}, "miss": None, "text": "nothing measured at the load"}
    best = min(ranked, key=lambda r: r["figures"][miss_key])
    factor = best["figures"][miss_key]
    closest = f"SLO missed by {factor:.1f}x at its closest load"
    text = best["figures"]["slo_miss_text"] if miss_key == "slo_miss" else closest
    return {"trial": best["number"], "label": best["label"], "knobs": best["knobs"],
            "miss": factor, "text": text}  # fmt: skip


def _candidate_json(c: Candidate) -> dict[str, Any]:
    return {"label": c.label, "knobs": c.knobs, "trial": c.trial, "values": c.values, "mean": c.mean(),
            "sustained": c.sustained, "misses": c.misses}  # fmt: skip


def _comparison_json(c: Comparison | None) -> dict[str, Any] | None:
    return None if c is None else {"outcome": c.outcome, "change": c.change, "text": c.text, "basis": c.basis}


def _result(
    spec: CampaignSpec,
    tune: TuneSpec,
    target: Target,
    groups: list[Group],
    studies: dict[str, optuna.Study],
    picks: list[Pick],
    untuned: dict[str, dict[str, Any]],
    seconds: float,
) -> dict[str, Any]:
    by_group = {p.group: p for p in picks}
    rows = {g.label: [untuned[g.label], *_trial_rows(g, studies[g.label])] for g in groups}
    return {
        "campaign": spec.name,
        "objective": tune.objective,
        "figure": "tok_s_per_gpu" if tune.objective == "pareto" else goodput_metric(target.slo),
        "workload": target.workload,
        "load": target.load,
        "slo": target.slo.model_dump(mode="json", exclude_none=True),
        "budget": {
            "trials": tune.trials,
            "time_budget_s": tune.time_budget_s,
            "finalists": tune.finalists,
            "repeats": tune.repeats,
            "prune": tune.prune and tune.objective != "pareto",
        },
        "min_effect": tune.min_effect,
        "seconds": round(seconds, 1),
        "groups": [
            {
                "group": g.label,
                "backend": g.backend.name,
                "searched": g.knobs,
                "space": {k: g.space.knobs[k].model_dump(exclude_none=True) for k in g.knobs},
                "spent_s": round(_spent_s(studies[g.label]), 1),
                "untuned_trial": untuned[g.label],
                "trials": rows[g.label][1:],
                "nothing_met": _nothing_met(rows[g.label], by_group[g.label], target),
                "untuned": _candidate_json(by_group[g.label].untuned),
                "finalists": [_candidate_json(c) for c in by_group[g.label].finalists],
                "chosen": _candidate_json(by_group[g.label].chosen),
                "vs_untuned": _comparison_json(by_group[g.label].vs_untuned),
                "vs_runner_up": _comparison_json(by_group[g.label].vs_runner_up),
            }
            for g in groups
        ],
        "tuned": cross_verdict(picks, tuned=True, min_effect=tune.min_effect, objective=tune.objective),
        "as_given": cross_verdict(picks, tuned=False, min_effect=tune.min_effect, objective=tune.objective),
        "rehearsal": None,
    }


def _write_best(spec: CampaignSpec, picks: list[Pick], out: Path, *, rehearse: bool = False) -> None:
    """Each group's pick as a campaign YAML (the campaign with that server's knobs), and all picks in one.

    Written from the validated campaign, model paths absolute, so the files run from anywhere. A
    rehearsal writes them for the original campaign (its GPU model, its workloads), headed as
    picked from stand-ins: they prove the path, they are no tuned configuration.
    """
    warning = (
        f"# {REHEARSAL_TAG} picked from reference-server stand-ins' figures: this file proves the path; "
        "it is not a tuned configuration\n"
        if rehearse
        else ""
    )
    raw = spec.model_dump(mode="json", exclude_none=True)
    raw.pop("tune", None)
    servers = {s["label"]: s for s in raw["servers"]}
    best = out / "best"
    best.mkdir(exist_ok=True)
    tuned = []
    for p in picks:
        entry = {**servers[p.group], "label": f"{p.group}-tuned", "knobs": p.chosen.knobs}
        tuned.append(entry)
        one = {**raw, "name": f"{spec.name}-{p.group}-tuned", "servers": [entry]}
        text = f"{warning}# {p.group}'s pick from bakeoff tune ({out}); run it with bakeoff campaign run\n"
        (best / f"{p.group}.yaml").write_text(text + yaml.safe_dump(one, sort_keys=False))
    both = {**raw, "name": f"{spec.name}-tuned", "servers": tuned}
    text = f"{warning}# every group's pick from bakeoff tune ({out}), side by side\n"
    (best / "tuned.yaml").write_text(text + yaml.safe_dump(both, sort_keys=False))
