"""Telemetry over time: what the server and the machine said, about once a second, during a run.

A :class:`Sampler` runs in its own thread beside the load, from the start of the measured
window (after warm-up) to its end, and reads each probe in turn:

- the server's Prometheus metrics, by the logical names of ``backends/*.yaml``
  ``metrics.names`` (:data:`SERVER_METRICS`): gauges (``running``, ``waiting``,
  ``kv_cache_usage``) as read, counters (``preemptions``, ``prefix_cache_hits``,
  ``generation_tokens``...) as cumulative values, turned into per-second rates when read
  back (:func:`with_rates`). Only the lines of those metrics are parsed
  (:func:`bakeoff.observe.telemetry.parse_prometheus` with ``only``), so a sample costs a
  fraction of a millisecond of the interpreter lock the load generator also needs;
- the engine's processes (CPU cores used, resident memory) for local engines, and the
  GPUs through NVML where there are any (:mod:`bakeoff.host.gpus`);
- the energy counters (:mod:`bakeoff.observe.energy`, added by the runner where readable):
  ``energy_j`` since the first sample, and the stamped readings the run's energy comes from.

Each row is one sample: ``t_s`` (seconds since the window opened, monotonic clock),
``sample_ms`` and ``sample_cpu_ms`` (how long the sample took, and the CPU it used: the
sampler's own cost) and one column per
metric, missing where the server or machine does not say. The series is written beside
the run as ``telemetry.parquet`` (atomically) and named in ``summary.json``'s
``telemetry_series``; :func:`read_series` and :func:`with_rates` read it back for the
report's plots (:mod:`bakeoff.report.explain`) and :mod:`bakeoff.analysis.diagnosis`.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bakeoff.backends.spec import BackendSpec
from bakeoff.host.gpus import nvml_probe
from bakeoff.observe.hoststats import ProcessProbe, Reading
from bakeoff.observe.telemetry import logical, scrape
from bakeoff.results.store import atomic_write_bytes

SERIES_FILE = "telemetry.parquet"
SERIES_KEY = "server"  # its name in summary.json's telemetry_series

# Logical names read from the server each sample. Gauges are levels; counters only
# mean something as differences, so they are kept cumulative and differenced on read.
GAUGES = ("running", "waiting", "kv_cache_usage")
COUNTERS = ("preemptions", "prefix_cache_hits", "prefix_cache_queries", "generation_tokens", "prompt_tokens")
SERVER_METRICS = GAUGES + COUNTERS
DEFAULT_INTERVAL_S = 1.0
RATE_WINDOW_S = 3.0  # counter rates are read over this trailing window (:func:`trailing_rate`)

# Plot labels: what a column means once read back (counters as rates).
LABELS = {
    "running": "requests running",
    "waiting": "requests waiting",
    "kv_cache_usage": "KV-cache usage (share)",
    "preemptions_per_s": f"preemptions / s (over {RATE_WINDOW_S:g} s)",
    "generation_tokens_per_s": f"generated tokens / s (over {RATE_WINDOW_S:g} s)",
    "prefix_hit_rate": "prefix-cache hit rate (per interval)",
    "cpu_cores": "engine CPU (cores busy)",
    "rss_gib": "engine RSS (GiB)",
    "gpu_util_pct": "GPU utilisation %",
    "gpu_mem_used_gib": "GPU memory used (GiB)",
    "gpu_power_w": "GPU power (W)",
    "energy_j": "energy since the window opened (J, from the counters)",
}


class Probe(Protocol):
    def read(self) -> Reading: ...


class ServerProbe:
    """The server's metrics by logical name, from one filtered scrape."""

    def __init__(self, base_url: str, backend: BackendSpec, headers: Mapping[str, str] | None = None) -> None:
        self.base_url, self.backend, self.headers = base_url, backend, headers
        self.names = [n for n in SERVER_METRICS if n in backend.metrics.names]

    def read(self) -> Reading:
        snapshot = scrape(self.base_url, self.backend, timeout_s=2.0, headers=self.headers, only=self.names)
        return {name: logical(snapshot, self.backend, name) for name in self.names}


def probes_for(
    base_url: str,
    backend: BackendSpec | None,
    *,
    pid: int | None = None,
    headers: Mapping[str, str] | None = None,
    gpu: bool = True,
    gpus: list[int] | None = None,
) -> tuple[list[Probe], list[str]]:
    """The probes that apply to this server, and a note for each one left out.

    ``gpus``: the NVML indices the server is pinned to; None: every GPU NVML sees.
    """
    probes: list[Probe] = []
    notes: list[str] = []
    if backend is not None and backend.metrics.format == "prometheus" and backend.metrics.path:
        probes.append(ServerProbe(base_url, backend, headers))
    else:
        notes.append("server metrics: the backend exposes no Prometheus metrics")
    if pid is not None:
        probes.append(ProcessProbe(pid))
    else:
        notes.append("process CPU and memory: not a local process")
    if gpu:
        nvml, why = nvml_probe(indices=gpus)
        if nvml is not None:
            probes.append(nvml)
        else:
            notes.append(f"GPU: {why}")
    return probes, notes


class Sampler:
    """Reads every probe about every ``interval_s`` in a daemon thread until stopped."""

    def __init__(
        self,
        probes: Sequence[Probe],
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probes = list(probes)
        self.interval_s = interval_s
        self.rows: list[dict[str, float | None]] = []
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def start(self) -> None:
        if self._thread is not None or not self.probes:
            return
        self._t0 = self._clock()
        # The first sample before start() returns: the window's opening readings (energy
        # counters among them) come before the first measured request is sent.
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="bakeoff-telemetry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # Deadlines on a fixed grid: a slow scrape does not push every later sample back.
        deadline = self._t0 + self.interval_s
        while not self._stop.wait(max(deadline - self._clock(), 0.0)):
            self.sample()
            deadline += self.interval_s

    def sample(self) -> None:
        began, cpu = self._clock(), time.thread_time()
        row: dict[str, float | None] = {"t_s": began - self._t0}
        for probe in self.probes:
            try:
                row.update(probe.read())
            except Exception:  # a probe must never end the run; the value is just missing
                continue
        row["sample_ms"] = (self._clock() - began) * 1000.0
        # CPU this thread spent: what the sample took from the load generator's interpreter.
        row["sample_cpu_ms"] = (time.thread_time() - cpu) * 1000.0
        self.rows.append(row)

    def stop(self) -> list[dict[str, float | None]]:
        """End sampling with one last sample (the window's end) and return every row."""
        if self._thread is None:
            return self.rows
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()
        for probe in self.probes:
            close = getattr(probe, "close", None)
            if close is not None:
                close()
        return self.rows


def write_series(path: Path, rows: Sequence[Mapping[str, float | None]]) -> None:
    """Rows -> parquet, atomically; every column float (missing = null)."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    table = pa.table({c: pa.array([row.get(c) for row in rows], type=pa.float64()) for c in columns})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def read_series(path: Path) -> Any:
    """A run's series as a pandas frame, sorted by time."""
    frame = pq.read_table(path).to_pandas()
    return frame.sort_values("t_s").reset_index(drop=True)


def trailing_rate(t_s: Any, counter: Any, window_s: float = RATE_WINDOW_S) -> Any:
    """A counter's per-second rate at each sample over the trailing ``window_s`` (from the latest
    sample at least that far back, else the first): NaN at the first sample.

    Over one scrape interval the rate swings with where the scrape lands: an engine that bumps
    its token counter once per batch of steps, scraped 0.2 s after the bump, reads several times
    its real rate (a 1,500 tok/s spike in a run averaging 260). Over several intervals the
    bumps average out, and the area under the curve is unchanged.
    """
    t = np.asarray(t_s, dtype=float)
    c = np.asarray(counter, dtype=float)
    start = np.searchsorted(t, t - window_s, side="right") - 1
    start = np.clip(start, 0, None)
    dt = t - t[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(dt > 0, (c - c[start]) / np.where(dt > 0, dt, 1.0), np.nan)
    return np.clip(rate, 0, None)


def with_rates(frame: Any) -> Any:
    """Counters turned into what a reader wants to see over time; memory in GiB.

    ``preemptions_per_s`` and ``generation_tokens_per_s`` are counter rates over the trailing
    ``RATE_WINDOW_S`` (:func:`trailing_rate`: one scrape interval's difference is a
    scrape-timing effect, not the server's rate); ``prefix_hit_rate`` is hits / queries
    within each interval.
    """
    out = frame.copy()
    for counter in ("preemptions", "generation_tokens"):
        if counter in out:
            out[f"{counter}_per_s"] = trailing_rate(out["t_s"], out[counter])
    if "prefix_cache_hits" in out and "prefix_cache_queries" in out:
        queries = out["prefix_cache_queries"].diff()
        out["prefix_hit_rate"] = (out["prefix_cache_hits"].diff() / queries).where(queries > 0)
    for column, gib in (("rss_bytes", "rss_gib"), ("gpu_mem_used_bytes", "gpu_mem_used_gib")):
        if column in out:
            out[gib] = out[column] / 2**30
    return out
