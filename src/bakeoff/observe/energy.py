"""Energy over a run's measured window, from cumulative energy counters, per device.

Integrating sampled power (about one reading a second) misses whatever happens between
readings; the hardware keeps its own running total, so bakeoff reads that instead and takes
differences:

- NVIDIA GPUs: ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules since the driver
  loaded, Volta and later), one counter per GPU, asked through :mod:`bakeoff.host.gpus`
  (the NVML module seam the telemetry uses too). Only the GPUs the server is pinned to are
  read (:mod:`bakeoff.serving.gpu_pinning`): on an 8-GPU host the seven a server does not
  hold would otherwise add their idle draw to its J/token; ``energy.devices`` shows each apart;
- CPU hosts: Intel RAPL under ``/sys/class/powercap``: each package zone's ``energy_uj``
  (``intel-rapl:N``; its sub-zones ``intel-rapl:N:M`` are parts of it and are left out, or
  they would be counted twice). The counter wraps at ``max_energy_range_uj``: a reading
  below the last one adds that range. Since 2020 kernels make ``energy_uj`` root-only;
  unreadable is "not measured", with that reason.

An :class:`EnergyMeter` is a telemetry probe (:mod:`bakeoff.observe.telemetry_series` reads
it about once a second over the measured phase, so it also gives a ``energy_j`` column);
each reading is stamped with ``perf_counter_ns``, the clock of the request records, so
:meth:`EnergyMeter.window` can interpolate each counter to the exact ends of the measured
window (:func:`bakeoff.measure.metrics.window_bounds`). Where no counter can be read,
:func:`energy_meter` says why, and the summary's energy block carries that reason instead
of a figure: never a guess.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bakeoff.host.gpus import nvml_energy_readers
from bakeoff.results.summary import DeviceEnergy, Energy

POWERCAP = Path("/sys/class/powercap")
_PACKAGE_ZONE = re.compile(r"intel-rapl:\d+$")
Reading = dict[str, float | None]
Source = Literal["nvml", "rapl"]


@dataclass
class Counter:
    """One device's cumulative energy counter: ``read`` gives joules, ``wrap_j`` where it wraps (None: never)."""

    device: str
    read: Callable[[], float]
    wrap_j: float | None = None


def nvml_counters(module: str = "pynvml", indices: list[int] | None = None) -> tuple[list[Counter], str]:
    """One counter per NVIDIA GPU of ``indices`` (None: all), or none and why (no nvidia-ml-py, no driver,
    no such GPU, no energy counter)."""
    readers, why = nvml_energy_readers(module, indices)
    return [Counter(label, read) for label, read in readers], why


def rapl_counters(root: Path = POWERCAP) -> tuple[list[Counter], str]:
    """One counter per RAPL package zone under ``root``, or none and why."""
    zones = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE_ZONE.match(p.name)) if root.is_dir() else []
    if not zones:
        return [], f"no RAPL package zone under {root} (not an Intel/AMD host with powercap, or a VM)"
    counters = []
    for zone in zones:
        label = f"cpu {_read_text(zone / 'name') or zone.name}"
        try:
            int((zone / "energy_uj").read_text())
            wrap = int((zone / "max_energy_range_uj").read_text()) / 1e6
        except PermissionError:
            return [], f"{zone}/energy_uj is not readable by this user (root-only on kernels since 2020)"
        except (OSError, ValueError) as exc:
            return [], f"{zone}: cannot read its energy counter ({exc})"
        counters.append(Counter(label, _rapl_reader(zone / "energy_uj"), wrap))
    return counters, f"RAPL energy counters: {', '.join(c.device for c in counters)}"


def _rapl_reader(path: Path) -> Callable[[], float]:
    return lambda: int(path.read_text()) / 1e6  # microjoules


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class EnergyMeter:
    """Stamped readings of every counter; the energy between any two instants inside them."""

    columns = ("energy_j",)

    def __init__(self, source: Source, counters: list[Counter], clock: Callable[[], int] = time.perf_counter_ns):
        self.source = source
        self.counters = counters
        self._clock = clock
        self.times_ns: list[int] = []
        self.joules: list[list[float]] = [[] for _ in counters]  # per device, unwrapped, since the first reading
        self._raw: list[float | None] = [None] * len(counters)

    def read(self) -> Reading:
        now = self._clock()
        values = [c.read() for c in self.counters]  # any failure: the whole reading is missing
        self.times_ns.append(now)
        for i, (counter, raw) in enumerate(zip(self.counters, values, strict=True)):
            last = self._raw[i]
            if last is None:
                self.joules[i].append(0.0)
            else:
                step = raw - last
                if step < 0 and counter.wrap_j is not None:
                    step += counter.wrap_j  # the counter wrapped past its range since the last reading
                self.joules[i].append(self.joules[i][-1] + max(step, 0.0))
            self._raw[i] = raw
        return {"energy_j": sum(series[-1] for series in self.joules)}

    def window(self, start_ns: int, end_ns: int, output_tokens: float) -> Energy:
        """Energy between ``start_ns`` and ``end_ns`` (clamped to the readings), per device and in all."""
        if len(self.times_ns) < 2:
            return Energy(source=self.source, reason="fewer than two energy readings were taken", readings=0)
        times = np.array(self.times_ns, dtype=np.float64)
        lo, hi = max(float(start_ns), times[0]), min(float(end_ns), times[-1])
        if hi <= lo:
            return Energy(source=self.source, reason="the measured window lies outside the energy readings")
        seconds = (hi - lo) / 1e9
        devices = []
        for counter, series in zip(self.counters, self.joules, strict=True):
            joules = float(np.interp(hi, times, series) - np.interp(lo, times, series))
            devices.append(DeviceEnergy(device=counter.device, joules=joules, average_w=joules / seconds))
        total = sum(d.joules for d in devices)
        per_token = total / output_tokens if output_tokens > 0 else None
        return Energy(
            source=self.source,
            devices=devices,
            joules=total,
            window_s=seconds,
            start_s=(lo - times[0]) / 1e9,
            end_s=(hi - times[0]) / 1e9,
            readings=len(self.times_ns),
            output_tokens=output_tokens,
            j_per_output_token=per_token,
            output_tokens_per_j=output_tokens / total if total > 0 else None,
            average_w=total / seconds,
        )


def energy_meter(
    accelerator: str, *, nvml_module: str = "pynvml", powercap: Path | None = None, gpus: list[int] | None = None
) -> tuple[EnergyMeter | None, str]:
    """The meter for a server on ``accelerator`` ("gpu": NVML on its ``gpus``; else RAPL), or None and why."""
    if accelerator == "gpu":
        counters, why = nvml_counters(nvml_module, gpus)
        return (EnergyMeter("nvml", counters), why) if counters else (None, f"GPU energy not measured: {why}")
    counters, why = rapl_counters(powercap or POWERCAP)
    return (EnergyMeter("rapl", counters), why) if counters else (None, f"CPU energy not measured: {why}")
