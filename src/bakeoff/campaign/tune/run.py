"""``bakeoff tune`` end to end: the groups searched, their finalists re-measured, the result written."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from bakeoff.campaign import resume
from bakeoff.campaign.campaign_input import CampaignInput, as_input
from bakeoff.campaign.cells import prepare
from bakeoff.campaign.rehearsal import gpu_host_text, write_marker
from bakeoff.campaign.runner import salvage_runs
from bakeoff.campaign.specs import load_campaign
from bakeoff.campaign.tune.figures import _gpus, figures
from bakeoff.campaign.tune.folder import (
    RESULT_FILE,
    SOURCE_FILE,
    STUDY_FILE,
    CellRunner,
    Target,
    _add_server,
    _source_campaign,
    measure,
    run_here,
)
from bakeoff.campaign.tune.picks import Candidate, Pick, finalists, pick, remeasure
from bakeoff.campaign.tune.result import _result, _untuned_row, _write_best
from bakeoff.campaign.tune.search import _study, search
from bakeoff.campaign.tune.space import Group, resolve_groups, trial_workloads
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.measure.slo import Slo, resolve_slo
from bakeoff.paths import reports_dir
from bakeoff.report import tune_report
from bakeoff.results.layout import CAMPAIGN_COPY
from bakeoff.results.store import atomic_write_bytes, write_json
from bakeoff.serving.containers import reap_containers
from bakeoff.serving.process import reap_leftovers

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
    campaign: Path | CampaignInput,
    out_dir: Path | None = None,
    *,
    fresh: bool = False,
    runner: CellRunner = run_here,
) -> Path:
    """Tune every server group of the campaign (a file, or :func:`load_input`'s rehearsal of it); return
    the report (``tune.md``).

    A rehearsal goes to ``reports/NAME-tune-rehearsal`` unless told otherwise, never beside a real tune.
    """
    run = as_input(campaign)
    # A rehearsal tunes the scaled-down campaign on stand-ins; its picks are written for the original.
    spec = run.spec
    tune = spec.tune or TuneSpec()
    wl, load = tune.target(spec.workloads)
    groups = resolve_groups(spec, tune)
    out = (out_dir or reports_dir() / f"{spec.name}-tune{run.suffix}").resolve()
    if fresh:
        resume.start_over(out)
        (out / STUDY_FILE).unlink(missing_ok=True)
    full, probe = trial_workloads(wl, load, tune)
    out.mkdir(parents=True, exist_ok=True)
    source = out / SOURCE_FILE
    atomic_write_bytes(source, yaml.safe_dump(_source_campaign(spec, full, probe, tune), sort_keys=False).encode())
    copy = out / CAMPAIGN_COPY
    trials = (
        [s.model_dump(mode="json", exclude_none=True) for s in load_campaign(copy).servers] if copy.is_file() else []
    )
    # The source is already scaled down, its servers on the rehearsal launcher where it rehearses:
    # prepared as written (a rehearsal's own scaling would set one repeat), then marked, so every
    # summary says rehearsal.
    prepare(CampaignInput(source, load_campaign(source)), out)
    if run.stood_in is not None:
        write_marker(out, run.path, run.stood_in, command="tune")
    for server in trials:  # a resumed tune keeps the trial servers it already added
        _add_server(out, server)
    slo = resolve_slo(spec.slo)
    target = Target(tune, full.label, probe.label, load, slo, runner=runner, tag=run.tag)
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
    if run.rehearsal:
        result["rehearsal"] = {"source_campaign": str(run.path), "gpu_host": gpu_host_text(out)}
    write_json(out / RESULT_FILE, result)
    _write_best(run, picks, out)
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
