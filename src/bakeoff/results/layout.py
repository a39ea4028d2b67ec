"""A campaign folder's layout, and reading it back as typed cells.

What the campaign stage writes and every reader (report, verdict, advice, history) reads:
``campaign.yaml`` (the campaign as run), ``cells/SERVER__WORKLOAD[__rN]/cell.json`` with its
``runs/*/summary.json``, ``quality.json`` beside a cell's runs, and ``rehearsal.json`` at the top
of a rehearsal. :func:`load_cells` returns one :class:`CellResult` per cell folder, so a reader
names the fields it uses instead of indexing an untyped dict; ``cell.json`` is read through
:mod:`bakeoff.results.cell_record`, its versioned model, and the cell carries that typed record.
:func:`read_campaign_copy` is the one reader of ``campaign.yaml`` below the spec loader, as a typed view
(:class:`~bakeoff.results.campaign_copy.CampaignCopy`); :func:`load_yaml` is the YAML reader it and
the other plain-data files (CDI specs, the audit's defaults table) share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bakeoff.errors import SpecError
from bakeoff.results.campaign_copy import CampaignCopy
from bakeoff.results.cell_record import CellEffort, CellRecord, read_cell_record
from bakeoff.results.store import CELL_INFO, SUMMARY, read_json, read_summary
from bakeoff.results.summary import RunSummary
from bakeoff.schema import format_validation_error

CAMPAIGN_COPY = "campaign.yaml"  # as written by bakeoff.campaign.cells.prepare
CELL_SEPARATOR = "__"  # a cell folder is SERVER__WORKLOAD, and SERVER__WORKLOAD__rN for repeat N > 1
QUALITY_FILE = "quality.json"
# A ladder campaign's steps and decisions, and the same as Markdown (bakeoff.campaign.ladder).
LADDER_FILE = "ladder.json"
LADDER_MARKDOWN = "ladder.md"
# The rates a quality check reports, in the order the report shows them.
QUALITY_RATES = ("invalid_json", "truncated", "refused", "exact", "length_ok", "agreement", "word_agreement")
# quality.json's other figures beside those shares: the held-out perplexity (bakeoff.campaign.perplexity).
QUALITY_SCORES = ("perplexity",)
REHEARSAL_MARKER = "rehearsal.json"
CELL_SPEC = "cell_spec.json"  # per cell: its hand-over from the campaign (bakeoff.campaign.cell_spec)
PREFLIGHT_FILE = "preflight.json"  # what each server's pre-flight found, its image's defaults among it
AUTO_REPEATS = "repeats.json"  # repeats: auto — rounds run and why they stopped (bakeoff.campaign.execute)
# Before every console line of a rehearsal (and after each stand-in's label in the report's tables).
REHEARSAL_TAG = "[rehearsal]"
REHEARSAL_BANNER = (
    "**REHEARSAL — not a measurement.** Every server in this report is the reference server "
    "emulating a framework's wire protocol, not the framework: the figures test bakeoff's GPU path "
    "(commands, probes, scrapes, cache resets, report) and say nothing about vLLM, SGLang or TensorRT-LLM."
)


def cell_folder_name(server_label: str, workload_name: str, repeat: int = 1) -> str:
    """The folder of one repeat of a cell; repeat 1 keeps the plain name (campaigns without repeats)."""
    base = f"{server_label}{CELL_SEPARATOR}{workload_name}"
    return base if repeat == 1 else f"{base}{CELL_SEPARATOR}r{repeat}"


def cell_spec_file(campaign_dir: Path, server_label: str, workload_name: str, repeat: int = 1) -> Path:
    """Where one cell's hand-over is (what ``bench.ipynb`` measures from)."""
    return campaign_dir / "cells" / cell_folder_name(server_label, workload_name, repeat) / CELL_SPEC


def cell_names(cell_id: str, record: CellRecord | None) -> tuple[str, str]:
    """(server label, workload) of a cell, from its record (``cell.json``), else from its folder name.

    ``record``: None where the cell has none (:func:`bakeoff.results.cell_record.cell_record_or_none`).
    Repeats of a cell (``SERVER__WORKLOAD__rN``) name the same server and workload.
    """
    label, _, workload = cell_id.partition(CELL_SEPARATOR)
    workload = re.sub(rf"{CELL_SEPARATOR}r\d+$", "", workload)
    if record is None:
        return label, workload
    return str(record.server.get("label") or label), str(record.workload or workload)


def is_rehearsal(campaign_dir: Path) -> bool:
    return (campaign_dir / REHEARSAL_MARKER).is_file()


def rehearsal_marker(campaign_dir: Path) -> dict[str, Any] | None:
    path = campaign_dir / REHEARSAL_MARKER
    return read_json(path) if path.is_file() else None


def load_yaml(text: str) -> Any:
    """YAML text as plain data: bakeoff's one YAML reader besides the campaign spec loader and the
    backend definitions (a campaign folder's copy here, CDI specs, the audit's defaults table)."""
    return yaml.safe_load(text)


def read_campaign_copy(folder: Path) -> CampaignCopy:
    """The campaign as run (``campaign.yaml`` in a campaign folder or archive), as its typed view.

    The one place a campaign folder's copy is read outside the spec loader (why a view and not
    the spec: :mod:`bakeoff.results.campaign_copy`). An empty or non-mapping file reads as a
    campaign with every default; one whose fields cannot be read is a SpecError naming them.
    """
    path = folder / CAMPAIGN_COPY
    raw = load_yaml(path.read_text())
    try:
        return CampaignCopy.model_validate(raw if isinstance(raw, dict) else {})
    except ValidationError as exc:
        raise SpecError(format_validation_error(str(path), exc)) from exc


@dataclass(frozen=True)
class CellResult:
    """One cell folder: its record (``cell.json``, typed) and its runs' summaries (run name -> summary).

    ``server`` is the server's section as the campaign wrote it (label, backend, knobs, ...), its
    label filled in from the folder's name where the record has none; ``backend``, ``workload``
    and ``repeat`` are resolved the same way. ``record`` is the whole ``cell.json`` for the
    rarer fields (attempts, saturation, Ray's stamp).
    """

    dir: Path
    server: dict[str, Any]
    backend: str
    workload: str
    repeat: int
    status: str | None
    summaries: dict[str, RunSummary]
    record: CellRecord = field(repr=False)

    @property
    def label(self) -> str:
        return str(self.server["label"])

    @property
    def knobs(self) -> dict[str, Any]:
        return dict(self.server.get("knobs") or {})

    @property
    def effort(self) -> CellEffort:
        """The cell's effort: the runs' Effort block and the started server's record."""
        return self.record.effort

    @property
    def ray(self) -> dict[str, Any] | None:
        return self.record.ray


def load_cells(campaign_dir: Path) -> list[CellResult]:
    """Every cell folder of a campaign with a ``cell.json``, its summaries read and checked."""
    cells = []
    for path in sorted((campaign_dir / "cells").glob(f"*/{CELL_INFO}")):
        record = read_cell_record(path)
        label, workload = cell_names(path.parent.name, record)
        server = dict(record.server)
        server.setdefault("label", label)
        cells.append(
            CellResult(
                dir=path.parent,
                server=server,
                backend=str(record.backend or server.get("backend") or ""),
                workload=workload,
                repeat=int(record.repeat or 1),
                status=record.status,
                summaries={p.parent.name: read_summary(p) for p in sorted(path.parent.glob(f"runs/*/{SUMMARY}"))},
                record=record,
            )
        )
    return cells
