"""The tune's own campaign folder: its source campaign, the trial servers appended to it, one cell measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bakeoff.campaign import resume
from bakeoff.campaign.cell_run import run_cell
from bakeoff.campaign.cell_spec import cell_fingerprint, write_cell_spec
from bakeoff.campaign.cells import Cell, expand
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.errors import SpecError
from bakeoff.measure.slo import Slo
from bakeoff.models.model_source import resolve_model
from bakeoff.results.layout import CAMPAIGN_COPY, CELL_SPEC
from bakeoff.results.store import atomic_write_bytes
from bakeoff.schema import format_validation_error
from bakeoff.workloads.kinds import Workload

STUDY_FILE = "study.journal"
RESULT_FILE = "tune.json"
SOURCE_FILE = "tune-source.yaml"  # the tune's own campaign as first written (the untuned servers)

# Measures one cell of the tune folder from the hand-over measure() wrote: (folder, cell, run the quality set?).
CellRunner = Callable[[Path, Cell, bool], object]


def run_here(out: Path, cell: Cell, check_quality: bool) -> object:
    """The default runner: the cell measured in this process."""
    return run_cell(out / "cells" / cell.cell_id / CELL_SPEC, check_quality=check_quality)


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
    tag: str = ""  # REHEARSAL in a rehearsal (CampaignInput.tag)

    def say(self, line: str) -> None:
        """A line of the tune's progress; a rehearsal's is tagged, never read as measured."""
        print(f"{self.tag} {line}" if self.tag else line, flush=True)


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
    spec = load_campaign(out / CAMPAIGN_COPY)
    if any(s.label == server["label"] for s in spec.servers):
        return
    raw = spec.model_dump(mode="json", exclude_none=True)
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
    cells = expand(spec, resolve_model(spec.model).local_dir, [label])
    cell = next(c for c in cells if c.server.label == label and c.workload.label == workload and c.repeat == repeat)
    cell_dir = out / "cells" / cell.cell_id
    verdict = resume.cell_state(cell_dir, cell_fingerprint(cell, out))
    if verdict.state == "complete":
        return cell_dir
    if verdict.state != "new":
        resume.archive_attempt(cell_dir, verdict.reason)
    cell_dir.mkdir(parents=True, exist_ok=True)
    write_cell_spec(out, spec, cell)  # what the runner measures, here or in a Ray task
    runner(out, cell, check_quality)
    return cell_dir
