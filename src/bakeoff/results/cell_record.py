"""``cell.json``: one cell's record (its server, status, fingerprint, effort and attempts), versioned.

The campaign stage writes it as a cell starts and again as it ends (:func:`write_cell_record`);
Ray adds where the cell ran (:func:`update_cell_record`). Every reader goes through
:func:`read_cell_record` (a file that must be there and sound: an error naming the file
otherwise) or :func:`cell_record_or_none` (a folder that may lack one: None instead), both of
which upgrade a file from an older layout first, as :func:`bakeoff.results.summary.migrate` does
for ``summary.json``: files written before ``schema_version`` existed (layout 0) read unchanged
apart from the version.

The cell's effort is the runs' :class:`~bakeoff.results.summary.Effort` block plus the started
server's record (:class:`CellEffort`). The server's section stays the mapping the campaign
wrote: its model (:class:`bakeoff.backends.server_config.ServerConfig`) lives above this layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bakeoff.errors import ResultsError
from bakeoff.results.store import read_versioned, write_json
from bakeoff.results.summary import Effort

CELL_SCHEMA_VERSION: Literal[1] = 1


class StartedServer(BaseModel):
    """How the cell's server ran, as its first start found it (``effort.server``)."""

    # A key a later (or earlier) bakeoff wrote here is kept, not refused: folders outlive releases.
    model_config = ConfigDict(extra="allow")

    backend: str | None = None
    label: str | None = None
    knobs: dict[str, Any] = Field(default_factory=dict)  # the knobs set, as the launch rendered them
    effective_knobs: dict[str, Any] = Field(default_factory=dict)  # set or not, what each knob was
    command_line: str | None = None
    kind: str | None = None  # the launcher that started it
    image: str | None = None
    image_digest: str | None = None
    base_url: str | None = None
    dtypes: dict[str, str] = Field(default_factory=dict)  # weight and KV-cache types
    gpus: dict[str, Any] | None = None  # the devices it was pinned to, and who chose them
    image_defaults: dict[str, Any] | None = None  # what the image does with the knobs left unset


class CellEffort(Effort):
    """The cell's effort as ``cell.json`` keeps it: the runs' :class:`Effort` block and ``server``.

    ``extra="allow"`` here, not a step in :func:`migrate`: :class:`Effort` refuses unknown keys so
    that a summary's writer fails loudly, but a key in an old (or newer) folder's record is no
    layout change ``migrate`` could name and upgrade; dropping it there would also lose it when the
    record is rewritten (:func:`update_cell_record`). So an effort key this bakeoff does not know
    is kept and read back as written, as :class:`CellRecord` keeps its own unknown fields; the
    known keys are typed, and the campaign's writes are still checked against :class:`Effort`
    where they are attached to the runs (``bakeoff.campaign.cell_run``).
    """

    model_config = ConfigDict(extra="allow")

    server: StartedServer | None = None  # absent until the server first started


class EarlierAttempt(BaseModel):
    """An attempt a resumed campaign moved aside before measuring the cell again (``attempts/N``)."""

    model_config = ConfigDict(extra="allow")

    attempt: str
    status: str | None = None
    why_measured_again: str | None = None
    started_at: str | None = None
    finished_requests: int = 0
    server_died: bool = False


class SweepStop(BaseModel):
    """Where a load sweep stopped raising the load past saturation, why, and the levels it skipped."""

    model_config = ConfigDict(extra="allow")

    after: str | None = None
    why: str | None = None
    skipped: list[str] = Field(default_factory=list)


class CellRecord(BaseModel):
    """One cell folder's ``cell.json``. Fields a cell has not reached yet are absent, not null."""

    # A later field read by an older bakeoff is kept, not refused: folders outlive releases.
    model_config = ConfigDict(extra="allow")

    schema_version: Literal[1] = CELL_SCHEMA_VERSION
    server: dict[str, Any] = Field(default_factory=dict)  # the server's section as the campaign wrote it
    backend: str | None = None
    workload: str | None = None
    repeat: int | None = None
    status: str | None = None  # running, ok, failed, interrupted
    started_at: str | None = None
    finished_at: str | None = None
    earlier_attempts: list[EarlierAttempt] = Field(default_factory=list)  # attempts a resume moved aside
    fingerprint: dict[str, Any] | None = None  # what resume compares (plans, knobs, versions)
    error: str | None = None
    server_died: dict[str, Any] | None = None  # the death watch's evidence
    effort: CellEffort = Field(default_factory=CellEffort)
    quality: Any = None
    saturation: SweepStop | None = None  # a sweep stopped past saturation: after which level, why
    slo_search: Any = None
    ray: dict[str, Any] | None = None  # the node and tries of a cell run as a Ray task

    def as_json(self) -> dict[str, Any]:
        """The fields set, as a mapping (an unset field stays absent, as it is in the file)."""
        return self.model_dump(exclude_unset=True)


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a ``cell.json`` from any earlier layout to the current one."""
    if raw.get("schema_version", 0) == 0:
        raw = {**raw, "schema_version": 1}  # layout 0: the same fields, before the version existed
    return raw


def read_cell_record(path: Path) -> CellRecord:
    """A cell's ``cell.json`` of any known layout, validated; a ResultsError naming the file when
    it cannot be read, is not a JSON object or does not match the model."""
    return read_versioned(path, CellRecord, migrate, "cell record")


def cell_record_or_none(path: Path) -> CellRecord | None:
    """A cell's record where one may be missing: None when the file is missing or unreadable
    (not JSON, not an object, not the model), as :func:`read_cell_record` would refuse it.

    For readers that fall back on the folder's name (history, calibration, an archived
    attempt); a reader that needs the record uses :func:`read_cell_record` and its error.
    """
    if not path.is_file():
        return None
    try:
        return read_cell_record(path)
    except ResultsError:
        return None


def write_cell_record(path: Path, info: dict[str, Any]) -> None:
    """Write a cell's record, checked against the model, carrying the current layout's version.

    The mapping itself is written, not the model's dump: its figures may be numpy values, which
    the JSON writer takes and pydantic's serializer does not.
    """
    record = {"schema_version": CELL_SCHEMA_VERSION, **info}
    CellRecord.model_validate(record)
    write_json(path, record)


def update_cell_record(path: Path, **fields: Any) -> None:
    """Set top-level fields of an existing record (Ray's node and tries), keeping the rest as read."""
    write_cell_record(path, {**read_cell_record(path).as_json(), **fields})
