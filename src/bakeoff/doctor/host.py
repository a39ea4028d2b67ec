"""The host as the doctor sees it: the tools' own outputs, read live, recorded, or read back from a folder.

:class:`HostOutputs` holds what the tools print, unparsed, so a recorded folder is the same
thing a live host gives (``bakeoff doctor --record DIR`` writes one; ``--host-from DIR`` and the
tests read one):

=========================  ===================================================================
``nvidia-smi.txt``         plain ``nvidia-smi`` (its ``CUDA Version: X.Y`` is the driver's CUDA)
``nvidia-smi-gpus.csv``    ``nvidia-smi --query-gpu=index,name,driver_version,compute_cap,``
                           ``memory.total,memory.free --format=csv``
``docker-info.json``       ``docker info --format json`` (absent: no docker engine)
``podman-info.json``       ``podman info --format json`` (absent: no podman)
``cdi/*.yaml``             the CDI specs of /etc/cdi and /var/run/cdi (``nvidia-ctk cdi generate``)
``host.json``              the user's hard limits, disk free per folder, images already present
=========================  ===================================================================

:meth:`HostOutputs.facts` parses them into :class:`HostFacts` (GPUs, driver CUDA, runtimes).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bakeoff.errors import LaunchError, SpecError
from bakeoff.host.gpu_checks import parse_cuda_version
from bakeoff.serving.container_runtime import RUNTIMES, runtime_cli, runtime_usable
from bakeoff.serving.runtime_facts import (
    RuntimeFacts,
    cdi_devices,
    host_hard_limits,
    parse_docker_info,
    parse_podman_info,
    read_cdi_specs,
    runtime_info_text,
)

GPU_QUERY = "index,name,driver_version,compute_cap,memory.total,memory.free"
_FILES = {"nvidia_smi": "nvidia-smi.txt", "gpu_query": "nvidia-smi-gpus.csv"}
_INFO = {"docker": "docker-info.json", "podman": "podman-info.json"}
HOST_FILE = "host.json"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver: str
    compute_capability: float
    memory_total_mib: int
    memory_free_mib: int


@dataclass
class HostOutputs:
    """What the host's tools printed; None where a tool is missing or did not answer."""

    nvidia_smi: str | None = None
    gpu_query: str | None = None
    infos: dict[str, str] = field(default_factory=dict)  # runtime -> its `info --format json`
    cdi_specs: dict[str, str] = field(default_factory=dict)  # file name -> text
    hard_limits: dict[str, int] = field(default_factory=dict)
    disk_free: dict[str, int] = field(default_factory=dict)  # folder -> bytes free
    images: list[str] = field(default_factory=list)  # images already present, as the runtime names them

    def facts(self) -> HostFacts:
        cdi = cdi_devices(self.cdi_specs.values())
        runtimes = []
        for name, text in self.infos.items():
            parse = parse_docker_info if name == "docker" else parse_podman_info
            try:
                runtimes.append(parse(text, cdi, self.hard_limits))
            except ValueError as exc:
                raise SpecError(f"{name} info: {exc}") from exc
        cuda = parse_cuda_version(self.nvidia_smi) if self.nvidia_smi else None
        return HostFacts(
            gpus=parse_gpu_query(self.gpu_query or ""),
            cuda=cuda,
            runtimes=runtimes,
            cdi=cdi,
            disk_free=dict(self.disk_free),
            images=list(self.images),
        )

    def record(self, folder: Path) -> None:
        """Write these outputs as a host-description folder (the layout above)."""
        folder.mkdir(parents=True, exist_ok=True)
        for attr, name in _FILES.items():
            text = getattr(self, attr)
            if text is not None:
                (folder / name).write_text(text)
        for runtime, text in self.infos.items():
            (folder / _INFO[runtime]).write_text(text)
        if self.cdi_specs:
            (folder / "cdi").mkdir(exist_ok=True)
            for path, text in self.cdi_specs.items():
                (folder / "cdi" / Path(path).name).write_text(text)
        extra = {"hard_limits": self.hard_limits, "disk_free": self.disk_free, "images": self.images}
        (folder / HOST_FILE).write_text(json.dumps(extra, indent=2) + "\n")


@dataclass
class HostFacts:
    gpus: list[Gpu]
    cuda: tuple[int, int] | None
    runtimes: list[RuntimeFacts]
    cdi: tuple[str, ...]
    disk_free: dict[str, int]
    images: list[str]


def parse_gpu_query(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=GPU_QUERY --format=csv`` (a header line, units after values)."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 6 or not cells[0].isdigit():
            continue  # the header, or a line nvidia-smi printed instead (an error)

        def mib(cell: str) -> int:
            return int(float(cell.removesuffix("MiB").strip()))

        try:
            gpus.append(Gpu(int(cells[0]), cells[1], cells[2], float(cells[3]), mib(cells[4]), mib(cells[5])))
        except ValueError:
            continue  # "[N/A]" on a GPU that does not report a field
    return gpus


def read_recorded(folder: Path) -> HostOutputs:
    """A host-description folder (``--record``'s layout) read back."""
    if not folder.is_dir():
        raise SpecError(f"--host-from {folder}: no such folder; write one with `bakeoff doctor --record DIR`")

    def text(name: str) -> str | None:
        path = folder / name
        return path.read_text() if path.is_file() else None

    extra = json.loads(text(HOST_FILE) or "{}")
    cdi = {str(p): p.read_text() for p in sorted((folder / "cdi").glob("*")) if p.is_file()}
    return HostOutputs(
        nvidia_smi=text(_FILES["nvidia_smi"]),
        gpu_query=text(_FILES["gpu_query"]),
        infos={r: t for r, name in _INFO.items() if (t := text(name)) is not None},
        cdi_specs=cdi,
        hard_limits={str(k): int(v) for k, v in dict(extra.get("hard_limits") or {}).items()},
        disk_free={str(k): int(v) for k, v in dict(extra.get("disk_free") or {}).items()},
        images=[str(i) for i in extra.get("images") or []],
    )


def _nvidia_smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def read_live() -> HostOutputs:
    """This host's outputs: each tool asked once; a missing tool leaves its part empty."""
    infos: dict[str, str] = {}
    images: list[str] = []
    disk: dict[str, int] = {}
    for runtime in RUNTIMES:
        if not runtime_usable(runtime):
            continue
        try:
            text = runtime_info_text(runtime)
            listed = runtime_cli(runtime, "images", "--format", "{{.Repository}}:{{.Tag}}")
        except LaunchError:
            continue
        if text is None:
            continue
        infos[runtime] = text
        images += [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    outputs = HostOutputs(
        nvidia_smi=_nvidia_smi(),
        gpu_query=_nvidia_smi(f"--query-gpu={GPU_QUERY}", "--format=csv"),
        infos=infos,
        cdi_specs=read_cdi_specs(),
        hard_limits=host_hard_limits(),
        images=images,
    )
    for facts in outputs.facts().runtimes:
        folder = Path(facts.store_dir) if facts.store_dir else None
        while folder is not None and not folder.exists() and folder != folder.parent:
            folder = folder.parent  # a rootless store not made yet: the disk it will be on
        if folder is not None:
            disk[str(facts.store_dir)] = shutil.disk_usage(folder).free
    outputs.disk_free = disk
    return outputs
