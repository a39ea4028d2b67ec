"""Run folders on disk: atomic writes, an append-only record journal, parquet and JSON.

``summary.json`` goes through :func:`write_summary` / :func:`read_summary` only: the
:class:`~bakeoff.results.summary.RunSummary` model is validated on the way out and on the way in,
and a folder written by an older layout is migrated as it is read.

Completed results are never lost or half-written: every file is written to a temporary
name and renamed into place, and each finished request is appended to ``records.jsonl``
as it completes, so a crash or Ctrl-C keeps everything measured so far.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from bakeoff.errors import ResultsError
from bakeoff.results.records import RequestRecord
from bakeoff.results.summary import RunSummary, migrate

ModelT = TypeVar("ModelT", bound=BaseModel)

RECORDS_JOURNAL = "records.jsonl"
RECORDS_PARQUET = "records.parquet"
SUMMARY = "summary.json"
RUN_INFO = "run.json"
CELL_INFO = "cell.json"  # per cell: its server, status, fingerprint, effort and attempts


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any) -> None:
    atomic_write_bytes(
        path,
        orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS) + b"\n",
    )


def read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def read_json_or_empty(path: Path) -> dict[str, Any]:
    """A JSON object file's body; ``{}`` when the file is missing or holds no object."""
    if not path.is_file():
        return {}
    body = read_json(path)
    return body if isinstance(body, dict) else {}


def _invalid(path: Path, exc: ValidationError, what: str = "run summary") -> ResultsError:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()[:5]
    )
    return ResultsError(f"{path} does not match the {what} schema: {problems}")


def read_versioned(
    path: Path, model: type[ModelT], migrate: Callable[[dict[str, Any]], dict[str, Any]], what: str
) -> ModelT:
    """A versioned JSON file (``summary.json``, ``cell.json``) of any known layout: read, upgraded by
    ``migrate`` and validated as ``model``; a ResultsError naming the file (and ``what`` it should
    be) when it cannot be read, is not a JSON object, or does not match."""
    try:
        raw = read_json(path)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ResultsError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ResultsError(f"{path}: a {what} is a JSON object, found {type(raw).__name__}")
    try:
        return model.model_validate(migrate(raw))
    except ValidationError as exc:
        raise _invalid(path, exc, what) from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # an old layout too damaged to migrate
        raise ResultsError(f"{path}: {exc!r}") from exc


def write_summary(path: Path, summary: RunSummary) -> None:
    """Validate ``summary`` (assignments and ``model_copy`` updates are not checked) and write it."""
    body = summary.model_dump(mode="json")
    try:
        RunSummary.model_validate(body)
    except ValidationError as exc:
        raise _invalid(path, exc) from exc
    write_json(path, body)


def read_summary(path: Path) -> RunSummary:
    """A run's ``summary.json`` of any known layout, validated, as the current model."""
    return read_versioned(path, RunSummary, migrate, "run summary")


class RecordJournal:
    """Appends each finished record as one JSON line; a torn last line is skipped on read."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle: IO[bytes] = open(path, "ab")  # noqa: SIM115 - closed in close()

    def append(self, record: RequestRecord) -> None:
        # orjson writes the dataclass itself: the line is to_row()'s, without asdict's deep copy of
        # every chunk list (about 260 us a 64-chunk record, paid during the run for each one).
        self._handle.write(orjson.dumps(record) + b"\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> RecordJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_journal(path: Path) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    if not path.is_file():
        return records
    for line in path.read_bytes().splitlines():
        try:
            records.append(RequestRecord.from_row(orjson.loads(line)))
        except orjson.JSONDecodeError:
            continue  # a line torn by a crash mid-write
    return records


_SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("warmup", pa.bool_()),
        ("group", pa.string()),
        ("turn", pa.int64()),
        ("scheduled_ns", pa.int64()),
        ("start_ns", pa.int64()),
        ("headers_ns", pa.int64()),
        ("first_event_ns", pa.int64()),
        ("first_token_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("chunk_ns", pa.list_(pa.int64())),
        ("chunk_chars", pa.list_(pa.int64())),
        ("chunk_tokens", pa.list_(pa.int64())),
        ("chunk_phase", pa.list_(pa.int8())),
        ("prompt_tokens", pa.int64()),
        ("max_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("usage_source", pa.string()),
        ("reasoning_tokens", pa.int64()),
        ("reasoning_source", pa.string()),
        ("finish_reason", pa.string()),
        ("http_status", pa.int64()),
        ("error_kind", pa.string()),
        ("error", pa.string()),
        ("output_text", pa.string()),
        ("task", pa.int64()),
        ("node", pa.int64()),
        ("role", pa.string()),
        ("depends_on", pa.list_(pa.int64())),
        ("sent_digest", pa.string()),
    ]
)


def write_records(path: Path, records: list[RequestRecord]) -> None:
    table = pa.Table.from_pylist([r.to_row() for r in records], schema=_SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_records(path: Path) -> list[RequestRecord]:
    return [RequestRecord.from_row(row) for row in pq.read_table(path).to_pylist()]
