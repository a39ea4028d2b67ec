"""When, and with what software, each cell of a campaign folder was measured.

A campaign folder can hold cells measured on different days: ``campaign run --only`` into
an existing folder, or a re-run that resumes after an interruption. Their results are
still compared side by side, so the report must say so: :func:`measured_apart_note`
returns a note listing each cell's measurement window and versions when the cells were
not measured in one sitting (a pause longer than :data:`SITTING_GAP_S` between one
cell's end and the next one's start) or not with the same software: the harness's
packages differ between cells, or one server ran a different image or engine version in
different cells. Different frameworks' own images are what a campaign compares, not a
change of software.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from bakeoff.results.cell_record import cell_record_or_none
from bakeoff.results.layout import cell_names
from bakeoff.results.store import CELL_INFO, RUN_INFO, read_json

# Longer than any one server start (a TensorRT-LLM engine build included): a gap beyond
# it means somebody came back later.
SITTING_GAP_S = 3600.0


# Version entries that belong to the server under test; every other entry is the harness's.
_FRAMEWORK_KEYS = ("image", "engine")


@dataclass(frozen=True)
class CellWhen:
    cell_id: str
    server: str
    started: dt.datetime
    finished: dt.datetime
    versions: dict[str, str]

    @property
    def text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.versions.items())) or "not recorded"

    def part(self, framework: bool) -> tuple[tuple[str, str], ...]:
        """The harness's versions (``framework`` False) or the server's own (True), comparable."""
        return tuple(sorted((k, v) for k, v in self.versions.items() if (k in _FRAMEWORK_KEYS) == framework))


def _time(text: object) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text))
    except ValueError:
        return None


def cell_times(campaign_dir: Path) -> list[CellWhen]:
    """Each cell's first run start, last run end and versions, from its runs' run.json."""
    found = []
    for cell_dir in sorted((campaign_dir / "cells").glob("*/")):
        infos = [read_json(p) for p in sorted((cell_dir / "runs").glob(f"*/{RUN_INFO}"))]
        starts = [t for t in (_time(i.get("started_at")) for i in infos) if t is not None]
        ends = [t for t in (_time(i.get("finished_at")) for i in infos) if t is not None]
        if not starts or not ends:
            continue
        versions: dict[str, str] = {}
        for info in infos:
            versions.update({k: str(v) for k, v in (info.get("versions") or {}).items() if v})
            image = (info.get("server") or {}).get("image")
            if image:
                versions["image"] = str(image)
        server, _ = cell_names(cell_dir.name, cell_record_or_none(cell_dir / CELL_INFO))
        found.append(CellWhen(cell_dir.name, server, min(starts), max(ends), versions))
    return sorted(found, key=lambda c: c.started)


def sittings(cells: list[CellWhen]) -> list[list[CellWhen]]:
    """Cells grouped into runs of work with no pause longer than :data:`SITTING_GAP_S`."""
    groups: list[list[CellWhen]] = []
    for cell in cells:
        if groups and (cell.started - max(c.finished for c in groups[-1])).total_seconds() <= SITTING_GAP_S:
            groups[-1].append(cell)
        else:
            groups.append([cell])
    return groups


def measured_apart_note(campaign_dir: Path) -> str | None:
    """Markdown saying the cells were measured at different times or versions, or None."""
    cells = cell_times(campaign_dir)
    groups = sittings(cells)
    harness = {c.part(framework=False) for c in cells}
    servers_changed = any(
        len({c.part(framework=True) for c in cells if c.server == server}) > 1 for server in {c.server for c in cells}
    )
    software_changed = len(harness) > 1 or servers_changed
    if len(groups) <= 1 and not software_changed:
        return None
    why = []
    if len(groups) > 1:
        why.append(f"in {len(groups)} separate sittings")
    if software_changed:
        why.append("with different software versions")
    lines = [
        f"> **Cells measured {' and '.join(why)}.** Compare them with care: the machine, its load and the "
        "software may have changed in between.",
        ">",
        "> | cell | measured (UTC) | versions |",
        "> |---|---|---|",
    ]
    for cell in cells:
        window = f"{cell.started:%Y-%m-%d %H:%M} – {cell.finished:%H:%M}"
        lines.append(f"> | {cell.cell_id} | {window} | {cell.text} |")
    return "\n".join(lines)
