"""Where history lives: finished runs copied out of campaign folders so later runs cannot erase them.

A campaign folder (``reports/NAME``) is overwritten by the next ``campaign run --fresh``,
so every campaign run ends by archiving what it measured (:func:`archive_campaign`)::

    HISTORY/                      $BAKEOFF_HISTORY, --history-dir, else reports/.history
      baselines.json              bakeoff.history.baseline
      index.duckdb                bakeoff.history.index: rebuilt from the folders below at will
      NAME/20260105T020000Z/      one archive: one campaign run
        archive.json              manifest: campaign, source folder, campaign file's git revision, runs
        campaign.yaml
        cells/CELL/cell.json      (and quality.json when the campaign checked quality)
        cells/CELL/runs/RUN/summary.json, run.json

An archive has the campaign folder's own layout, so everything that reads a campaign
folder reads an archive. Only finished runs go in (not interrupted, summary present);
a run already archived (same cell, run and start time: a resumed campaign that skipped
it) is not copied twice, and a campaign run that measured nothing new makes no archive.
An archive is written under a temporary name and renamed into place, so a crash leaves
no half archive.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.errors import BakeoffError, ResultsError, SpecError
from bakeoff.paths import reports_dir
from bakeoff.results.layout import REHEARSAL_MARKER, is_rehearsal, read_campaign_copy
from bakeoff.results.store import CELL_INFO, RUN_INFO, SUMMARY, read_json, read_summary, write_json
from bakeoff.results.summary import RunSummary

HISTORY_ENV = "BAKEOFF_HISTORY"
MANIFEST = "archive.json"
CAMPAIGN_COPY = "campaign.yaml"  # as bakeoff.campaign.execute writes it
_CELL_FILES = (CELL_INFO, "quality.json")
_RUN_FILES = (SUMMARY, RUN_INFO)


def history_root(explicit: Path | None = None) -> Path:
    """``explicit`` (--history-dir), else ``$BAKEOFF_HISTORY``, else ``reports/.history``."""
    if explicit is not None:
        return explicit.expanduser().resolve()
    env = os.environ.get(HISTORY_ENV)
    if env:
        return Path(env).expanduser().resolve()

    return reports_dir() / ".history"


def campaign_name(folder: Path) -> str:
    """The campaign's name, from the campaign.yaml a campaign folder (or archive) holds."""
    path = folder / CAMPAIGN_COPY
    if not path.is_file():
        raise SpecError(f"{folder}: not a campaign folder or archive (no {CAMPAIGN_COPY}); give reports/NAME")
    name = read_campaign_copy(folder).name
    if not name:
        raise SpecError(f"{path}: no campaign name in it")
    return name.replace("/", "_")


def campaign_revision(campaign_file: Path | None) -> dict[str, Any]:
    """The campaign file's last git commit, whether it differs from it, and its digest."""
    if campaign_file is None or not campaign_file.is_file():
        return {"file": None, "git_revision": None, "dirty": None, "sha256": None}
    path = campaign_file.resolve()
    found: dict[str, Any] = {"file": str(path), "git_revision": None, "dirty": None}
    found["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(path.parent), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    revision = git("log", "-n", "1", "--format=%H", "--", path.name)
    if revision:
        found["git_revision"] = revision
        found["dirty"] = bool(git("status", "--porcelain", "--", path.name))
    return found


def run_key(cell_id: str, run: str, started_at: str | None) -> str:
    """What makes a run the same run in two places: its cell, its name and when it started."""
    return f"{cell_id}/{run}@{started_at or '?'}"


@dataclass(frozen=True)
class FinishedRun:
    cell_id: str
    run: str
    folder: Path
    key: str
    summary: RunSummary


def finished_runs(folder: Path) -> list[FinishedRun]:
    """Runs of a campaign folder (or archive) that finished: summary readable, not interrupted."""
    found = []
    for path in sorted(folder.glob(f"cells/*/runs/*/{SUMMARY}")):
        try:
            summary = read_summary(path)
        except ResultsError:
            continue  # a damaged run is not history; the report shows it as it is
        if summary.interrupted:
            continue
        run_dir = path.parent
        cell_id = run_dir.parent.parent.name
        key = run_key(cell_id, run_dir.name, summary.provenance.started_at)
        found.append(FinishedRun(cell_id, run_dir.name, run_dir, key, summary))
    return found


def archives(root: Path, campaign: str | None = None) -> list[Path]:
    """Every archive under ``root`` (of one campaign), oldest first."""
    pattern = f"{campaign}/*/{MANIFEST}" if campaign else f"*/*/{MANIFEST}"
    return sorted((p.parent for p in root.glob(pattern)), key=lambda p: (p.name, p.parent.name))


def manifest(archive: Path) -> dict[str, Any]:
    body: dict[str, Any] = read_json(archive / MANIFEST)
    return body


def archive_id(archive: Path) -> str:
    """``NAME/STAMP``: how the index, baselines and the CLI name an archive."""
    return f"{archive.parent.name}/{archive.name}"


def archived_keys(root: Path, campaign: str) -> set[str]:
    return {key for a in archives(root, campaign) for key in manifest(a).get("runs", [])}


def _stamp(now: dt.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ")


def archive_campaign(campaign_dir: Path, root: Path | None = None, campaign_file: Path | None = None) -> Path | None:
    """Copy the folder's finished runs not archived yet into a new archive; None when there are none."""
    root = history_root(root)
    name = campaign_name(campaign_dir)
    known = archived_keys(root, name)
    new = [r for r in finished_runs(campaign_dir) if r.key not in known]
    if not new:
        return None
    now = dt.datetime.now(dt.UTC)
    dest = root / name / _stamp(now)
    n = 2
    while dest.exists():  # two archives in one second: keep both
        dest = root / name / f"{_stamp(now)}-{n}"
        n += 1
    tmp = dest.parent / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_runs(campaign_dir, tmp, new)
        write_json(
            tmp / MANIFEST,
            {
                "campaign": name,
                "source_dir": str(campaign_dir.resolve()),
                "archived_at": now.isoformat(timespec="seconds"),
                "campaign_file": campaign_revision(campaign_file),
                # Reference-server stand-ins: kept apart in the index, never a measurement.
                "rehearsal": (campaign_dir / REHEARSAL_MARKER).is_file(),
                "runs": [r.key for r in new],
            },
        )
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _copy_runs(campaign_dir: Path, dest: Path, runs: list[FinishedRun]) -> None:
    dest.mkdir(parents=True)
    shutil.copy2(campaign_dir / CAMPAIGN_COPY, dest / CAMPAIGN_COPY)
    for cell_id in sorted({r.cell_id for r in runs}):
        for name in _CELL_FILES:
            source = campaign_dir / "cells" / cell_id / name
            if source.is_file():
                (dest / "cells" / cell_id).mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / "cells" / cell_id / name)
    for run in runs:
        target = dest / "cells" / run.cell_id / "runs" / run.run
        target.mkdir(parents=True)
        for name in _RUN_FILES:
            if (run.folder / name).is_file():
                shutil.copy2(run.folder / name, target / name)


def archive_after_run(campaign_dir: Path, campaign_file: Path) -> Path | None:
    """The end of ``campaign run``: archive what it measured; a failure is a warning, not a lost report."""
    if is_rehearsal(campaign_dir):
        # Stand-ins' figures must never enter a trend or a regression gate.
        print("history: a rehearsal is not archived (nothing in it is a measurement)")
        return None
    try:
        made = archive_campaign(campaign_dir, None, campaign_file)
    except (OSError, BakeoffError) as exc:
        print(f"warning: could not archive {campaign_dir} into the history: {exc}", file=sys.stderr)
        return None
    if made is not None:
        print(f"history: archived as {archive_id(made)} in {made.parent.parent}")
    return made
