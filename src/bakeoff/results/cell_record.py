"""``cell.json``: one cell's record (its server, status, fingerprint, effort and attempts), versioned.

The campaign stage writes it as a cell starts and again as it ends (:func:`write_cell_record`);
Ray adds where the cell ran. Every reader goes through :func:`read_cell_record`, which upgrades a
file from an older layout first, as :func:`bakeoff.results.summary.migrate` does for
``summary.json``: files written before ``schema_version`` existed (layout 0) read unchanged
apart from the version.

The server's section stays the mapping the campaign wrote: its model
(:class:`bakeoff.backends.server_config.ServerConfig`) lives above this layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bakeoff.results.store import read_json, write_json

CELL_SCHEMA_VERSION: Literal[1] = 1


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
    earlier_attempts: list[dict[str, Any]] = Field(default_factory=list)  # attempts a resume moved aside
    fingerprint: dict[str, Any] | None = None  # what resume compares (plans, knobs, versions)
    error: str | None = None
    server_died: dict[str, Any] | None = None  # the death watch's evidence
    effort: dict[str, Any] = Field(default_factory=dict)
    quality: Any = None
    saturation: dict[str, Any] | None = None  # a sweep stopped past saturation: after which level, why
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
    return CellRecord.model_validate(migrate(read_json(path)))


def write_cell_record(path: Path, info: dict[str, Any]) -> None:
    """Write a cell's record, checked against the model, carrying the current layout's version.

    The mapping itself is written, not the model's dump: its figures may be numpy values, which
    the JSON writer takes and pydantic's serializer does not.
    """
    record = {"schema_version": CELL_SCHEMA_VERSION, **info}
    CellRecord.model_validate(record)
    write_json(path, record)
