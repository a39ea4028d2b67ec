"""Resumable campaigns: which cells are already measured, and what an earlier attempt left.

A finished cell's ``cell.json`` carries a *fingerprint*: the hash of the request plans it
replayed, the server entry of the campaign (backend, knobs, image tag), the backend spec
and the versions of everything that measured (bakeoff, the engine packages installed
beside it). A re-run of the campaign into the same folder compares each cell's stored
fingerprint with the one it would have now:

========== ==================================================================
state      what the campaign does
========== ==================================================================
new        measures it
complete   skips it (same plans, knobs, versions; every run summary present)
changed    re-measures it (measured with other plans, knobs or versions)
interrupted re-measures it (Ctrl-C, bakeoff killed, its kernel died)
failed     re-measures it (failed start, a server that died mid-run)
========== ==================================================================

Before a cell is measured again, what the earlier attempt left is moved, whole, to
``cells/CELL/attempts/N/``: its journals (every request that finished, salvaged into
parquet and an ``interrupted`` summary by the campaign), its ``cell.json`` and its server
log. Nothing finished is lost and nothing of it is counted in the report, which reads
``cells/CELL/runs/`` only; the new ``cell.json`` lists the earlier attempts
(:func:`earlier_attempts`) and the report says the cell was re-measured.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bakeoff.results.cell_record import cell_record_or_none, read_cell_record
from bakeoff.results.store import (
    CELL_INFO,
    RECORDS_JOURNAL,
    SUMMARY,
    read_journal,
    read_json,
    read_json_or_empty,
    write_json,
)

ATTEMPTS = "attempts"
WHY = "why.json"
# What is left of an attempt besides its run folders; moved with them.
_ATTEMPT_FILES = (CELL_INFO, "server.log", "bench.ipynb", "quality.json")

CellState = Literal["new", "complete", "changed", "interrupted", "failed"]


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def plan_hash(plans_dir: Path) -> str:
    """SHA-256 over every plan file of a workload (names and bytes), in name order."""
    digest = hashlib.sha256()
    for path in sorted(plans_dir.glob("*.json")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(
    plans_dir: Path, server: dict[str, Any], backend: dict[str, Any], versions: dict[str, str | None]
) -> dict[str, Any]:
    """What must be unchanged for a finished cell to stand: plans, server entry, backend spec, versions.

    ``server`` is the campaign's server entry (knobs, image tag), ``backend`` the backend
    spec as data (its flags, image and version string), ``versions`` the installed packages.
    """
    spec_hash = hashlib.sha256(json.dumps(backend, sort_keys=True, default=str).encode()).hexdigest()
    return {
        "plan_hash": plan_hash(plans_dir),
        "server": server,
        "backend": {"name": backend.get("name"), "version": backend.get("version"), "spec_hash": spec_hash},
        "versions": versions,
    }


def differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fingerprint fields that differ (``versions.torch``, ``plan_hash``)."""
    found = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, name + ".")
        elif a != b:
            found.append(name)
    return found


@dataclass(frozen=True)
class ResumeState:
    """A cell's state in the campaign folder, and why (for the console and ``cell.json``)."""

    state: CellState
    reason: str


def cell_state(cell_dir: Path, expected: dict[str, Any]) -> ResumeState:
    """Decide whether ``cell_dir`` holds a finished measurement made under ``expected``."""
    info_path = cell_dir / CELL_INFO
    if not info_path.is_file():
        return ResumeState("new", "not measured yet")
    record = read_cell_record(info_path)
    status = record.status
    if status in ("running", "interrupted"):
        when = record.started_at or "an earlier run"
        return ResumeState("interrupted", f"interrupted mid-cell (attempt started {when})")
    if status != "ok":
        cause = "its server died mid-run" if record.server_died else str(record.error or "").split("\n")[0]
        return ResumeState("failed", f"failed in an earlier run: {cause[:200]}")
    changed = differences(record.fingerprint or {}, expected)
    if changed:
        return ResumeState("changed", f"measured with other {', '.join(changed[:4])}")
    summaries = list((cell_dir / "runs").glob(f"*/{SUMMARY}"))
    if not summaries or any(read_json(p).get("interrupted") for p in summaries):
        return ResumeState("interrupted", "a run of it was cut short")
    return ResumeState("complete", "already measured (same plans, knobs and versions)")


def archive_attempt(cell_dir: Path, reason: str) -> Path | None:
    """Move what an earlier attempt left in ``cell_dir`` to ``attempts/N``; return that folder.

    ``reason`` (why the cell is measured again) is kept beside it in ``why.json``. Journals
    should be salvaged first (:func:`bakeoff.campaign.runner.salvage_runs`) so every archived run
    has its parquet and summary beside the journal.
    """
    leftovers = [cell_dir / n for n in (*_ATTEMPT_FILES, "runs", "restart") if (cell_dir / n).exists()]
    if not leftovers:
        return None
    root = cell_dir / ATTEMPTS
    number = 1 + max((int(p.name) for p in root.glob("*") if p.name.isdigit()), default=0)
    target = root / str(number)
    target.mkdir(parents=True)
    for path in leftovers:
        shutil.move(str(path), str(target / path.name))
    write_json(target / WHY, {"reason": reason, "archived_at": now_iso()})
    return target


def earlier_attempts(cell_dir: Path) -> list[dict[str, Any]]:
    """Each archived attempt of a cell: how it ended and how many requests it had finished."""
    found = []
    root = cell_dir / ATTEMPTS
    for folder in sorted((p for p in root.glob("*") if p.name.isdigit()), key=lambda p: int(p.name)):
        record = cell_record_or_none(folder / CELL_INFO)  # None: the attempt left no readable record
        finished = sum(
            sum(1 for r in read_journal(j) if not r.warmup) for j in folder.glob(f"runs/*/{RECORDS_JOURNAL}")
        )
        status = (record.status if record is not None else None) or "unknown"
        why = read_json_or_empty(folder / WHY)
        found.append(
            {
                "attempt": f"{ATTEMPTS}/{folder.name}",
                "status": "interrupted" if status == "running" else status,
                "why_measured_again": why.get("reason"),
                "started_at": record.started_at if record is not None else None,
                "finished_requests": finished,
                "server_died": record is not None and bool(record.server_died),
            }
        )
    return found


def failed_cells(campaign_dir: Path) -> dict[str, str]:
    """Cell id -> why, for every cell whose last attempt did not finish cleanly."""
    failed = {}
    for path in sorted((campaign_dir / "cells").glob(f"*/{CELL_INFO}")):
        record = read_cell_record(path)
        if record.status != "ok":
            failed[path.parent.name] = "server died mid-run" if record.server_died else str(record.status)
    return failed


def start_over(campaign_dir: Path) -> None:
    """``--fresh``: drop every measured cell and the rendered report; plans are rebuilt as needed."""
    shutil.rmtree(campaign_dir / "cells", ignore_errors=True)
    for name in ("compare.ipynb", "report.html"):
        (campaign_dir / name).unlink(missing_ok=True)
