"""One cell handed over to what measures it: ``cells/ID/cell_spec.json``, a typed, versioned file.

The parent writes it just before the cell runs (:func:`write_cell_spec`: a campaign run, the
Ray driver, a tune), after any earlier attempt was moved aside; the measuring side (the cell's
``bench.ipynb`` kernel, a Ray task, a tune trial) reads this one file with :func:`read_cell_spec`
and measures it (:func:`bakeoff.campaign.cell_run.run_cell`). It holds the campaign's settings as
run and the cell's own parts, each already resolved by the parent: the server (pins applied), the
backend (image tag applied), the workload, the repeat, the plan folder (relative to the campaign
folder, which a Ray task's working copy moves), the SLO and the fingerprint its finished
measurement will carry. Nothing reloads the campaign YAML or expands every cell to find its own.

Request headers are never written (they may hold an API key): :meth:`CellSpec.cell` makes them
again from the server's ``api_key_env`` and ``headers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import BackendSpec
from bakeoff.campaign import resume
from bakeoff.campaign.cells import Cell, plans_dir
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.errors import SpecError
from bakeoff.measure.auth import request_headers
from bakeoff.measure.slo import Slo, resolve_slo
from bakeoff.observe.origin import versions
from bakeoff.results.layout import CELL_SPEC
from bakeoff.results.store import atomic_write_bytes
from bakeoff.schema import Strict
from bakeoff.workloads.kinds import Workload

CELL_SPEC_VERSION: Literal[1] = 1


class CellSpec(Strict):
    """Everything one cell's measurement needs, as the parent resolved it."""

    schema_version: Literal[1] = CELL_SPEC_VERSION
    campaign: CampaignSpec  # the campaign as run (its copy): model, attempts, quality set, prices
    server: ServerConfig
    backend: BackendSpec
    workload: Workload
    repeat: Annotated[int, Field(ge=1)] = 1
    plans: str = Field(description="the cell's plan folder, relative to the campaign folder")
    slo: Slo
    fingerprint: dict[str, Any] = Field(description="what the finished measurement depends on (resume)")
    client_processes: int | None = None

    def cell(self) -> Cell:
        """The cell, its request headers made again (never written) and the campaign's draft model."""
        where = f"server {self.server.label!r}"
        headers = request_headers(
            self.server.api_key_env,
            self.server.headers,
            where=f"{where}: api_key_env",
            where_headers=f"{where}: headers",
        )
        return Cell(
            self.server,
            self.backend,
            self.workload,
            headers,
            self.campaign.model.draft_path,
            self.client_processes,
            self.repeat,
        )


def cell_fingerprint(cell: Cell, campaign_dir: Path, *, warm: bool = False) -> dict[str, Any]:
    """What a finished cell's measurement depends on (:func:`bakeoff.campaign.resume.fingerprint`)."""
    return resume.fingerprint(
        plans_dir(campaign_dir, cell.workload.label, cell.repeat, warm=warm),
        cell.server.model_dump(mode="json"),
        cell.backend.model_dump(mode="json"),
        versions(cell.backend),
    )


def write_cell_spec(campaign_dir: Path, spec: CampaignSpec, cell: Cell) -> Path:
    """Write ``cell``'s hand-over into its folder; return the file's path."""
    plans = plans_dir(campaign_dir, cell.workload.label, cell.repeat, warm=spec.warm_repeats)
    handed = CellSpec(
        campaign=spec,
        server=cell.server,
        backend=cell.backend,
        workload=cell.workload,
        repeat=cell.repeat,
        plans=plans.relative_to(campaign_dir).as_posix(),
        slo=resolve_slo(spec.slo),
        fingerprint=cell_fingerprint(cell, campaign_dir, warm=spec.warm_repeats),
        client_processes=cell.client_processes,
    )
    path = campaign_dir / "cells" / cell.cell_id / CELL_SPEC
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, handed.model_dump_json(indent=1).encode())
    return path


def read_cell_spec(path: Path) -> CellSpec:
    """The hand-over at ``path``; a missing or unreadable one names what writes it."""
    if not path.is_file():
        raise SpecError(f"{path}: no cell hand-over here; `bakeoff campaign run` writes it before the cell runs")
    try:
        return CellSpec.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise SpecError(
            f"{path}: not a cell hand-over of this bakeoff ({exc.error_count()} error(s)); "
            "run the campaign again to rewrite it"
        ) from exc
