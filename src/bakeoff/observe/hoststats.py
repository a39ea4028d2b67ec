"""What the machine says about a server while it runs: its processes' CPU and memory, and the GPUs.

Two probes, each read about once a second by :mod:`bakeoff.observe.telemetry_series`:

- :class:`ProcessProbe` follows a local engine's process and every descendant (vLLM
  starts an engine-core process and workers; the parent alone shows a fraction of the
  work): ``cpu_cores`` is CPU seconds used per wall second since the last reading (2.0 =
  two cores busy), ``rss_bytes`` the resident memory summed over the tree. Processes that
  come and go between readings are counted while they live.
- :class:`bakeoff.host.gpus.NvmlProbe` reads every NVIDIA GPU through NVML (the GPU
  queries live in :mod:`bakeoff.host.gpus`): utilisation in percent (mean over GPUs),
  memory used and power drawn (summed). Without the package or a driver it is simply not
  there (:func:`~bakeoff.host.gpus.nvml_probe` returns None with the reason), and the
  series has no GPU columns.

Neither probe raises once made: a reading that fails is a missing value, never a failed run.

:class:`HostWindow` reads the whole host over a run's measured window: how many cores were
busy (psutil's CPU times), the load average, and so how much CPU *other* processes took from
the engine and the client (:func:`host_load`): a run measured on a busy host is flagged.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

import psutil

from bakeoff.results.summary import HostLoad

Reading = dict[str, float | None]


class ProcessProbe:
    """CPU and resident memory of a process and its descendants."""

    columns = ("cpu_cores", "rss_bytes")

    def __init__(self, pid: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.pid = pid
        self._clock = clock
        self._cpu: dict[int, float] = {}  # pid -> CPU seconds at the last reading
        self._last: float | None = None
        self.read()  # the first reading only sets the baseline CPU times

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def read(self) -> Reading:
        now = self._clock()
        cpu: dict[int, float] = {}
        rss = 0.0
        used = 0.0
        tree = self._tree()
        for proc in tree:
            try:
                times = proc.cpu_times()
                mem = proc.memory_info()
            except psutil.Error:
                continue  # exited between listing and reading
            total = times.user + times.system
            cpu[proc.pid] = total
            # A process new since the last reading counts from zero: its whole CPU time is recent.
            used += total - self._cpu.get(proc.pid, 0.0 if self._last is not None else total)
            rss += mem.rss
        elapsed = None if self._last is None else now - self._last
        self._cpu, self._last = cpu, now
        if not tree:
            return {"cpu_cores": None, "rss_bytes": None}
        cores = used / elapsed if elapsed else None
        return {"cpu_cores": max(cores, 0.0) if cores is not None else None, "rss_bytes": rss}


# Other processes using at least this many cores (or this share of the host, if more) make a busy host.
BUSY_CORES = 0.5
BUSY_SHARE = 0.15


def host_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the platform has one)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class HostWindow:
    """The host's CPU over a window: :meth:`start`, then :meth:`stop` gives cores busy and the load average."""

    def __init__(self) -> None:
        self._start: tuple[float, float] | None = None  # (busy CPU seconds, wall clock)

    @staticmethod
    def _busy() -> float:
        times = psutil.cpu_times()
        return float(sum(times)) - float(times.idle) - float(getattr(times, "iowait", 0.0))

    def start(self) -> None:
        with contextlib.suppress(Exception):
            self._start = (self._busy(), time.monotonic())

    def stop(self) -> dict[str, float | None]:
        """``busy_cores`` over the window (None if never started), ``loadavg_1m`` now."""
        busy = None
        if self._start is not None:
            with contextlib.suppress(Exception):
                wall = time.monotonic() - self._start[1]
                busy = (self._busy() - self._start[0]) / wall if wall > 0 else None
        load = None
        with contextlib.suppress(AttributeError, OSError):
            load = os.getloadavg()[0]
        return {"busy_cores": busy, "loadavg_1m": load}


def host_load(window: dict[str, float | None], engine_cores: float | None, client_cores: float | None) -> HostLoad:
    """The host's load over a run: what other processes took, and whether the host counts as busy."""
    cpus = host_cpus()
    busy = window.get("busy_cores")
    others = None
    # A container's or a remote engine's CPU is not read: its busy cores would count as "others".
    if busy is not None and engine_cores is not None:
        others = max(0.0, busy - engine_cores - (client_cores or 0.0))
    limit = max(BUSY_CORES, BUSY_SHARE * cpus)
    flagged = others is not None and others >= limit
    note = None
    if flagged and others is not None:
        note = f"other processes used {others:.1f} of {cpus} cores while this run was measured"
    return HostLoad(
        cpus=cpus,
        loadavg_1m=window.get("loadavg_1m"),
        busy_cores=busy,
        engine_cores=engine_cores,
        client_cores=client_cores,
        other_cores=others,
        busy=flagged,
        note=note,
    )
