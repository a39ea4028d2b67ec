"""cell.json's versioned model: a folder written before the version reads unchanged, and a write carries it."""

from __future__ import annotations

from pathlib import Path

import orjson

from bakeoff.results.cell_record import CELL_SCHEMA_VERSION, read_cell_record, write_cell_record
from bakeoff.results.layout import load_cells


def test_a_cell_json_without_a_version_reads_as_layout_one_with_its_fields(tmp_path: Path) -> None:
    cell = tmp_path / "cells" / "a__sweep"
    cell.mkdir(parents=True)
    old = {"server": {"label": "a", "backend": "vllm"}, "backend": "vllm", "workload": "sweep", "status": "ok"}
    (cell / "cell.json").write_bytes(orjson.dumps({**old, "ray": {"node": "n1", "tries": 1, "retried": False}}))
    record = read_cell_record(cell / "cell.json")
    assert record.schema_version == CELL_SCHEMA_VERSION
    assert record.status == "ok" and record.ray == {"node": "n1", "tries": 1, "retried": False}
    [loaded] = load_cells(tmp_path)
    assert (loaded.label, loaded.backend, loaded.workload, loaded.status) == ("a", "vllm", "sweep", "ok")
    assert loaded.ray == {"node": "n1", "tries": 1, "retried": False}


def test_a_written_cell_json_carries_the_version_and_keeps_an_unknown_field(tmp_path: Path) -> None:
    path = tmp_path / "cell.json"
    write_cell_record(path, {"server": {"label": "a"}, "status": "running", "later_field": 3})
    raw = orjson.loads(path.read_bytes())
    assert raw["schema_version"] == CELL_SCHEMA_VERSION and raw["later_field"] == 3
    assert read_cell_record(path).as_json()["later_field"] == 3
