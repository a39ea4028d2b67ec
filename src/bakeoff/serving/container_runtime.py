"""The container runtime: podman or docker, found and called.

:func:`find_runtime` picks the runtime (``BAKEOFF_CONTAINER_RUNTIME``, then podman, then a
docker whose engine answers); for GPU servers :func:`bakeoff.serving.runtime_facts.find_gpu_runtime`
picks the one that can hand over the GPUs instead. :func:`runtime_cli` runs one of its commands
with a timeout, so a hung runtime ends with a clear error. The OCI runtime under podman is the
host's choice (``containers.conf``, which scripts/setup-podman.sh sets to runc where crun fails),
not forced on every host; ``BAKEOFF_OCI_RUNTIME`` overrides it for one run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

from bakeoff.errors import LaunchError, RuntimeMissingError

RUNTIMES = ("podman", "docker")
RUNTIME_ENV = "BAKEOFF_CONTAINER_RUNTIME"
OCI_RUNTIME_ENV = "BAKEOFF_OCI_RUNTIME"
_CLI_TIMEOUT_S = 60.0
_HINT = "Install podman with scripts/setup-podman.sh (or start a docker engine)."


def find_runtime(preferred: str | None = None) -> str:
    """``"podman"`` or ``"docker"``: the env var, then ``preferred``, then the first usable one.

    A docker client without a reachable engine does not count as usable (this machine
    class ships the docker CLI but no daemon).
    """
    wanted = os.environ.get(RUNTIME_ENV) or preferred
    if wanted is not None:
        if wanted not in RUNTIMES:
            raise RuntimeMissingError(
                f"container runtime {wanted!r} is not supported; use one of {', '.join(RUNTIMES)}"
            )
        if not runtime_usable(wanted):
            raise RuntimeMissingError(f"container runtime {wanted!r} is not usable here. {_HINT}")
        return wanted
    for name in RUNTIMES:
        if runtime_usable(name):
            return name
    raise RuntimeMissingError(f"no container runtime found. {_HINT}")


def runtime_usable(name: str) -> bool:
    if shutil.which(name) is None:
        return False
    if name == "podman":
        return True
    # The docker CLI answers `version` for the client alone; the server part needs the engine.
    try:
        args = [name, "version", "--format", "{{.Server.Version}}"]
        proc = subprocess.run(args, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def runtime_command(runtime: str) -> list[str]:
    """The runtime executable with its global flags: ``--runtime`` only where ``BAKEOFF_OCI_RUNTIME`` asks.

    Forcing runc everywhere (a workaround for one machine class, whose containers.conf now says
    it) would override a GPU host's own choice, e.g. the runtime its NVIDIA hooks are set up for.
    """
    oci = os.environ.get(OCI_RUNTIME_ENV)
    return [runtime, "--runtime", oci] if oci and runtime == "podman" else [runtime]


def shown_runtime() -> str:
    """The runtime a printed command names: the one bakeoff would use here, else docker (the common form).

    ``backends show``, a rehearsal's recorded commands and its "on the GPU host" steps all
    call this, so the three never spell the same launch with two runtimes.
    """
    try:
        return find_runtime()
    except RuntimeMissingError:
        return "docker"


def shell_words(argv: list[str]) -> str:
    """``argv`` as one shell line, where a ``${VAR}`` left in a word (an unset registry) still expands.

    ``shlex.join`` would single-quote it, so the line would run with the literal ``${VAR}`` even
    after the user exports the variable; such words are double-quoted instead.
    """
    return " ".join(f'"{a}"' if "${" in a and '"' not in a else shlex.quote(a) for a in argv)


def runtime_cli(runtime: str, *args: str, timeout_s: float = _CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``RUNTIME [global flags] ARGS``, output captured; a missing or hung runtime raises."""
    try:
        return subprocess.run(
            [*runtime_command(runtime), *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise RuntimeMissingError(f"{runtime} is not installed. {_HINT}") from exc
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"`{runtime} {shlex.join(args)}` hung for {timeout_s:.0f} s") from exc
