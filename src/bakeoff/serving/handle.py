"""A started server as one typed object: :class:`ServerHandle`, and what each launcher kind is.

Every launcher (:mod:`bakeoff.serving.launchers`) yields a :class:`ServerHandle`; everything
after the start asks the handle, never a kind string:

- *ready*: a handle exists only once its health probe answered;
- *alive*: :func:`bakeoff.serving.death_watch.watch_for` watches what the handle holds (the
  local process group's ``pid``, the container by ``container_id`` under ``placement.runtime``,
  else the port);
- *reset cache*: by the backend's ``cache_reset`` (an HTTP call, or a restart by
  :class:`bakeoff.campaign.cold_cache.CellServer`), the same whichever launcher started it;
- *stop*: leaving the launcher's context; :attr:`ServerKind.launched` says whether there is
  anything of bakeoff's to stop.

:class:`ServerKind` is what differs between the four kinds before and after a start (whether
bakeoff launches it, whether a stand-in answers, a typical start-up for estimates), kept in the
explicit :data:`SERVER_KINDS`. ``ServerHandle.kind`` stays the kind's name: it is what
``cell.json`` records as the server's ``kind``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bakeoff.serving.gpu_pinning import GpuAssignment

LauncherKind = Literal["process", "container", "rehearsal", "external"]


@dataclass(frozen=True)
class ServerKind:
    """What one launcher kind means to the code around a server (the launch itself is the launcher's)."""

    name: LauncherKind
    launched: bool  # bakeoff starts it, stops it, and can restart it (False: an external server)
    stand_in: bool  # the reference server answers in the framework's place (a rehearsal)
    start_s: float  # a typical start-up, for estimates before anything ran
    # History's measured start-ups apply (a stand-in's or an external server's start is not the framework's).
    start_calibrated: bool
    # The framework itself runs as a local process from this host's environments: its engine
    # environment must exist before the start, and its launch environment is set on the process
    # (a command to copy shows it as ``env K=V``; a container's goes into its own ``-e`` flags).
    local_engine: bool


# Start-ups: CPU engines from this project's small model on 2 cores, GPU containers typical of
# a 7-8B model on one GPU; a rehearsal's stand-in (the reference server) is up in about a second.
SERVER_KINDS: dict[LauncherKind, ServerKind] = {
    "process": ServerKind("process", True, False, 60.0, True, True),
    "container": ServerKind("container", True, False, 120.0, True, False),
    "rehearsal": ServerKind("rehearsal", True, True, 2.0, False, False),
    "external": ServerKind("external", False, False, 2.0, False, False),
}


@dataclass(frozen=True)
class BuildSteps:
    """What a server needed built before its start, timed for the effort record (None: no such step)."""

    image_build_s: float | None = None  # the container image, built here (None: it was present)
    engine_build_s: float | None = None  # the engine step: llama.cpp's GGUF conversion, trtllm-build
    engine_build_step: str | None = None  # what that step was, in words
    # True: the engine came from the cache and engine_build_s is the original build's time.
    engine_build_cached: bool | None = None


@dataclass(frozen=True)
class Placement:
    """Where a launched server runs, beyond its URL."""

    gpus: GpuAssignment | None = None  # the GPUs it is pinned to (None: not a pinned GPU server)
    runtime: str | None = None  # the container runtime holding it (podman, docker)
    container_name: str | None = None


@dataclass
class ServerHandle:
    """A running, ready server and what it took to get there."""

    base_url: str
    model: str
    log_path: Path
    command_line: str
    startup_s: float
    kind: LauncherKind  # the launcher that started it; recorded in cell.json as the server's kind
    pid: int | None = None  # the local process group's leader (process and rehearsal servers)
    container_id: str | None = None
    image: str | None = None
    image_digest: str | None = None
    # A GGUF server's tensor types by count (what llama-quantize wrote), for the report.
    weight_types: dict[str, int] | None = None
    build: BuildSteps = field(default_factory=BuildSteps)
    placement: Placement = field(default_factory=Placement)

    @property
    def server_kind(self) -> ServerKind:
        return SERVER_KINDS[self.kind]

    def pinned_indices(self) -> list[int] | None:
        """The NVML indices of the GPUs the server is pinned to (None: not a pinned GPU server, or by UUID)."""
        gpus = self.placement.gpus
        return gpus.indices() if gpus is not None else None
