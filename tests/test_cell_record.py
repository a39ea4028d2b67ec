"""cell.json's versioned, typed model: a folder written before the version (or with an effort key this bakeoff does
not know) reads, a write carries the version, and a reader that may do without one gets None."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bakeoff.errors import ResultsError
from bakeoff.results.cell_record import (
    CELL_SCHEMA_VERSION,
    cell_record_or_none,
    read_cell_record,
    update_cell_record,
    write_cell_record,
)
from bakeoff.results.layout import cell_names, load_cells


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


def test_the_effort_is_typed_and_an_effort_key_this_bakeoff_does_not_know_still_loads(tmp_path: Path) -> None:
    cell = tmp_path / "cells" / "a__sweep"
    cell.mkdir(parents=True)
    effort = {
        "cold_start_s": 41.5,
        "knob_change_needs": {"max_num_seqs": "restart"},
        "cache_restarts": [{"before_run": "c1", "stop_s": 1.0, "start_s": 30.0}],
        "server": {"label": "a", "dtypes": {"weights": "bf16"}, "image_defaults": {"max_num_seqs": 256}},
        "startup_note": "a key an older bakeoff wrote",
    }
    (cell / "cell.json").write_bytes(orjson.dumps({"server": {"label": "a"}, "status": "ok", "effort": effort}))
    [loaded] = load_cells(tmp_path)
    assert loaded.effort.cold_start_s == 41.5 and loaded.effort.cache_restarts[0].start_s == 30.0
    assert loaded.effort.server is not None and loaded.effort.server.dtypes == {"weights": "bf16"}
    assert loaded.effort.model_extra == {"startup_note": "a key an older bakeoff wrote"}
    assert loaded.record.as_json()["effort"]["startup_note"] == "a key an older bakeoff wrote"


def test_a_missing_or_unreadable_cell_json_reads_as_none_where_a_reader_may_do_without(tmp_path: Path) -> None:
    path = tmp_path / "cells" / "a__chat__r2" / "cell.json"
    assert cell_record_or_none(path) is None
    assert cell_names("a__chat__r2", None) == ("a", "chat")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{not json")
    assert cell_record_or_none(path) is None
    with pytest.raises(ResultsError, match="cannot read"):
        read_cell_record(path)
    path.write_bytes(orjson.dumps({"effort": {"cold_start_s": "slow"}}))
    assert cell_record_or_none(path) is None
    with pytest.raises(ResultsError, match=r"effort\.cold_start_s"):
        read_cell_record(path)
    path.write_bytes(orjson.dumps({"server": {"label": "b"}, "workload": "long"}))
    assert cell_names("a__chat__r2", cell_record_or_none(path)) == ("b", "long")


def test_updating_a_record_keeps_what_it_does_not_set(tmp_path: Path) -> None:
    path = tmp_path / "cell.json"
    write_cell_record(path, {"server": {"label": "a"}, "status": "ok", "effort": {"cold_start_s": 3.0, "x": 1}, "y": 2})
    update_cell_record(path, ray={"node": {"node_id": "n1"}, "tries": [], "retried": 0})
    raw = orjson.loads(path.read_bytes())
    assert raw["status"] == "ok" and raw["y"] == 2 and raw["effort"] == {"cold_start_s": 3.0, "x": 1}
    assert raw["ray"]["node"] == {"node_id": "n1"} and raw["schema_version"] == CELL_SCHEMA_VERSION
