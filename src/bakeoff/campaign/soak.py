"""A soak cell's extra: the memory account written beside its run before the load starts.

A soak run is measured like any run (:func:`bakeoff.campaign.runner.execute_plan`); what it
adds is ``memory.json`` (:class:`bakeoff.results.memory.MemoryAccount`): the weights and KV
pool of the started server, so the report can say how much of the engine's memory neither
explains (:mod:`bakeoff.analysis.soak`). It is written before the load, so a run cut short
by Ctrl-C keeps it, and again on each re-measure.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.spec import BackendSpec
from bakeoff.observe.memory_account import account
from bakeoff.results.memory import MEMORY_FILE, MemorySource, write_memory
from bakeoff.serving.handle import ServerHandle


def memory_source(backend: BackendSpec, handle: ServerHandle) -> MemorySource:
    """Which telemetry column is the engine's memory: NVML on a GPU server, the process tree's RSS on a local one."""
    if backend.accelerator == "gpu":
        return "nvml"
    return "rss" if handle.pid is not None else "none"  # a local process tree (a process server, a stand-in)


def write_account(
    backend: BackendSpec,
    handle: ServerHandle,
    launch: RenderedLaunch | None,
    model_dir: Path | None,
    run_dir: Path,
    headers: dict[str, str],
) -> None:
    """``memory.json`` for a soak run about to start on ``handle``."""
    source = memory_source(backend, handle)
    argv = launch.argv if launch is not None else []
    found = account(handle.base_url, backend, argv, model_dir, source=source, headers=headers)
    if source == "none":
        found.notes.append(
            "engine memory not measured: bakeoff did not start this server (a url), so it has no process to read"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_memory(run_dir / MEMORY_FILE, found)
