"""Baselines: which archived run of each campaign and server new runs are judged against.

``bakeoff baseline set REF`` marks, per server of REF's campaign, the archive holding that
server's runs. REF is any of:

- a campaign folder (``reports/NAME``): archived first if it holds runs not archived yet;
- an archive (``HISTORY/NAME/STAMP``, or ``NAME/STAMP`` as ``bakeoff history`` lists it);
- one run folder inside either (``.../cells/CELL/runs/RUN``): that cell's server only.

The marks live in ``HISTORY/baselines.json`` (written atomically), keyed by campaign and
server label, so a later campaign run, which writes a new archive, leaves them alone.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.errors import SpecError
from bakeoff.history import archive as arch
from bakeoff.history.index import BASELINES, load_baselines
from bakeoff.results.cell_record import cell_record_or_none
from bakeoff.results.layout import cell_names
from bakeoff.results.store import CELL_INFO, SUMMARY, write_json


@dataclass(frozen=True)
class Ref:
    """A folder with a campaign folder's layout, and the one server asked for (None: all)."""

    folder: Path
    server: str | None = None

    @property
    def is_archive(self) -> bool:
        return (self.folder / arch.MANIFEST).is_file()


def resolve(ref: str | Path, root: Path) -> Ref:
    """A campaign folder, an archive (path or NAME/STAMP) or a run folder inside one."""
    path = Path(ref).expanduser()
    if not path.exists() and (root / path / arch.MANIFEST).is_file():
        path = root / path
    path = path.resolve()
    if (path / SUMMARY).is_file() and path.parent.name == "runs" and path.parents[2].name == "cells":
        cell_dir = path.parents[1]
        return Ref(path.parents[3], cell_names(cell_dir.name, cell_record_or_none(cell_dir / CELL_INFO))[0])
    if (path / arch.MANIFEST).is_file() or (path / arch.CAMPAIGN_COPY).is_file():
        return Ref(path)
    raise SpecError(
        f"{ref}: not a campaign folder, an archive or a run folder; give reports/NAME, an archive as "
        "'bakeoff history' lists it (NAME/STAMP), or a folder cells/CELL/runs/RUN"
    )


def servers_of(folder: Path) -> dict[str, list[str]]:
    """Server label -> run keys of its finished runs in a campaign folder or archive."""
    found: dict[str, list[str]] = {}
    for run in arch.finished_runs(folder):
        cell = cell_record_or_none(folder / "cells" / run.cell_id / CELL_INFO)
        found.setdefault(cell_names(run.cell_id, cell)[0], []).append(run.key)
    return found


def archive_holding(root: Path, campaign: str, keys: list[str]) -> Path | None:
    """The newest archive of ``campaign`` holding any of the run keys."""
    wanted = set(keys)
    holding = [a for a in arch.archives(root, campaign) if wanted & set(arch.manifest(a).get("runs", []))]
    return holding[-1] if holding else None


def set_baseline(ref: str | Path, root: Path) -> dict[str, str]:
    """Mark REF as the baseline of its campaign, per server; returns server -> archive id."""
    target = resolve(ref, root)
    campaign = arch.campaign_name(target.folder)
    if not target.is_archive:
        made = arch.archive_campaign(target.folder, root)
        if made is not None:
            print(f"archived {target.folder} as {arch.archive_id(made)}")
    servers = servers_of(target.folder)
    if target.server is not None:
        servers = {target.server: servers.get(target.server, [])}
    marks: dict[str, str] = {}
    for server, keys in sorted(servers.items()):
        holder = target.folder if target.is_archive else archive_holding(root, campaign, keys)
        if not keys or holder is None:
            raise SpecError(f"{ref}: server {server} has no finished run to mark as a baseline")
        marks[server] = arch.archive_id(holder)
    if not marks:
        raise SpecError(f"{ref}: no finished runs in it to mark as a baseline; run the campaign first")
    body = load_baselines(root)
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for server, ident in marks.items():
        body.setdefault(campaign, {})[server] = {"archive": ident, "set_at": now, "source": str(ref)}
    write_json(root / BASELINES, body)
    return marks


def baseline_archives(root: Path, campaign: str) -> dict[str, Path]:
    """Server -> its baseline archive folder, for a campaign; a mark whose archive is gone is an error."""
    found: dict[str, Path] = {}
    entries: dict[str, dict[str, Any]] = load_baselines(root).get(campaign, {})
    for server, entry in entries.items():
        folder = root / str(entry.get("archive"))
        if not (folder / arch.MANIFEST).is_file():
            raise SpecError(
                f"{root / BASELINES}: the baseline of {campaign} / {server} is archive {entry.get('archive')}, "
                "which is gone; mark another one with 'bakeoff baseline set'"
            )
        found[server] = folder
    return found


def first_run_sets_baseline(ref: str | Path, root: Path) -> dict[str, str] | None:
    """Mark REF as its campaign's baseline when the campaign has none yet; None when it has one.

    A scheduled campaign's first run has nothing to be judged against: it becomes the
    baseline (``compare --or-set-baseline``) and every later run is judged against it.
    """
    campaign = arch.campaign_name(resolve(ref, root).folder)
    if baseline_archives(root, campaign):
        return None
    return set_baseline(ref, root)
