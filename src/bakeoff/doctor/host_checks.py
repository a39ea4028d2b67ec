"""The host against what a campaign's GPU servers need, each problem one line with its fix.

- the runtime that can hand over GPUs (:func:`chosen_runtime`: docker with the NVIDIA runtime,
  else podman with an NVIDIA CDI spec; the same order
  :func:`bakeoff.serving.runtime_facts.find_gpu_runtime` starts servers with), and the
  ``--ulimit`` values it refuses (rootless podman; left out there, said as a warning);
- the driver's CUDA against each image's (:func:`bakeoff.host.gpu_checks.cuda_refusal`);
- each GPU's compute capability against the knob values that need more (``needs_gpu``);
- memory other processes hold on the GPUs; disk for the images not pulled yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bakeoff.backends.knobs import check_knob, value_key
from bakeoff.doctor.host import HostFacts
from bakeoff.doctor.problems import Problem
from bakeoff.host.gpu_checks import cuda_minor_note, cuda_refusal
from bakeoff.serving.images import qualified_image
from bakeoff.serving.runtime_facts import NVIDIA_CDI_KIND, RuntimeFacts

if TYPE_CHECKING:
    from bakeoff.doctor.diagnose import DoctorServer

# The CUDA serving images unpack to 15-30 GiB each (vLLM, SGLang, TensorRT-LLM releases of 2025-26).
IMAGE_DISK_GIB = 30
# Memory another process may hold on a GPU before it is worth a line (a display, a monitor).
_OTHERS_MIB = 1024
_GIB = 1 << 30
CDI_FIX = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml (NVIDIA Container Toolkit 1.14+)"
DOCKER_FIX = (
    "install the NVIDIA Container Toolkit, then sudo nvidia-ctk runtime configure --runtime=docker "
    "&& sudo systemctl restart docker"
)


def chosen_runtime(host: HostFacts) -> RuntimeFacts | None:
    """The runtime GPU servers would start with: the first of docker, podman that can hand over GPUs."""
    ready = [r for r in sorted(host.runtimes, key=lambda r: r.name) if r.gpu_ready()]
    return ready[0] if ready else None


def check_host(servers: list[DoctorServer], host: HostFacts, runtime: RuntimeFacts | None) -> list[Problem]:
    gpu_servers = [s for s in servers if s.gpu_container]
    if not gpu_servers:
        return []
    problems = _runtime_problems(gpu_servers, host, runtime)
    if host.cuda is None or not host.gpus:
        problems.append(
            Problem(
                "host: nvidia-smi",
                "every GPU server would fail at start: nvidia-smi lists no GPU (no NVIDIA driver loaded)",
                "install the NVIDIA driver and check that `nvidia-smi` lists the GPUs",
            )
        )
        return problems
    problems += _driver_problems(gpu_servers, host.cuda)
    problems += _capability_problems(gpu_servers, host)
    problems += _memory_problems(gpu_servers, host)
    if runtime is not None:
        problems += _disk_problems(gpu_servers, host, runtime)
    return problems


def _runtime_problems(servers: list[DoctorServer], host: HostFacts, runtime: RuntimeFacts | None) -> list[Problem]:
    if runtime is None:
        found = {r.name: r for r in host.runtimes}
        if not found:
            return [
                Problem(
                    "host: container runtime",
                    "no GPU server could start: neither docker nor podman answers `info`",
                    "install docker with the NVIDIA Container Toolkit, or podman with an NVIDIA CDI spec",
                )
            ]
        problems = []
        if "podman" in found:
            problems.append(
                Problem(
                    "host: podman CDI spec",
                    f"podman would refuse --device {NVIDIA_CDI_KIND}=all: no NVIDIA CDI spec in /etc/cdi or "
                    "/var/run/cdi (unresolvable CDI devices)",
                    CDI_FIX,
                )
            )
        if "docker" in found:
            problems.append(
                Problem(
                    "host: docker NVIDIA runtime",
                    "docker would refuse --gpus: no NVIDIA runtime registered and no NVIDIA CDI spec "
                    '(could not select device driver "" with capabilities: [[gpu]])',
                    DOCKER_FIX,
                )
            )
        return problems
    problems = []
    for server in servers:
        spec = server.backend.container
        assert spec is not None
        for ulimit in spec.ulimits:
            refusal = runtime.refused_ulimit(ulimit)
            if refusal is not None:
                problems.append(
                    Problem(
                        f"backends/{server.backend.name}.yaml container.ulimits {ulimit}",
                        f"{refusal}, so bakeoff leaves it out on this host and the server runs with that limit",
                        f"to keep it, raise the user's hard limit (/etc/security/limits.conf: <user> hard "
                        f"{ulimit.partition('=')[0]} unlimited, then log in again) or run podman as root",
                        "warning",
                    )
                )
    return problems


def _driver_problems(servers: list[DoctorServer], cuda: tuple[int, int]) -> list[Problem]:
    problems = []
    for server in servers:
        field = f"backends/{server.backend.name}.yaml container.image"
        refusal = cuda_refusal(server.backend, *cuda)
        if refusal is not None:
            would, _, fix = refusal.partition("; ")
            problems.append(Problem(field, f"the container would fail at start: {would}", fix))
            continue
        note = cuda_minor_note(server.backend, *cuda)
        if note is not None:
            would, _, fix = note.rpartition("; ")
            problems.append(Problem(field, would, fix, "warning"))
    return problems


def _capability_problems(servers: list[DoctorServer], host: HostFacts) -> list[Problem]:
    problems = []
    weakest = min(host.gpus, key=lambda g: g.compute_capability)
    for server in servers:
        for name, value in server.knobs.items():
            spec = server.backend.knobs.get(name)
            if spec is None or not spec.needs_gpu:
                continue
            need = spec.needs_gpu.get(value_key(check_knob(server.backend, name, value)))
            if need is None or weakest.compute_capability >= need.min_capability:
                continue
            problems.append(
                Problem(
                    f"{server.where}.knobs.{name} ({server.label})",
                    f"{need.reason}; GPU {weakest.index} ({weakest.name}) is compute capability "
                    f"{weakest.compute_capability:.1f}",
                    f"set {name} to another value (kv_cache_dtype: auto, or int8 where the framework has it), "
                    f"or run on GPUs of compute capability {need.min_capability:.1f} or newer",
                )
            )
    return problems


def _declared_share(server: DoctorServer) -> float | None:
    value = server.knobs.get("gpu_memory_utilization")
    if value is None:
        spec = server.backend.knobs.get("gpu_memory_utilization")
        value = spec.default if spec is not None else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _memory_problems(servers: list[DoctorServer], host: HostFacts) -> list[Problem]:
    problems = []
    for gpu in host.gpus:
        held = gpu.memory_total_mib - gpu.memory_free_mib
        if held <= _OTHERS_MIB:
            continue
        free_share = gpu.memory_free_mib / gpu.memory_total_mib
        refused = False
        for server in servers:
            share = _declared_share(server)
            # vLLM sizes itself as a share of TOTAL memory and refuses to start when less is free.
            if server.backend.name.startswith("vllm") and share is not None and share > free_share:
                refused = True
                problems.append(
                    Problem(
                        f"{server.where}.knobs.gpu_memory_utilization ({server.label})",
                        f"vLLM would refuse to start: GPU {gpu.index} has {gpu.memory_free_mib / 1024:.1f} GiB free "
                        f"of {gpu.memory_total_mib / 1024:.1f} GiB, less than gpu_memory_utilization {share} of it",
                        f"stop what holds the GPU (nvidia-smi lists it) or set gpu_memory_utilization to "
                        f"{int(free_share * 100) / 100} or less",
                    )
                )
        if not refused:
            problems.append(
                Problem(
                    f"host: GPU {gpu.index}",
                    f"other processes hold {held / 1024:.1f} GiB of {gpu.name}: every server gets less KV cache "
                    "than on an idle GPU, and the other load shares its compute",
                    "stop what holds the GPU (nvidia-smi lists it) before measuring",
                    "warning",
                )
            )
    return problems


def _present(image: str, images: list[str]) -> bool:
    wanted = qualified_image(image)
    return any(qualified_image(i) == wanted for i in images)


def _disk_problems(servers: list[DoctorServer], host: HostFacts, runtime: RuntimeFacts) -> list[Problem]:
    missing = sorted(
        {
            s.backend.container.image
            for s in servers
            if s.backend.container is not None and not _present(s.backend.container.image, host.images)
        }
    )
    free = runtime.store_free_bytes
    if free is None and runtime.store_dir is not None:
        free = host.disk_free.get(runtime.store_dir)
    if not missing or free is None:
        return []
    need = len(missing) * IMAGE_DISK_GIB * _GIB
    if free >= need:
        return []
    return [
        Problem(
            f"host: {runtime.name} image store {runtime.store_dir}",
            f"pulling {', '.join(missing)} would run out of disk: {free / _GIB:.0f} GiB free, about "
            f"{IMAGE_DISK_GIB} GiB each needed",
            f"free {(need - free) / _GIB:.0f} GiB there, or move the store to a larger disk",
        )
    ]
