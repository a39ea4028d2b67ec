"""Which GPUs one server gets, and how each container runtime is told.

A GPU server is pinned to explicit GPUs, never "all": on an 8-GPU host two cells of a
campaign run side by side (on Ray), and a server given every GPU would put its tensor-parallel
ranks on GPU 0 whatever Ray handed its task, while the energy meter would add the idle
GPUs' draw to its J/token.

- :func:`gpu_count`: how many GPUs a server needs, its ``tensor_parallel_size`` (the knob, or
  the backend's default); what Ray is asked for and what the assignment must hold.
- :func:`assign_gpus`: the GPUs of one cell. Ray sets ``CUDA_VISIBLE_DEVICES`` in each task it
  gives GPUs to (one GPU to one task at a time), and an operator may set it for a local run;
  without it a serial run takes the first ``count`` GPUs (one server at a time, so none is
  shared). Fewer visible than ``tensor_parallel_size`` is an error naming both, before any start.
- :meth:`GpuAssignment.runtime_args`: docker's ``--gpus '"device=0,1"'`` (the NVIDIA container
  toolkit; docker's ``--gpus`` value is CSV, so a list of devices is quoted inside it: Docker's
  ``docker run --gpus`` reference) and podman's ``--device nvidia.com/gpu=N`` per GPU (the CDI
  names ``nvidia-ctk cdi generate`` writes, by index and by UUID).

Indices are the driver's (nvidia-smi's and NVML's), the numbering docker's ``device=`` and the
CDI names use; :mod:`bakeoff.host.gpus` reads NVML by the same indices, so telemetry and
energy meter exactly the GPUs the server holds. (CUDA inside a process numbers GPUs fastest
first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; inside the container the pinned GPUs are 0..N-1.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bakeoff.backends.spec import BackendSpec, KnobValue
from bakeoff.errors import SpecError

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class GpuAssignment:
    """The GPUs one server holds (indices, or UUIDs where ``CUDA_VISIBLE_DEVICES`` names them)."""

    devices: tuple[str, ...]
    source: str  # where the assignment came from, for the record

    def text(self) -> str:
        return ",".join(self.devices)

    def runtime_args(self, runtime: str) -> list[str]:
        """The container runtime's arguments that hand exactly these GPUs to the container."""
        if runtime == "docker":
            wanted = f"device={self.text()}"
            return ["--gpus", f'"{wanted}"' if len(self.devices) > 1 else wanted]
        return [arg for device in self.devices for arg in ("--device", f"nvidia.com/gpu={device}")]

    def indices(self) -> list[int] | None:
        """The NVML indices, or None where the devices are named by UUID."""
        return [int(d) for d in self.devices] if all(d.isdigit() for d in self.devices) else None

    def to_json(self) -> dict[str, object]:
        return {"devices": list(self.devices), "source": self.source}


def gpu_count(backend: BackendSpec, knobs: Mapping[str, KnobValue]) -> int:
    """GPUs the server needs: its ``tensor_parallel_size`` (knob, else the backend's default, else 1)."""
    knob = backend.knobs.get("tensor_parallel_size")
    default = knob.default if knob is not None else 1
    value = knobs.get("tensor_parallel_size", default)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def visible_devices(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The devices ``CUDA_VISIBLE_DEVICES`` lists, None where it is unset."""
    raw = env.get(VISIBLE_ENV)
    if raw is None:
        return None
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def assign_gpus(count: int, env: Mapping[str, str], *, label: str = "") -> GpuAssignment:
    """The ``count`` GPUs a server gets: the first of ``CUDA_VISIBLE_DEVICES`` (Ray's share), else 0..count-1."""
    visible = visible_devices(env)
    if visible is None:
        return GpuAssignment(tuple(str(i) for i in range(count)), f"the first {count} GPU(s): one server at a time")
    who = f"{label}: " if label else ""
    if len(visible) < count:
        raise SpecError(
            f"{who}tensor_parallel_size {count} needs {count} GPU(s), but {VISIBLE_ENV}={','.join(visible)} "
            f"gives {len(visible)}; lower tensor_parallel_size or make more GPUs visible"
        )
    return GpuAssignment(visible[:count], f"{VISIBLE_ENV} (set by Ray for its task, or by the operator)")
