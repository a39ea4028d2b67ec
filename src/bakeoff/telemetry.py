"""Server-side counters: scrape a backend's metrics endpoint and difference two snapshots.

Prometheus text (vLLM, SGLang, llama.cpp, TensorRT-LLM's ``/prometheus/metrics``) is
parsed into ``name -> value`` with label sets summed, which is what run-level counters
need. A scrape that fails returns an empty snapshot: telemetry never fails a run.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from typing import Any

from bakeoff.backends import BackendSpec

Snapshot = dict[str, float]


def parse_prometheus(text: str) -> Snapshot:
    """Sum every sample of each metric name over its label sets."""
    values: Snapshot = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, tail = line.partition("{")
            rest = tail.rpartition("}")[2]
        else:
            name, _, rest = line.partition(" ")
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        if math.isnan(value):
            continue
        values[name] = values.get(name, 0.0) + value
    return values


def scrape(base_url: str, backend: BackendSpec, timeout_s: float = 5.0) -> Snapshot:
    spec = backend.metrics
    if spec.path is None or spec.format != "prometheus":
        return {}
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + spec.path, timeout=timeout_s) as resp:
            return parse_prometheus(resp.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, TimeoutError):
        return {}


def logical(snapshot: Snapshot, backend: BackendSpec, name: str) -> float | None:
    """A metric by bakeoff's logical name (``prefix_cache_hits``...), None when not exposed."""
    native = backend.metrics.names.get(name)
    if native is None:
        return None
    # A logical metric may be a sum of native ones ("a + b"): llama.cpp counts uncached and
    # cached prompt tokens separately, and their sum is what vLLM calls queries.
    total = 0.0
    for part in (p.strip() for p in native.split("+")):
        value = _one(snapshot, part)
        if value is None:
            return None
        total += value
    return total


def _one(snapshot: Snapshot, native: str) -> float | None:
    # Counters are exposed with or without the _total suffix depending on the client lib.
    for candidate in (native, native.removesuffix("_total"), native + "_total"):
        if candidate in snapshot:
            return snapshot[candidate]
    return None


def counter_delta(before: Snapshot, after: Snapshot, backend: BackendSpec, name: str) -> float | None:
    start, end = logical(before, backend, name), logical(after, backend, name)
    if start is None or end is None:
        return None
    return end - start


def prefix_cache_from_counters(before: Snapshot, after: Snapshot, backend: BackendSpec) -> dict[str, Any]:
    """Server-side hit rate over a run: hits / queries in tokens, or the backend's own rate."""
    hits = counter_delta(before, after, backend, "prefix_cache_hits")
    queries = counter_delta(before, after, backend, "prefix_cache_queries")
    if hits is not None and queries is not None:
        # No lookups at all (prefix caching off) means nothing was served from cache.
        rate = hits / queries if queries else 0.0
        return {"server_hit_rate": rate, "server_hits": hits, "server_queries": queries}
    own_rate = logical(after, backend, "cache_hit_rate")
    return {"server_hit_rate": own_rate, "server_hits": None, "server_queries": None}


def reset_prefix_cache(base_url: str, backend: BackendSpec, timeout_s: float = 30.0) -> bool:
    """Call the backend's cache-reset endpoint; False when it has none (restart instead)."""
    spec = backend.cache_reset
    if spec.kind != "http" or spec.path is None:
        return False
    request = urllib.request.Request(
        base_url.rstrip("/") + spec.path, method=spec.method, data=b"" if spec.method == "POST" else None
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, OSError, TimeoutError):
        return False
