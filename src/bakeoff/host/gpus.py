"""What this machine's NVIDIA GPUs are, asked in one place: ``nvidia-smi`` and NVML.

- :func:`query_nvidia_smi`: what plain ``nvidia-smi`` prints, whose ``CUDA Version`` the
  pre-start check reads (:mod:`bakeoff.host.gpu_checks`); a missing or failing one is a
  LaunchError, since a GPU backend cannot start without the driver.
- :func:`gpus`: (name, driver version) per GPU from ``nvidia-smi --query-gpu``, what a run's
  origin and a Ray node's facts record; empty on a machine without one, asked once per process.
- :class:`NvmlProbe`: utilisation, memory used and power drawn of the server's GPUs through NVML
  (``nvidia-ml-py``, imported only when asked for, so its absence costs nothing), which the
  telemetry series samples; :func:`nvml_probe` returns None with the reason where NVML is
  not there, and :func:`gpu_names` are the names NVML reports (the roofline's datasheet keys).
- :func:`nvml_energy_readers`: each GPU's cumulative energy counter (joules since the driver
  loaded), which :mod:`bakeoff.observe.energy` differences over a run's measured window.

Both NVML readers take ``indices``: the GPUs the server is pinned to
(:mod:`bakeoff.serving.gpu_pinning`, NVML's own numbering, which docker's ``device=`` and the
CDI names share); None reads every GPU. A server's figures never include a GPU it does not hold.

Both tools are read through these functions only, so a stand-in ``nvidia-smi`` on ``PATH``
or a fake NVML module (``nvml_probe(module=...)``) stands in for a GPU in tests.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import shutil
import subprocess
from collections.abc import Callable
from types import ModuleType
from typing import Any

from bakeoff.errors import LaunchError


def _nvidia_smi(*args: str, timeout_s: float) -> str:
    """Run ``nvidia-smi`` with ``args``; its output, or a LaunchError saying what went wrong."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise LaunchError("nvidia-smi not found: a GPU backend needs the NVIDIA driver on this host")
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"nvidia-smi hung for {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        raise LaunchError(f"nvidia-smi failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc.stdout


def query_nvidia_smi(timeout_s: float = 30.0) -> str:
    """What ``nvidia-smi`` prints on this host; a missing or failing one is a LaunchError."""
    return _nvidia_smi(timeout_s=timeout_s)


@functools.lru_cache(maxsize=1)
def gpus() -> tuple[tuple[str, str], ...]:
    """(name, driver version) per NVIDIA GPU that ``nvidia-smi`` lists; empty without one."""
    try:
        listed = _nvidia_smi("--query-gpu=name,driver_version", "--format=csv,noheader", timeout_s=20)
    except (LaunchError, OSError):
        return ()
    found = []
    for line in listed.splitlines():
        name, _, driver = line.partition(",")
        if name.strip():
            found.append((name.strip(), driver.strip()))
    return tuple(found)


def gpu_available() -> bool:
    """An NVIDIA GPU is listed by ``nvidia-smi`` on this machine (the same query as :func:`gpus`)."""
    return bool(gpus())


def _chosen(nvml: ModuleType, indices: list[int] | None) -> list[int]:
    """The NVML indices to read: ``indices`` (each checked to exist), or every GPU."""
    count = int(nvml.nvmlDeviceGetCount())
    if indices is None:
        return list(range(count))
    missing = [i for i in indices if not 0 <= i < count]
    if missing:
        raise LookupError(f"GPU {', '.join(map(str, missing))} not among the {count} NVML sees")
    return list(indices)


class NvmlProbe:
    """Utilisation, memory and power of the server's NVIDIA GPUs (every GPU when not told which), through NVML."""

    columns = ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_power_w")

    def __init__(self, nvml: ModuleType, indices: list[int] | None = None) -> None:
        self._nvml = nvml
        self.indices = _chosen(nvml, indices)
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices]
        self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]

    def read(self) -> dict[str, float | None]:
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


def nvml_probe(module: str = "pynvml", indices: list[int] | None = None) -> tuple[NvmlProbe | None, str]:
    """An NVML probe of ``indices`` (None: every GPU), or None and why not (no nvidia-ml-py, no driver, no GPU)."""
    try:
        nvml = importlib.import_module(module)
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'bakeoff[telemetry-gpu]')"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError and its driver-missing subclasses
        return None, f"NVML did not start: {exc}"
    try:
        probe = NvmlProbe(nvml, indices)
    except LookupError as exc:
        return None, f"NVML: {exc}"
    except nvml.NVMLError as exc:
        return None, f"NVML could not list the GPUs: {exc}"
    if not probe.names:
        probe.close()
        return None, "NVML found no GPU"
    which = ", ".join(f"gpu{i} {name}" for i, name in zip(probe.indices, probe.names, strict=True))
    return probe, f"NVML: {which}"


def gpu_names() -> list[str]:
    """The NVIDIA GPUs NVML sees (empty without NVML or GPUs)."""
    probe, _ = nvml_probe()
    if probe is None:
        return []
    names = probe.names
    probe.close()
    return names


def nvml_energy_readers(
    module: str = "pynvml", indices: list[int] | None = None
) -> tuple[list[tuple[str, Callable[[], float]]], str]:
    """(label, joules so far) per NVIDIA GPU of ``indices`` (None: every GPU), or none and why
    (no nvidia-ml-py, no driver, no such GPU, no counter)."""
    try:
        nvml: ModuleType = importlib.import_module(module)
    except ImportError:
        return [], "nvidia-ml-py is not installed (pip install 'bakeoff[telemetry-gpu]')"
    try:
        nvml.nvmlInit()
        chosen = _chosen(nvml, indices)
        handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in chosen]
    except LookupError as exc:
        return [], f"NVML: {exc}"
    except Exception as exc:  # NVMLError and its driver-missing subclasses
        return [], f"NVML did not start: {exc}"
    if not handles:
        return [], "NVML found no GPU"
    readers = []
    for index, handle in handles:
        label = f"gpu{index} {_text(nvml.nvmlDeviceGetName(handle))}"
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except nvml.NVMLError as exc:
            return [], f"{label}: NVML has no energy counter for it ({exc}; it needs a Volta or later GPU)"
        readers.append((label, _energy_reader(nvml, handle)))
    return readers, f"NVML energy counters: {', '.join(label for label, _ in readers)}"


def _energy_reader(nvml: ModuleType, handle: object) -> Callable[[], float]:
    return lambda: float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0  # millijoules
