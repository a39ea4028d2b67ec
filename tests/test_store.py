"""Run folders survive crashes: atomic writes, a torn journal line, salvaged summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakeoff.campaign.runner import salvage_runs
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import (
    RecordJournal,
    atomic_write_bytes,
    read_journal,
    read_json_or_empty,
    read_records,
    read_summary,
    write_records,
)


def record(i: int, ok: bool = True) -> RequestRecord:
    r = RequestRecord(i, start_ns=1_000_000 * i, first_event_ns=1_000_000 * i + 5, end_ns=1_000_000 * i + 50_000_000)
    r.first_token_ns = r.start_ns + 10_000_000
    r.chunk_ns = [r.first_token_ns, r.first_token_ns + 20_000_000]
    r.chunk_tokens = [1, 1]
    r.completion_tokens, r.prompt_tokens = 2, 8
    if not ok:
        r.error_kind, r.error = "stream_cut", "cut"
    return r


def test_journal_skips_a_torn_last_line_and_parquet_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordJournal(path) as journal:
        for i in range(3):
            journal.append(record(i, ok=i != 1))
    with open(path, "ab") as handle:
        handle.write(b'{"request_id": 9, "war')  # the process died mid-write
    records = read_journal(path)
    assert [r.request_id for r in records] == [0, 1, 2]
    write_records(tmp_path / "records.parquet", records)
    assert read_records(tmp_path / "records.parquet") == records


def test_journal_line_is_the_records_row(tmp_path: Path) -> None:
    # The journal serializes the record directly (no to_row() copy): the same line, field for field.
    full = record(4, ok=False)
    full.chunk_phase, full.reasoning_tokens, full.reasoning_source, full.cached_tokens = [0, 1], 1, "server", 3
    with RecordJournal(tmp_path / "records.jsonl") as journal:
        journal.append(full)
    line = (tmp_path / "records.jsonl").read_bytes()
    assert json.loads(line) == full.to_row() and read_journal(tmp_path / "records.jsonl") == [full]


def test_salvage_finishes_an_interrupted_run(tmp_path: Path) -> None:
    run = tmp_path / "cells" / "a__w" / "runs" / "c4"
    with RecordJournal(run / "records.jsonl") as journal:
        journal.append(record(0))
        journal.append(record(1, ok=False))
    done = tmp_path / "cells" / "a__w" / "runs" / "c1"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    assert salvage_runs(tmp_path / "cells") == [run]
    summary = read_summary(run / "summary.json")
    assert summary.interrupted is True and summary.workload.run == "c4"
    assert summary.requests.ok == 1 and summary.requests.failed_by_kind == {"stream_cut": 1}
    assert (run / "records.parquet").is_file()
    assert json.loads((done / "summary.json").read_text()) == {}  # finished runs untouched


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    target.write_bytes(b"old")

    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temp file left


def test_optional_json_objects_read_as_empty_when_missing_or_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "cell.json"
    assert read_json_or_empty(path) == {}
    path.write_text("[1, 2]")
    assert read_json_or_empty(path) == {}
    path.write_text('{"status": "ok"}')
    assert read_json_or_empty(path) == {"status": "ok"}
