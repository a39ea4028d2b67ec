"""The history index: one DuckDB file over every archived run, rebuilt from the archives at will.

The archives (:mod:`bakeoff.history.archive`) are the source of truth; ``HISTORY/index.duckdb``
is a cache of them that SQL can read. :func:`connect` opens it read-only after checking
that it matches the archives on disk (their list and the baselines file, hashed into
``meta.state``); an index that is missing, stale or damaged (unreadable, truncated, from
an older layout) is rebuilt from the archives first. A rebuild writes a new database
under a temporary name and renames it over the old one, so a reader never sees half an
index and a crash mid-build leaves the old one.

Tables (``bakeoff history --sql`` reads them):

=========== ======================================================================================
archives    one row per campaign run archived: archive, campaign, archived_at, source_dir,
            campaign_file, campaign_revision (git), campaign_dirty, rehearsal, runs
runs        one row per run: run_id, archive, campaign, server, backend, framework_version,
            image, image_digest, knobs (JSON), model, workload, run, repeat, mode, concurrency, rate,
            machine, cpu_model, gpu, gpu_count, gpu_driver, campaign_revision, bakeoff_version,
            started_at, finished_at, rehearsal, server_died, requests_ok, requests_failed, path
metrics     run_id, metric, value, lo, hi (an interval the summary itself carries), repeats,
            better ('higher' / 'lower' / NULL): every figure of the metric table, per repeat
estimates   archive, campaign, server, workload, run, metric, value (mean over the repeats), lo,
            hi (its Student-t interval, bakeoff.analysis.confidence), repeats, better: every gate metric
quality     archive, campaign, server, workload, metric, value: a cell's quality.json rates
baselines   campaign, server, archive, set_at (bakeoff baseline set)
run_metrics runs joined with metrics (a view)
=========== ======================================================================================
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bakeoff.analysis.thresholds import GATE_METRICS, estimates, quality_readings, readings
from bakeoff.errors import SpecError
from bakeoff.history import archive as arch
from bakeoff.observe.origin import FRAMEWORK_PACKAGES
from bakeoff.results.campaign_copy import CampaignCopy
from bakeoff.results.cell_record import cell_record_or_none
from bakeoff.results.layout import cell_names, read_campaign_copy
from bakeoff.results.store import CELL_INFO, RUN_INFO, read_json, read_json_or_empty

if TYPE_CHECKING:
    import duckdb

INDEX = "index.duckdb"
BASELINES = "baselines.json"
# Bumped when the tables change: an index of another layout is rebuilt.
INDEX_VERSION = 1

_DDL = """
CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE archives (
    archive VARCHAR PRIMARY KEY, campaign VARCHAR, archived_at TIMESTAMPTZ, source_dir VARCHAR,
    campaign_file VARCHAR, campaign_revision VARCHAR, campaign_dirty BOOLEAN, rehearsal BOOLEAN, runs INTEGER);
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY, archive VARCHAR, campaign VARCHAR, server VARCHAR, backend VARCHAR,
    framework_version VARCHAR, image VARCHAR, image_digest VARCHAR, knobs JSON, model VARCHAR, workload VARCHAR,
    run VARCHAR, repeat INTEGER, mode VARCHAR, concurrency INTEGER, rate DOUBLE, machine VARCHAR, cpu_model VARCHAR,
    gpu VARCHAR, gpu_count INTEGER, gpu_driver VARCHAR, campaign_revision VARCHAR, bakeoff_version VARCHAR,
    started_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, rehearsal BOOLEAN, server_died BOOLEAN,
    requests_ok INTEGER, requests_failed INTEGER, path VARCHAR);
CREATE TABLE metrics (
    run_id VARCHAR, metric VARCHAR, value DOUBLE, lo DOUBLE, hi DOUBLE, repeats INTEGER, better VARCHAR);
CREATE TABLE estimates (
    archive VARCHAR, campaign VARCHAR, server VARCHAR, workload VARCHAR, run VARCHAR, metric VARCHAR,
    value DOUBLE, lo DOUBLE, hi DOUBLE, repeats INTEGER, better VARCHAR);
CREATE TABLE quality (
    archive VARCHAR, campaign VARCHAR, server VARCHAR, workload VARCHAR, metric VARCHAR, value DOUBLE);
CREATE TABLE baselines (campaign VARCHAR, server VARCHAR, archive VARCHAR, set_at TIMESTAMPTZ);
CREATE VIEW run_metrics AS SELECT r.*, m.metric, m.value, m.lo, m.hi, m.repeats, m.better
    FROM runs r JOIN metrics m USING (run_id);
"""


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise SpecError("the history index needs DuckDB: pip install 'bakeoff[history]'") from None
    return duckdb


def _time(text: object) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text)) if text else None
    except ValueError:
        return None


def _model(campaign: CampaignCopy, server: dict[str, Any]) -> str | None:
    if server.get("model_path"):
        return str(server["model_path"])
    return campaign.model_label()


def _framework(summary_version: str | None, info: dict[str, Any]) -> str | None:
    """Provenance's version; for runs from before it was recorded, the engine packages run.json lists."""
    if summary_version:
        return summary_version
    engine = (info.get("versions") or {}).get("engine") or {}
    return next((str(engine[p]) for p in FRAMEWORK_PACKAGES if isinstance(engine, dict) and engine.get(p)), None)


RunKey = tuple[str, str, str]  # server, workload, run: what repeats share


def repeat_groups(folder: Path) -> dict[RunKey, list[arch.FinishedRun]]:
    """A folder's finished runs grouped by server, workload and run name: the repeats of each."""
    groups: dict[RunKey, list[arch.FinishedRun]] = {}
    for run in arch.finished_runs(folder):
        server, workload = cell_names(run.cell_id, cell_record_or_none(folder / "cells" / run.cell_id / CELL_INFO))
        groups.setdefault((server, workload, run.run), []).append(run)
    return groups


def run_facts(folder: Path, run: arch.FinishedRun, campaign: CampaignCopy) -> dict[str, Any]:
    """One ``runs`` row: what ran, where, with what, and when (summary, run.json, cell.json, campaign)."""
    info = read_json_or_empty(run.folder / RUN_INFO)
    cell = cell_record_or_none(folder / "cells" / run.cell_id / CELL_INFO)
    server_cfg = cell.server if cell is not None else {}
    cell_backend = cell.backend if cell is not None else None
    server_info = info.get("server") or {}
    server, workload = cell_names(run.cell_id, cell)
    machine = info.get("machine") or {}
    summary = run.summary
    prov = summary.provenance
    return {
        "server": server,
        "backend": server_info.get("backend") or cell_backend or server_cfg.get("backend"),
        "framework_version": _framework(prov.framework_version, info),
        "image": prov.image or server_info.get("image"),
        "image_digest": prov.image_digest or server_info.get("image_digest"),
        "knobs": json.dumps(server_info.get("knobs") or server_cfg.get("knobs") or {}, sort_keys=True),
        "model": _model(campaign, server_cfg),
        "workload": workload,
        "run": run.run,
        "repeat": summary.workload.repeat,
        "mode": summary.workload.mode,
        "concurrency": summary.workload.concurrency,
        "rate": summary.workload.rate,
        "machine": prov.machine or machine.get("hostname"),
        "cpu_model": machine.get("cpu_model"),
        "gpu": machine.get("gpu"),
        "gpu_count": machine.get("gpu_count"),
        "gpu_driver": machine.get("gpu_driver"),
        "bakeoff_version": prov.bakeoff_version,
        "started_at": _time(prov.started_at or info.get("started_at")),
        "finished_at": _time(prov.finished_at or info.get("finished_at")),
        "server_died": summary.server_died is not None,
        "requests_ok": summary.requests.ok,
        "requests_failed": summary.requests.failed,
        "path": str(run.folder),
    }


def _rows(root: Path) -> dict[str, list[dict[str, Any]]]:
    tables: dict[str, list[dict[str, Any]]] = {t: [] for t in ("archives", "runs", "metrics", "estimates", "quality")}
    for folder in arch.archives(root):
        meta = arch.manifest(folder)
        ident = arch.archive_id(folder)
        campaign = read_campaign_copy(folder)
        revision = (meta.get("campaign_file") or {}).get("git_revision")
        runs = arch.finished_runs(folder)
        tables["archives"].append(
            {
                "archive": ident,
                "campaign": meta.get("campaign"),
                "archived_at": _time(meta.get("archived_at")),
                "source_dir": meta.get("source_dir"),
                "campaign_file": (meta.get("campaign_file") or {}).get("file"),
                "campaign_revision": revision,
                "campaign_dirty": (meta.get("campaign_file") or {}).get("dirty"),
                "rehearsal": bool(meta.get("rehearsal")),
                "runs": len(runs),
            }
        )
        for run in runs:
            run_id = f"{ident}/{run.cell_id}/{run.run}"
            row = {"run_id": run_id, "archive": ident, "campaign": meta.get("campaign")}
            row |= run_facts(folder, run, campaign)
            row |= {"campaign_revision": revision, "rehearsal": bool(meta.get("rehearsal"))}
            tables["runs"].append(row)
            for name, reading in readings(run.summary).items():
                gate = GATE_METRICS.get(name)
                tables["metrics"].append(
                    {
                        "run_id": run_id,
                        "metric": name,
                        "value": reading.value,
                        "lo": reading.lo,
                        "hi": reading.hi,
                        "repeats": reading.repeats,
                        "better": gate.better if gate else None,
                    }
                )
        for (server, workload, run_name), repeats in repeat_groups(folder).items():
            for name, reading in estimates([r.summary for r in repeats]).items():
                tables["estimates"].append(
                    {
                        "archive": ident,
                        "campaign": meta.get("campaign"),
                        "server": server,
                        "workload": workload,
                        "run": run_name,
                        "metric": name,
                        "value": reading.value,
                        "lo": reading.lo,
                        "hi": reading.hi,
                        "repeats": reading.repeats,
                        "better": GATE_METRICS[name].better,
                    }
                )
        for path in sorted(folder.glob("cells/*/quality.json")):
            server, workload = cell_names(path.parent.name, cell_record_or_none(path.parent / CELL_INFO))
            for name, reading in quality_readings(read_json_or_empty(path)).items():
                tables["quality"].append(
                    {
                        "archive": ident,
                        "campaign": meta.get("campaign"),
                        "server": server,
                        "workload": workload,
                        "metric": name,
                        "value": reading.value,
                    }
                )
    return tables


def load_baselines(root: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """campaign -> server -> {archive, set_at, source}; empty when none was set."""
    path = root / BASELINES
    if not path.is_file():
        return {}
    body: dict[str, dict[str, dict[str, Any]]] = read_json(path)
    return body


def state(root: Path) -> str:
    """What the index must reflect: its layout, the archives present and the baselines."""
    digest = hashlib.sha256(f"v{INDEX_VERSION}\n".encode())
    for folder in arch.archives(root):
        digest.update(arch.archive_id(folder).encode() + b"\n")
    if (root / BASELINES).is_file():
        digest.update((root / BASELINES).read_bytes())
    return digest.hexdigest()


def rebuild(root: Path) -> Path:
    """Write the index from the archives: to a temporary file, then renamed over the old one."""
    duckdb = _duckdb()
    root.mkdir(parents=True, exist_ok=True)
    target = root / INDEX
    tmp = root / f".{INDEX}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        con = duckdb.connect(str(tmp))
        try:
            con.execute(_DDL)
            for table, rows in _rows(root).items():
                _insert(con, table, rows)
            baselines = [
                {"campaign": c, "server": s, "archive": e.get("archive"), "set_at": _time(e.get("set_at"))}
                for c, servers in load_baselines(root).items()
                for s, e in servers.items()
            ]
            _insert(con, "baselines", baselines)
            con.execute("INSERT INTO meta VALUES ('state', ?), ('version', ?)", [state(root), str(INDEX_VERSION)])
        finally:
            con.close()
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)
    return target


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
    batch = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
    con.register("batch", batch)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM batch")
    finally:
        con.unregister("batch")


@contextlib.contextmanager
def connect(root: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """The index, read-only, rebuilt first when missing, stale or damaged."""
    duckdb = _duckdb()
    path = root / INDEX
    if not root.is_dir():
        raise SpecError(f"no history at {root}: run a campaign first (it archives there), or give --history-dir")
    if path.exists():
        try:
            con = duckdb.connect(str(path), read_only=True)
        except duckdb.Error as exc:
            print(f"bakeoff: history index {path} is damaged ({exc}); rebuilding it from the archives", file=sys.stderr)
        else:
            if _current(con, root):
                try:
                    yield con
                finally:
                    con.close()
                return
            con.close()
    rebuild(root)
    con = duckdb.connect(str(path), read_only=True)
    try:
        yield con
    finally:
        con.close()


def _current(con: duckdb.DuckDBPyConnection, root: Path) -> bool:
    duckdb = _duckdb()
    try:
        found = con.execute("SELECT value FROM meta WHERE key = 'state'").fetchone()
    except duckdb.Error:
        return False  # no meta table: not an index bakeoff wrote, or an older layout
    return found is not None and found[0] == state(root)


def query(root: Path, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of a read-only SQL query over the index."""
    duckdb = _duckdb()
    with connect(root) as con:
        try:
            result = con.execute(sql)
        except duckdb.Error as exc:
            raise SpecError(
                f"--sql: {exc}".splitlines()[0] + " (tables: archives, runs, metrics, quality, baselines, run_metrics)"
            ) from exc
        return [d[0] for d in result.description or []], result.fetchall()


def list_runs(
    root: Path, campaign: str | None = None, server: str | None = None, metric: str | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The runs table, newest first, filtered; with ``metric``, its value and interval per run."""
    if metric is not None and metric not in GATE_METRICS and metric not in _all_metric_names(root):
        raise SpecError(f"--metric {metric}: no run has it; e.g. {', '.join(list(GATE_METRICS)[:6])}")
    where, params = ["TRUE"], []
    if campaign:
        where.append("r.campaign = ?")
        params.append(campaign)
    if server:
        where.append("r.server = ?")
        params.append(server)
    columns = "r.started_at, r.campaign, r.server, r.workload, r.run, r.framework_version, r.machine, r.archive"
    join = ""
    if metric:
        columns += f', m.value AS "{metric}", m.lo, m.hi'
        join = "JOIN metrics m ON m.run_id = r.run_id AND m.metric = ?"
        params.insert(0, metric)
    sql = f"SELECT {columns} FROM runs r {join} WHERE {' AND '.join(where)} ORDER BY r.started_at DESC, r.run_id"
    with connect(root) as con:
        result = con.execute(sql, params)
        return [d[0] for d in result.description or []], result.fetchall()


def _all_metric_names(root: Path) -> set[str]:
    with connect(root) as con:
        return {row[0] for row in con.execute("SELECT DISTINCT metric FROM metrics").fetchall()}
