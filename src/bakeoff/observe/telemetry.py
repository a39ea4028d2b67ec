"""Server-side counters and cache control: scrape, difference, wait for idle, empty the prefix cache.

Prometheus text (vLLM, SGLang, llama.cpp, TensorRT-LLM's ``/prometheus/metrics``) is
parsed with ``prometheus_client``'s parser, so metric types and labels are known, into
``sample name -> value``: a counter (and a histogram's or summary's ``_count`` / ``_sum``)
is summed over its label sets, which is what run-level counters need (vLLM labels each
data-parallel engine); a gauge that is a share (KV-cache usage, a hit rate) is averaged,
since two engines at 80 % are not at 160 %; other gauges (requests running, waiting)
count things and are summed. Lines the parser refuses are dropped one by one, never the
whole scrape. A scrape that fails returns an empty snapshot: telemetry never fails a run.
The time series sampled during a run is :mod:`bakeoff.observe.telemetry_series`.

Run-level rates come from counters differenced over the measured window, never from a
gauge: SGLang's ``sglang:cache_hit_rate`` and TensorRT-LLM's ``trtllm_kv_cache_hit_rate``
describe the last batch only, so one reading says nothing about a run. The prefix-cache
hit rate is hits / queries, in tokens (``prefix_cache_hits`` / ``prefix_cache_queries``)
or, for TensorRT-LLM, in KV blocks (reused / (reused + missed)).

Emptying the cache is checked, not assumed: vLLM's ``/reset_prefix_cache`` can answer
HTTP 200 with ``{"success": false}`` while blocks are still held, and SGLang's
``/flush_cache`` is refused (HTTP 400) while requests run. A refused reset is retried
once after the server reports nothing running, and the outcome is returned so the run
can say whether it started from a cold cache.

Every HTTP helper takes ``headers`` (an API key's ``Authorization``, for instance); they
are sent and never logged or returned.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from bakeoff.backends.spec import BackendSpec
from bakeoff.measure import control

Snapshot = dict[str, float]

# (hits, queries, unit) by logical name, first match wins. Queries may be a sum (a + b).
_PREFIX_COUNTERS = (
    ("prefix_cache_hits", ("prefix_cache_queries",), "tokens"),
    ("kv_cache_reused_blocks", ("kv_cache_reused_blocks", "kv_cache_missed_blocks"), "blocks"),
)
# HTTP statuses that no amount of waiting changes: the endpoint is missing or forbidden.
_PERMANENT = {401, 403, 404, 405}


# A gauge whose name says it is a share of something: averaged over label sets, not summed.
_SHARE_GAUGE = re.compile(r"(perc|usage|utili[sz]ation|rate|ratio|fraction|per_)", re.IGNORECASE)


def _families(text: str) -> list[Metric]:
    """The metric families in ``text``; lines the parser refuses are left out, not the scrape."""
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:
        pass
    kept = []
    for line in text.splitlines():
        try:
            list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            continue
        kept.append(line)
    try:
        return list(text_string_to_metric_families("\n".join(kept) + "\n"))
    except ValueError:  # lines valid alone that contradict each other (a TYPE after samples)
        return []


def _wanted(text: str, names: Iterable[str]) -> str:
    """Only the lines of the named metrics: a vLLM scrape is mostly histogram buckets.

    Parsing a whole scrape every second would hold the GIL long enough to delay the
    load generator's reads; filtering first keeps a sample to a few dozen lines.
    """
    stems = tuple({n.removesuffix("_total") for n in names})
    out = []
    for line in text.splitlines():
        bare = line[7:] if line.startswith(("# TYPE ", "# HELP ")) else line
        if bare.startswith(stems):
            out.append(line)
    return "\n".join(out) + "\n"


def parse_prometheus(text: str, only: Iterable[str] | None = None) -> Snapshot:
    """Sample name -> value: counters summed over label sets, share gauges averaged.

    ``only``: native metric names to keep (a cheaper parse when a few are wanted).
    """
    if only is not None:
        text = _wanted(text, only)
    totals: Snapshot = {}
    counts: dict[str, int] = {}
    shares: set[str] = set()
    for family in _families(text):
        share = family.type == "gauge" and bool(_SHARE_GAUGE.search(family.name))
        for sample in family.samples:
            if math.isnan(sample.value):
                continue
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
            counts[sample.name] = counts.get(sample.name, 0) + 1
            if share:
                shares.add(sample.name)
    for name in shares:
        totals[name] /= counts[name]
    return totals


def scrape(
    base_url: str,
    backend: BackendSpec,
    timeout_s: float = 5.0,
    *,
    headers: Mapping[str, str] | None = None,
    only: Iterable[str] | None = None,
) -> Snapshot:
    """The backend's metrics now; ``only`` limits the parse to those logical names."""
    spec = backend.metrics
    if spec.path is None or spec.format != "prometheus":
        return {}
    answer = control.call(base_url.rstrip("/") + spec.path, headers=headers, timeout_s=timeout_s)
    if answer.status != 200:
        return {}
    natives = None if only is None else native_names(backend, only)
    return parse_prometheus(answer.text, natives)


def native_names(backend: BackendSpec, logical_names: Iterable[str]) -> list[str]:
    """The backend's metric names behind logical ones (each part of an "a + b" sum)."""
    names = backend.metrics.names
    return [p.strip() for n in logical_names if n in names for p in names[n].split("+")]


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


def counter_delta(
    before: Snapshot, after: Snapshot, backend: BackendSpec, name: str, *, lazy: bool = False
) -> float | None:
    """``name``'s growth over the window; None when either scrape lacks it.

    ``lazy``: a counter the framework creates on its first increment (SGLang's and TensorRT-LLM's
    speculative counters, SGLang's ``cached_tokens_total`` before the first cache hit; a backend
    lists its own in ``metrics.lazy``): missing from a scrape that answered, it stood at 0.
    """
    lazy = lazy or name in backend.metrics.lazy
    start, end = logical(before, backend, name), logical(after, backend, name)
    if start is None and lazy and before:
        start = 0.0
    if end is None and lazy and after:
        end = 0.0  # not created yet at the end either: no hit in the whole window
    if start is None or end is None:
        return None
    return end - start


def has_prefix_cache_counters(backend: BackendSpec) -> bool:
    """The backend maps counters from which a run-level hit rate can be computed."""
    names = backend.metrics.names
    return any(hits in names and all(q in names for q in queries) for hits, queries, _ in _PREFIX_COUNTERS)


def prefix_cache_from_counters(before: Snapshot, after: Snapshot, backend: BackendSpec) -> dict[str, Any]:
    """Server-side hit rate over the measured window: hits / queries, both differenced.

    None when the backend exposes no such counters (or a scrape failed): a gauge is not a
    stand-in for a run.
    """
    names = backend.metrics.names
    for hits_name, query_names, unit in _PREFIX_COUNTERS:
        if hits_name not in names or not all(q in names for q in query_names):
            continue
        hits = counter_delta(before, after, backend, hits_name)
        parts = [counter_delta(before, after, backend, q) for q in query_names]
        if hits is None or any(p is None for p in parts):
            break
        queries = sum(p for p in parts if p is not None)
        # No lookups at all (prefix caching off) means nothing was served from cache.
        rate = hits / queries if queries else 0.0
        return {"server_hit_rate": rate, "server_hits": hits, "server_queries": queries, "server_hit_unit": unit}
    return {"server_hit_rate": None, "server_hits": None, "server_queries": None, "server_hit_unit": None}


def speculative_from_counters(
    before: Snapshot, after: Snapshot, backend: BackendSpec, draft_len: int | None = None
) -> dict[str, float | None] | None:
    """Draft tokens proposed and accepted over the window, with the acceptance rate and the
    accepted tokens per verification step; None when nothing was proposed (speculation off,
    counters not exposed, or a failed scrape).

    A backend that counts verification steps only (SGLang) gets the rest from its token
    counters: every completion token is the prefill's, a step's own or an accepted draft, so
    accepted = generated - requests - steps, and each step proposed ``draft_len`` tokens (the
    server's ``num_speculative_tokens``). One that counts no steps (TensorRT-LLM) has no
    accepted-per-step figure.
    """
    names = backend.metrics.names
    drafted = counter_delta(before, after, backend, "spec_draft_tokens", lazy=True)
    accepted = counter_delta(before, after, backend, "spec_accepted_tokens", lazy=True)
    drafts = counter_delta(before, after, backend, "spec_drafts", lazy=True)
    if drafts and "spec_accepted_tokens" not in names:
        generated = counter_delta(before, after, backend, "generation_tokens")
        requests = counter_delta(before, after, backend, "requests")
        if generated is not None and requests is not None:
            accepted = max(generated - requests - drafts, 0.0)
    if drafts and draft_len and "spec_draft_tokens" not in names:
        drafted = drafts * draft_len
    if not drafted or accepted is None:
        return None
    return {
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "drafts": drafts,
        "acceptance_rate": accepted / drafted,
        "accepted_per_step": accepted / drafts if drafts else None,
    }


def in_flight(snapshot: Snapshot, backend: BackendSpec) -> float | None:
    """Requests running plus waiting, None when the backend does not say."""
    running = logical(snapshot, backend, "running")
    if running is None:
        return None
    return running + (logical(snapshot, backend, "waiting") or 0.0)


def wait_idle(
    base_url: str,
    backend: BackendSpec,
    *,
    timeout_s: float = 60.0,
    interval_s: float = 0.25,
    headers: Mapping[str, str] | None = None,
) -> bool | None:
    """Poll the metrics until nothing runs or waits; None when the backend cannot tell.

    Bounded: False after ``timeout_s`` with requests still in flight.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        count = in_flight(scrape(base_url, backend, headers=headers), backend)
        if count is None:
            return None
        if count <= 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


@dataclass(frozen=True)
class CacheReset:
    """Whether the prefix cache was emptied before a run, and how that was found out.

    ``ok``: True emptied (or a fresh server); False tried and failed, so the run may have
    started on a warm cache; None not attempted (nothing to empty, or no way to).
    """

    kind: str  # the backend's cache_reset kind: http | restart | none
    ok: bool | None
    attempts: int = 0
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def reset_prefix_cache(
    base_url: str,
    backend: BackendSpec,
    timeout_s: float = 30.0,
    *,
    idle_timeout_s: float = 60.0,
    headers: Mapping[str, str] | None = None,
) -> CacheReset:
    """Call the backend's cache-reset endpoint; a refusal is retried once the server is idle."""
    spec = backend.cache_reset
    if spec.kind != "http" or spec.path is None:
        return CacheReset(spec.kind, None, 0, "no reset endpoint: only a restart empties this cache")
    url = base_url.rstrip("/") + spec.path
    ok, answer, status = _post_reset(url, spec.method, timeout_s, headers)
    if ok:
        return CacheReset("http", True, 1, answer)
    if status in _PERMANENT:
        return CacheReset("http", False, 1, f"{answer}; not retried: the endpoint is missing or forbidden")
    idle = wait_idle(base_url, backend, timeout_s=idle_timeout_s, headers=headers)
    waited = {True: "once idle", False: f"still busy after {idle_timeout_s:g} s", None: "(idle unknown)"}[idle]
    ok, second, _ = _post_reset(url, spec.method, timeout_s, headers)
    detail = f"first refused ({answer}); retried {waited}: {second}"
    return CacheReset("http", ok, 2, detail)


def _post_reset(
    url: str, method: str, timeout_s: float, headers: Mapping[str, str] | None
) -> tuple[bool, str, int | None]:
    """One reset call: (emptied?, what the server said, HTTP status)."""
    answer = control.call(url, method=method, headers=headers, timeout_s=timeout_s, body_limit=4096)
    status, body = answer.status, answer.text
    if status is None:
        return False, f"no answer: {answer.reason}", None
    if not 200 <= status < 300:
        return False, f"HTTP {status} {body.strip()[:200]}".rstrip(), status
    if _says_failed(body):
        # vLLM: 200 with {"success": false} while running requests still hold blocks.
        return False, f"HTTP {status} {body.strip()[:200]}", status
    return True, f"HTTP {status}", status


def _says_failed(body: str) -> bool:
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("success") is False
