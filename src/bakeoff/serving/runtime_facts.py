"""What this host's container runtime can do with GPUs, read from its own ``info`` and the CDI specs.

- docker (``docker info --format json``): whether the NVIDIA runtime is registered (``Runtimes``
  holds ``nvidia`` once ``nvidia-ctk runtime configure`` ran), whether the daemon is rootless
  (``SecurityOptions`` holds ``name=rootless``) and where it keeps images (``DockerRootDir``).
- podman (``podman info --format json``): rootless or not (``host.security.rootless``), its OCI
  runtime, and its image store with the space left there (``store.graphRoot``, ``graphRootAllocated``
  minus ``graphRootUsed``).
- CDI: the NVIDIA spec ``nvidia-ctk cdi generate`` writes (``/etc/cdi/nvidia.yaml`` or
  ``/var/run/cdi/nvidia.yaml``): the device names ``--device nvidia.com/gpu=N`` may use.

:func:`parse_docker_info`, :func:`parse_podman_info` and :func:`cdi_devices` are pure, so recorded
outputs stand in for a GPU host in tests; :func:`live_runtime_facts` asks this host's runtime
once per process. :meth:`RuntimeFacts.refused_ulimit` is the one rule for which ``--ulimit`` a
runtime refuses: rootless podman cannot raise a hard limit above the user's own
("setrlimit RLIMIT_MEMLOCK: Operation not permitted"), so such a limit is left out there.
"""

from __future__ import annotations

import functools
import json
import os
import resource
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bakeoff.results.layout import load_yaml
from bakeoff.serving.container_runtime import RUNTIME_ENV, find_runtime, runtime_cli, runtime_usable

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
NVIDIA_CDI_KIND = "nvidia.com/gpu"
# The hard limits a rootless runtime cannot raise, by --ulimit name (resource module constants).
_RLIMITS = {"memlock": resource.RLIMIT_MEMLOCK, "stack": resource.RLIMIT_STACK, "nofile": resource.RLIMIT_NOFILE}
UNLIMITED = -1


@dataclass(frozen=True)
class RuntimeFacts:
    """One container runtime on one host, as far as starting a GPU server goes."""

    name: str  # docker | podman
    version: str = ""
    rootless: bool = False
    nvidia_runtime: bool = False  # docker: the NVIDIA runtime registered (what --gpus needs)
    cdi: tuple[str, ...] = ()  # CDI device names, e.g. nvidia.com/gpu=0, nvidia.com/gpu=all
    store_dir: str | None = None
    store_free_bytes: int | None = None
    hard_limits: Mapping[str, int] = field(default_factory=dict)  # ulimit name -> hard limit (-1: unlimited)

    def gpu_ready(self) -> bool:
        """The runtime can hand this host's NVIDIA GPUs to a container the way bakeoff asks for them."""
        if self.name == "docker":
            return self.nvidia_runtime or f"{NVIDIA_CDI_KIND}=all" in self.cdi
        return f"{NVIDIA_CDI_KIND}=all" in self.cdi

    def refused_ulimit(self, ulimit: str) -> str | None:
        """Why this runtime would refuse ``--ulimit NAME=VALUE``, or None when it takes it."""
        if not (self.name == "podman" and self.rootless):
            return None
        name, _, value = ulimit.partition("=")
        wanted = [int(v) for v in value.split(":")] if value else []
        hard = self.hard_limits.get(name)
        if hard is None or hard == UNLIMITED or not wanted:
            return None
        if any(w == UNLIMITED or w > hard for w in wanted):
            shown = "unlimited" if UNLIMITED in wanted else value
            return (
                f"rootless podman cannot raise {name} above the user's hard limit {hard} to {shown} "
                f"(setrlimit RLIMIT_{name.upper()}: Operation not permitted)"
            )
        return None

    def accepted_ulimits(self, ulimits: Iterable[str]) -> list[str]:
        """The ``--ulimit`` values this runtime takes, in order; the refused ones left out."""
        return [u for u in ulimits if self.refused_ulimit(u) is None]


def _json(text: str, what: str) -> dict[str, object]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{what} is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not a JSON object")
    return data


def parse_docker_info(
    text: str, cdi: tuple[str, ...] = (), hard_limits: Mapping[str, int] | None = None
) -> RuntimeFacts:
    """Facts from ``docker info --format json`` (and the CDI devices the host's specs name)."""
    data = _json(text, "docker info")
    options = data.get("SecurityOptions")
    return RuntimeFacts(
        name="docker",
        version=str(data.get("ServerVersion") or ""),
        rootless=isinstance(options, list) and any("name=rootless" in str(o) for o in options),
        nvidia_runtime="nvidia" in _section(data, "Runtimes"),
        cdi=cdi,
        store_dir=str(data["DockerRootDir"]) if data.get("DockerRootDir") else None,
        hard_limits=dict(hard_limits or {}),
    )


def parse_podman_info(
    text: str, cdi: tuple[str, ...] = (), hard_limits: Mapping[str, int] | None = None
) -> RuntimeFacts:
    """Facts from ``podman info --format json`` (and the CDI devices the host's specs name)."""
    data = _json(text, "podman info")
    host, store, version = _section(data, "host"), _section(data, "store"), _section(data, "version")
    allocated, used = store.get("graphRootAllocated"), store.get("graphRootUsed")
    free = allocated - used if isinstance(allocated, int) and isinstance(used, int) else None
    return RuntimeFacts(
        name="podman",
        version=str(version.get("Version") or ""),
        rootless=bool(_section(host, "security").get("rootless")),
        cdi=cdi,
        store_dir=str(store["graphRoot"]) if store.get("graphRoot") else None,
        store_free_bytes=free,
        hard_limits=dict(hard_limits or {}),
    )


def _section(data: Mapping[str, object], key: str) -> dict[str, object]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def cdi_devices(specs: Iterable[str]) -> tuple[str, ...]:
    """``kind=name`` of every device the CDI spec texts (YAML or JSON) declare, e.g. ``nvidia.com/gpu=0``."""
    found: list[str] = []
    for text in specs:
        try:
            data = load_yaml(text)
        except yaml.YAMLError:
            continue  # a broken spec is one the runtime cannot use either
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            continue
        kind = str(data.get("kind") or "")
        found += [f"{kind}={d['name']}" for d in data["devices"] if isinstance(d, dict) and "name" in d]
    return tuple(dict.fromkeys(found))


def read_cdi_specs(dirs: Iterable[str] = CDI_DIRS) -> dict[str, str]:
    """File name -> text of every CDI spec in the standard folders (empty where none is)."""
    specs = {}
    for folder in dirs:
        for path in sorted(Path(folder).glob("*")):
            if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
                try:
                    specs[str(path)] = path.read_text()
                except OSError:
                    continue
    return specs


def host_hard_limits() -> dict[str, int]:
    """This user's hard limits by ``--ulimit`` name (-1: unlimited): what a rootless runtime can grant."""
    limits = {}
    for name, which in _RLIMITS.items():
        hard = resource.getrlimit(which)[1]
        limits[name] = UNLIMITED if hard == resource.RLIM_INFINITY else int(hard)
    return limits


def runtime_info_text(runtime: str) -> str | None:
    """``RUNTIME info --format json`` on this host, or None when the runtime does not answer."""
    proc = runtime_cli(runtime, "info", "--format", "json", timeout_s=30)
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


@functools.lru_cache(maxsize=4)
def live_runtime_facts(runtime: str) -> RuntimeFacts:
    """This host's runtime, asked once per process; an unanswered ``info`` gives the bare name (nothing refused)."""
    text = runtime_info_text(runtime)
    cdi = cdi_devices(read_cdi_specs().values())
    parse = parse_docker_info if runtime == "docker" else parse_podman_info
    if text is None:
        return RuntimeFacts(name=runtime, cdi=cdi)
    try:
        return parse(text, cdi, host_hard_limits())
    except ValueError:
        return RuntimeFacts(name=runtime, cdi=cdi)


def find_gpu_runtime() -> str:
    """The runtime that can hand this host's GPUs to a container.

    ``BAKEOFF_CONTAINER_RUNTIME`` when set; else docker with the NVIDIA runtime, else podman
    with an NVIDIA CDI spec; else :func:`find_runtime`'s pick, which ``bakeoff doctor`` has
    already refused with its fix before a campaign gets here.
    """
    if os.environ.get(RUNTIME_ENV):
        return find_runtime()
    for name in ("docker", "podman"):
        if runtime_usable(name) and live_runtime_facts(name).gpu_ready():
            return name
    return find_runtime()
