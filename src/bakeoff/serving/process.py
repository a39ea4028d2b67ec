"""A local server process: start it, wait until it is ready, always tear it down.

:func:`run_local_process` is a context manager that starts a rendered command as its own
process group, waits for its health probe (failing fast with the log's tail when it dies),
yields a :class:`~bakeoff.serving.handle.ServerHandle` and, on every exit path (success,
exception, Ctrl-C), stops the whole group, children that left it included. The process and
rehearsal launchers start through it; the ports, probes and log tail here serve the container
launcher too. :func:`reap_leftovers` kills groups a hard-killed campaign left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.errors import LaunchError
from bakeoff.measure import control
from bakeoff.serving.handle import ServerHandle


def free_port() -> int:
    """A TCP port that is free right now on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def probe(url: str, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None) -> int | None:
    """HTTP status of a GET, or None when nothing answers.

    ``headers`` carry the server's API key: a gateway (or a strict server) guards its
    health endpoint with it too.
    """
    return control.call(url, headers=headers, timeout_s=timeout_s, body_limit=4096).status


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(
    health_url: str,
    *,
    timeout_s: float,
    interval_s: float,
    still_running: object,
    log_path: Path,
    what: str,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Poll ``health_url`` until it answers 200; fail fast when the server dies."""
    deadline = time.monotonic() + timeout_s
    is_running = still_running if callable(still_running) else (lambda: True)
    while time.monotonic() < deadline:
        status = probe(health_url, headers=headers)
        if status == 200:
            return
        if status in (401, 403):
            # Up, but refusing us: waiting will not change the key.
            raise LaunchError(
                f"{what} answered HTTP {status} at {health_url}: it wants an API key (or another one); "
                "set api_key_env on the server, export that variable, and retry"
            )
        if not is_running():
            raise LaunchError(f"{what} exited during startup; last log lines ({log_path}):\n{log_tail(log_path)}")
        time.sleep(interval_s)
    raise LaunchError(
        f"{what} not ready after {timeout_s:.0f} s at {health_url}; raise health.timeout_s in "
        f"the backend YAML if it is just slow. Last log lines ({log_path}):\n{log_tail(log_path)}"
    )


PID_FILE = "server.pgid"


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it if bakeoff itself dies (no orphaned servers)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


def reap_leftovers(root: Path) -> list[int]:
    """Kill process groups recorded under ``root`` whose owner never tore them down.

    A campaign interrupted hard (its notebook kernel killed mid-cell) cannot run the
    launcher's own teardown; the recorded group id still lets the campaign clean up.
    """
    killed = []
    for pid_file in root.rglob(PID_FILE):
        try:
            pgid = int(pid_file.read_text().strip())
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
        pid_file.unlink(missing_ok=True)
    return killed


def _stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM the whole group, then SIGKILL what is left; never leaves orphans behind.

    Returns only once every process of the server is gone: the group, plus any descendant
    that moved to a group of its own, and SIGKILL takes effect asynchronously.
    """
    family = _descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # Children (engine workers) may outlive the leader; the group id still reaches them.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            child.kill()
    psutil.wait_procs(family, timeout=10)


def _descendants(pid: int) -> list[psutil.Process]:
    """``pid``'s children, and the members of its process group: a leader that died during
    start-up leaves its children (an engine core) to init, where only the group id finds them."""
    try:
        family = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if proc.pid != pid and proc not in family and os.getpgid(proc.pid) == pid:
                family.append(proc)
    return family


@contextlib.contextmanager
def run_local_process(
    launch: RenderedLaunch,
    *,
    port: int,
    served_model_name: str,
    run_dir: Path,
    headers: Mapping[str, str] | None = None,
) -> Iterator[ServerHandle]:
    """Start the rendered command as its own process group with logs in ``run_dir``.

    ``headers`` (the server's API key) go with every health probe.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    if port_in_use(port):
        raise LaunchError(f"port {port} is already in use; pick another or stop what holds it")
    log_path = run_dir / "server.log"
    if launch.config_text is not None and launch.backend.config_file is not None:
        (run_dir / launch.backend.config_file.filename).write_text(launch.config_text)
    env = {**os.environ, **launch.env}
    # Engines installed beside bakeoff (llama-server) live in this environment's bin folder,
    # which is not on PATH when bakeoff is run as .venv/bin/bakeoff.
    # An engine started by its own environment's interpreter (python: engine) finds that
    # environment's tools (ninja for torch.compile) before the harness's.
    first = Path(launch.argv[0])
    own = [str(first.parent)] if first.is_absolute() and first.parent != Path(sys.executable).parent else []
    env["PATH"] = os.pathsep.join([*own, str(Path(sys.executable).parent), env.get("PATH", "")])
    base_url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"$ {launch.command_line}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                launch.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=run_dir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except FileNotFoundError as exc:
            raise LaunchError(f"{launch.backend.name}: cannot run {launch.argv[0]!r}: {exc}") from exc
    pid_file = run_dir / PID_FILE
    pid_file.write_text(f"{proc.pid}\n")
    try:
        wait_ready(
            base_url + launch.backend.health.path,
            timeout_s=launch.backend.health.timeout_s,
            interval_s=launch.backend.health.interval_s,
            still_running=lambda: proc.poll() is None,
            log_path=log_path,
            what=f"{launch.backend.name} (pid {proc.pid})",
            headers=headers,
        )
        yield ServerHandle(
            base_url=base_url,
            model=served_model_name,
            log_path=log_path,
            command_line=launch.command_line,
            startup_s=time.monotonic() - started,
            kind="process",
            pid=proc.pid,
        )
    finally:
        _stop_process_group(proc)
        pid_file.unlink(missing_ok=True)
