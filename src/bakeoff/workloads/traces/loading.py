"""A ``kind: trace`` workload's trace: found, parsed, sorted, filtered and windowed.

Windows are in the trace's own seconds (before ``time_scale``): ``start_s`` and
``duration_s`` cut a slice, ``max_requests`` keeps its first requests, and the slice is
rebased so its first request arrives at 0 (no dead time before the first send). Loading
is cached per file content and options: a campaign checks every server's context length
against the same trace without parsing it again.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import orjson

from bakeoff.errors import SpecError
from bakeoff.paths import shipped
from bakeoff.workloads.traces.formats import (
    Parsed,
    parse_azure,
    parse_bakeoff,
    parse_burstgpt,
    parse_mooncake,
    parse_otel,
)
from bakeoff.workloads.traces.rows import LoadedTrace
from bakeoff.workloads.traces.spec import TraceSpec

_PARSE_OPTIONS = {"format", "block_size", "models", "log_types", "start_s", "duration_s"}


def resolve_trace_path(path: Path) -> Path:
    """An existing trace file: as given, else among the shipped ones (``traces/NAME``, in a
    checkout or an installed wheel alike: :func:`bakeoff.paths.shipped`)."""
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, shipped("traces").parent / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise SpecError(f"path: trace file {path} not found (tried {tried}); give an absolute path")


def _parse(path: Path, wl: TraceSpec) -> Parsed:
    if wl.format == "mooncake":
        return parse_mooncake(path, wl.tokens_per_block)
    if wl.format == "azure":
        return parse_azure(path)
    if wl.format == "otel":
        return parse_otel(path, wl.tokens_per_block)
    if wl.format == "burstgpt":
        parsed = parse_burstgpt(path, wl.models, wl.log_types)
        for option, column in (("models", "Model"), ("log_types", "Log Type")):
            wanted = set(getattr(wl, option))
            if wanted and not wanted & parsed.values[column]:
                seen = ", ".join(sorted(parsed.values[column])) or "nothing"
                raise SpecError(f"{option}: no row of {path} has {column} in {sorted(wanted)}; it holds: {seen}")
        return parsed
    return parse_bakeoff(path)


def load_trace(wl: TraceSpec) -> LoadedTrace:
    """The workload's requests, windowed and rebased; an error naming the option that emptied it."""
    path = resolve_trace_path(wl.path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    options = wl.model_dump_json(include=_PARSE_OPTIONS)
    return _window(_load(path, digest, options), wl.max_requests)


@lru_cache(maxsize=8)
def _load(path: Path, digest: str, options: str) -> LoadedTrace:
    # The file's digest and the options are the cache key: a changed file or option parses again.
    wl = TraceSpec.model_validate({**orjson.loads(options), "path": path})
    parsed = _parse(path, wl)
    rows = sorted(parsed.rows, key=lambda r: r.at_s)  # stable: equal stamps keep file order
    if not rows:
        raise SpecError(f"{path}: no replayable request (of {parsed.rows_in_file} rows; left out: {parsed.left_out})")
    first = rows[0].at_s
    start = first + wl.start_s
    end = start + wl.duration_s if wl.duration_s is not None else float("inf")
    kept = [r for r in rows if start <= r.at_s < end]
    outside = len(rows) - len(kept)
    if not kept:
        raise SpecError(
            f"start_s/duration_s: the window [{wl.start_s:g}, {end - first:g}) s holds none of the {len(rows)} "
            f"requests of {path}, which span {rows[-1].at_s - first:.1f} s"
        )
    left_out = dict(parsed.left_out)
    if outside:
        left_out["outside start_s/duration_s"] = outside
    return LoadedTrace(path, wl.format, parsed.block_size, tuple(kept), parsed.rows_in_file, left_out, digest)


def _window(trace: LoadedTrace, max_requests: int | None) -> LoadedTrace:
    rows = trace.rows
    left_out = dict(trace.left_out)
    if max_requests is not None and len(rows) > max_requests:
        left_out["beyond max_requests"] = len(rows) - max_requests
        rows = rows[:max_requests]
    origin = rows[0].at_s
    return replace(trace, rows=tuple(replace(r, at_s=r.at_s - origin) for r in rows), left_out=left_out)
