"""One parser per public trace format, and the writer of bakeoff's own.

- ``mooncake`` (Mooncake FAST'25 release, and traces of the same layout): JSONL with
  ``timestamp`` (ms since the first request), ``input_length``, ``output_length`` and
  ``hash_ids``, one id per ``block_size`` tokens of the prompt. Each row's session is its task,
  the call tree its hash ids place it in (:mod:`bakeoff.workloads.traces.hash_tree`).
- ``azure`` (Azure LLM inference traces 2023 and 2024): CSV ``TIMESTAMP`` (a date-time,
  or seconds), ``ContextTokens``, ``GeneratedTokens``.
- ``burstgpt``: CSV ``Timestamp`` (s), ``Model``, ``Request tokens``, ``Response tokens``,
  ``Total tokens``, ``Log Type``; rows can be kept by model and by log type.
- ``otel``: OpenTelemetry GenAI spans of agent runs, one OTLP export a line
  (:mod:`bakeoff.workloads.traces.otel`): one row per model call, block ids inferred from the tree.
- ``bakeoff``: JSONL, an optional header line ``{"bakeoff_trace": 1, "block_size": N}``, then
  ``arrival_s``, ``prompt_tokens``, ``output_tokens`` and optional ``session_id`` and ``block_ids``.

A malformed row is refused with its line number and field; every problem found is listed
(the first few), so a file is fixed in one pass. Rows whose output is 0 tokens (failed
requests in BurstGPT's files) cannot be replayed and are left out, counted.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import orjson

from bakeoff.errors import SpecError
from bakeoff.workloads.traces.hash_tree import task_sessions
from bakeoff.workloads.traces.otel import parse_otel_rows
from bakeoff.workloads.traces.rows import LoadedTrace, TraceRow

TraceFormat = Literal["mooncake", "azure", "burstgpt", "bakeoff", "otel"]
FORMATS: tuple[TraceFormat, ...] = ("mooncake", "azure", "burstgpt", "bakeoff", "otel")
MAX_LISTED_PROBLEMS = 5
BAKEOFF_HEADER_KEY = "bakeoff_trace"
BAKEOFF_VERSION = 1
NO_OUTPUT = "no output tokens (a failed request in the source)"


class TraceRowError(SpecError):
    """Malformed rows: each problem names the file, the line and the field."""


@dataclass
class Parsed:
    """What a parser read: the rows, their block size, and what it left out and why."""

    rows: list[TraceRow]
    rows_in_file: int
    block_size: int = 0
    left_out: dict[str, int] = field(default_factory=dict)
    values: dict[str, set[str]] = field(default_factory=dict)  # filterable column -> values seen


class _Problems:
    """Collects row problems; raises them together at the end of the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found: list[str] = []

    def add(self, line: int, name: str, message: str) -> None:
        self.found.append(f"row {line}: {name}: {message}")

    def raise_if_any(self) -> None:
        if not self.found:
            return
        shown = self.found[:MAX_LISTED_PROBLEMS]
        more = len(self.found) - len(shown)
        tail = f"\n  (and {more} more)" if more else ""
        raise TraceRowError(f"{self.path}: malformed trace rows:\n  " + "\n  ".join(shown) + tail)


def _number(value: Any, line: int, name: str, problems: _Problems, *, whole: bool, minimum: float) -> float | None:
    """``value`` as a finite number >= ``minimum``, or None after noting why not."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            if whole:
                try:
                    as_float = float(text)
                except ValueError:
                    as_float = math.nan
                value = int(as_float) if as_float.is_integer() else value
        if isinstance(value, str):
            problems.add(line, name, f"{text!r} is not a {'whole ' if whole else ''}number")
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problems.add(line, name, f"expected a {'whole ' if whole else ''}number, got {value!r}")
        return None
    if not math.isfinite(value) or (whole and not float(value).is_integer()):
        problems.add(line, name, f"expected a {'whole ' if whole else ''}number, got {value!r}")
        return None
    if value < minimum:
        problems.add(line, name, f"must be {minimum:g} or more, got {value!r}")
        return None
    return float(value)


def _row(line: int, at: float | None, prompt: float | None, output: float | None, parsed: Parsed, **extra: Any) -> None:
    if at is None or prompt is None or output is None:
        return
    if output == 0:
        parsed.left_out[NO_OUTPUT] = parsed.left_out.get(NO_OUTPUT, 0) + 1
        return
    parsed.rows.append(TraceRow(line, at, int(prompt), int(output), **extra))


def _json_lines(path: Path, problems: _Problems) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open("rb") as handle:
        for line, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                problems.add(line, "(line)", f"not valid JSON ({exc})")
                continue
            if not isinstance(obj, dict):
                problems.add(line, "(line)", "expected a JSON object")
                continue
            yield line, obj


def _block_ids(value: Any, line: int, name: str, problems: _Problems) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        problems.add(line, name, f"expected a list of whole numbers, got {str(value)[:60]}")
        return None
    return tuple(value)


def _required(obj: dict[str, Any], names: tuple[str, ...], line: int, problems: _Problems) -> bool:
    missing = [n for n in names if n not in obj]
    for name in missing:
        problems.add(line, name, "missing")
    return not missing


def parse_mooncake(path: Path, block_size: int) -> Parsed:
    problems = _Problems(path)
    parsed = Parsed([], 0, block_size=block_size)
    for line, obj in _json_lines(path, problems):
        parsed.rows_in_file += 1
        if not _required(obj, ("timestamp", "input_length", "output_length"), line, problems):
            continue
        ms = _number(obj["timestamp"], line, "timestamp", problems, whole=False, minimum=0)
        prompt = _number(obj["input_length"], line, "input_length", problems, whole=True, minimum=1)
        output = _number(obj["output_length"], line, "output_length", problems, whole=True, minimum=0)
        blocks = _block_ids(obj.get("hash_ids", []), line, "hash_ids", problems)
        if blocks is None:
            continue
        _row(line, None if ms is None else ms / 1000.0, prompt, output, parsed, blocks=blocks)
    problems.raise_if_any()
    # No session column: each row's task is read from its hash ids (the call tree it belongs to).
    ordered = sorted(parsed.rows, key=lambda r: r.at_s)
    sessions = task_sessions(ordered, block_size)
    parsed.rows = [replace(r, session=name) for r, name in zip(ordered, sessions, strict=True)]
    return parsed


def parse_bakeoff(path: Path) -> Parsed:
    problems = _Problems(path)
    parsed = Parsed([], 0)
    for line, obj in _json_lines(path, problems):
        if BAKEOFF_HEADER_KEY in obj:
            if line != 1 or parsed.rows_in_file:
                problems.add(line, BAKEOFF_HEADER_KEY, "the header belongs on the first line")
            elif obj[BAKEOFF_HEADER_KEY] != BAKEOFF_VERSION:
                problems.add(line, BAKEOFF_HEADER_KEY, f"version {obj[BAKEOFF_HEADER_KEY]!r} unknown; expected 1")
            else:
                size = _number(obj.get("block_size", 0), line, "block_size", problems, whole=True, minimum=0)
                parsed.block_size = int(size or 0)
            continue
        parsed.rows_in_file += 1
        if not _required(obj, ("arrival_s", "prompt_tokens", "output_tokens"), line, problems):
            continue
        at = _number(obj["arrival_s"], line, "arrival_s", problems, whole=False, minimum=0)
        prompt = _number(obj["prompt_tokens"], line, "prompt_tokens", problems, whole=True, minimum=1)
        output = _number(obj["output_tokens"], line, "output_tokens", problems, whole=True, minimum=0)
        blocks = _block_ids(obj.get("block_ids", []), line, "block_ids", problems)
        if blocks and not parsed.block_size:
            problems.add(line, "block_ids", 'need a header line {"bakeoff_trace": 1, "block_size": N} first')
            continue
        session = obj.get("session_id", "")
        if blocks is not None:
            _row(line, at, prompt, output, parsed, blocks=blocks, session="" if session is None else str(session))
    problems.raise_if_any()
    return parsed


def parse_otel(path: Path, block_size: int) -> Parsed:
    rows, spans = parse_otel_rows(path, block_size)
    return Parsed(rows, spans, block_size=block_size)


def _csv_rows(path: Path, columns: tuple[str, ...], problems: _Problems) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceRowError(
                f"{path}: row 1: the header lacks {', '.join(missing)} (found: {', '.join(header) or 'nothing'}); "
                "is --format right?"
            )
        reader.fieldnames = header
        for row in reader:
            line = reader.line_num
            if any(row.get(c) in (None, "") for c in columns):
                for name in columns:
                    if row.get(name) in (None, ""):
                        problems.add(line, name, "empty")
                continue
            yield line, row


def _azure_time(text: str, line: int, problems: _Problems) -> dt.datetime | float | None:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text.strip())
    except ValueError:
        problems.add(line, "TIMESTAMP", f"{text!r} is neither a date-time (2023-11-16 18:15:46.68) nor seconds")
        return None


def parse_azure(path: Path) -> Parsed:
    problems = _Problems(path)
    parsed = Parsed([], 0)
    first: dt.datetime | float | None = None
    for line, row in _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), problems):
        parsed.rows_in_file += 1
        stamp = _azure_time(row["TIMESTAMP"], line, problems)
        at: float | None = None
        if stamp is not None:
            first = stamp if first is None else first
            try:
                delta = stamp - first  # type: ignore[operator]
                at = delta.total_seconds() if isinstance(delta, dt.timedelta) else float(delta)
            except TypeError:
                problems.add(line, "TIMESTAMP", "mixes seconds, or zoned and unzoned times, with the first row's")
        prompt = _number(row["ContextTokens"], line, "ContextTokens", problems, whole=True, minimum=1)
        output = _number(row["GeneratedTokens"], line, "GeneratedTokens", problems, whole=True, minimum=0)
        _row(line, at, prompt, output, parsed)
    problems.raise_if_any()
    # Offsets from the first row; a file out of order gets negatives, fixed when rows are sorted.
    return parsed


BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


def parse_burstgpt(path: Path, models: list[str], log_types: list[str]) -> Parsed:
    problems = _Problems(path)
    parsed = Parsed([], 0, values={"Model": set(), "Log Type": set()})
    for line, row in _csv_rows(path, BURSTGPT_COLUMNS, problems):
        parsed.rows_in_file += 1
        at = _number(row["Timestamp"], line, "Timestamp", problems, whole=False, minimum=0)
        prompt = _number(row["Request tokens"], line, "Request tokens", problems, whole=True, minimum=1)
        output = _number(row["Response tokens"], line, "Response tokens", problems, whole=True, minimum=0)
        _number(row["Total tokens"], line, "Total tokens", problems, whole=True, minimum=0)
        model, log_type = row["Model"].strip(), row["Log Type"].strip()
        parsed.values["Model"].add(model)
        parsed.values["Log Type"].add(log_type)
        if models and model not in models:
            parsed.left_out["Model not in models"] = parsed.left_out.get("Model not in models", 0) + 1
            continue
        if log_types and log_type not in log_types:
            parsed.left_out["Log Type not in log_types"] = parsed.left_out.get("Log Type not in log_types", 0) + 1
            continue
        _row(line, at, prompt, output, parsed, session="")
    problems.raise_if_any()
    return parsed


def detect_format(path: Path) -> TraceFormat:
    """The format a file's first line shows; an error listing the choices when it shows none."""
    with path.open("rb") as handle:
        first = handle.readline().decode("utf-8", errors="replace").strip()
    if first.startswith("{"):
        try:
            keys = set(orjson.loads(first))
        except orjson.JSONDecodeError:
            keys = set()
        if "hash_ids" in keys or "input_length" in keys:
            return "mooncake"
        if BAKEOFF_HEADER_KEY in keys or "arrival_s" in keys:
            return "bakeoff"
        if "resourceSpans" in keys:
            return "otel"
    columns = {c.strip() for c in first.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= columns:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= columns:
        return "burstgpt"
    raise SpecError(f"{path}: cannot tell the trace format from its first line; pass --format ({', '.join(FORMATS)})")


def write_bakeoff(trace: LoadedTrace, time_scale: float = 1.0) -> bytes:
    """``trace`` in bakeoff's JSONL: header line, then one request per line (arrivals scaled)."""
    header = {BAKEOFF_HEADER_KEY: BAKEOFF_VERSION, "block_size": trace.block_size, "source": trace.source.name}
    lines = [orjson.dumps({**header, "source_format": trace.format})]
    for row in trace.rows:
        item: dict[str, Any] = {
            "arrival_s": round(row.at_s * time_scale, 6),
            "prompt_tokens": row.prompt_tokens,
            "output_tokens": row.output_tokens,
        }
        if row.session:
            item["session_id"] = row.session
        if row.blocks:
            item["block_ids"] = list(row.blocks)
        lines.append(orjson.dumps(item))
    return b"\n".join(lines) + b"\n"
