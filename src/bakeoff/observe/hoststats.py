"""What the machine says about a server while it runs: its processes' CPU and memory, and the GPUs.

Two probes, each read about once a second by :mod:`bakeoff.observe.telemetry_series`:

- :class:`ProcessProbe` follows a local engine's process and every descendant (vLLM
  starts an engine-core process and workers; the parent alone shows a fraction of the
  work): ``cpu_cores`` is CPU seconds used per wall second since the last reading (2.0 =
  two cores busy), ``rss_bytes`` the resident memory summed over the tree. Processes that
  come and go between readings are counted while they live.
- :class:`NvmlProbe` reads every NVIDIA GPU through NVML (``nvidia-ml-py``, imported
  only when asked for): utilisation in percent (mean over GPUs), memory used and power
  drawn (summed). Without the package or a driver it is simply not there
  (:func:`nvml_probe` returns None with the reason), and the series has no GPU columns.

Neither probe raises once made: a reading that fails is a missing value, never a failed run.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil

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


class NvmlProbe:
    """Utilisation, memory and power of every NVIDIA GPU on the machine, through NVML."""

    columns = ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_power_w")

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]

    def read(self) -> Reading:
        nvml = self._nvml
        util: list[float] = []
        mem = 0.0
        power: list[float] = []
        for handle in self._handles:
            try:
                util.append(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                mem += float(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except nvml.NVMLError:
                continue
            try:
                power.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # milliwatts
            except nvml.NVMLError:
                continue  # some boards do not report power
        return {
            "gpu_util_pct": sum(util) / len(util) if util else None,
            "gpu_mem_used_bytes": mem if util else None,
            "gpu_power_w": sum(power) if power else None,
        }

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_probe(module: str = "pynvml") -> tuple[NvmlProbe | None, str]:
    """An NVML probe, or None and why not (no nvidia-ml-py, no driver, no GPU)."""
    try:
        nvml = importlib.import_module(module)
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'bakeoff[telemetry-gpu]')"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError and its driver-missing subclasses
        return None, f"NVML did not start: {exc}"
    try:
        probe = NvmlProbe(nvml)
    except nvml.NVMLError as exc:
        return None, f"NVML could not list the GPUs: {exc}"
    if not probe.names:
        probe.close()
        return None, "NVML found no GPU"
    return probe, f"NVML: {', '.join(probe.names)}"


def gpu_names() -> list[str]:
    """The NVIDIA GPUs NVML sees (empty without NVML or GPUs)."""
    probe, _ = nvml_probe()
    if probe is None:
        return []
    names = probe.names
    probe.close()
    return names
