"""Container lifecycles: render a backend's launch for its image, run it, always remove it.

The container twin of :func:`bakeoff.serving.process.run_local_process`. :func:`run_container` is a
context manager that starts a backend's image with the runtime of
:mod:`bakeoff.serving.container_runtime` (the image made present by :mod:`bakeoff.serving.images`), waits
until its health endpoint answers on the host port, and removes the container on every
exit path: success, exception and Ctrl-C. Every container it starts
carries the label ``bakeoff=1`` so leftovers can be found (:func:`leftover_containers`).

Rendering for a container: the server inside listens on the image's fixed
``container.container_port`` (the backend YAML writes it literally, never ``{port}``),
reads the model from ``container.model_mount`` and a rendered config file from
``/bakeoff/{filename}``. :func:`render_container_launch` renders a launch with those
in-container paths; callers use it instead of ``render_launch`` for container backends.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from bakeoff.backends.knobs import draft_model_knob
from bakeoff.backends.launch_render import RenderedLaunch, render_launch
from bakeoff.backends.spec import DRAFT_MOUNT, BackendSpec, ContainerSpec, KnobValue
from bakeoff.errors import LaunchError
from bakeoff.models.model_source import ContainerModel
from bakeoff.results.store import atomic_write_bytes
from bakeoff.serving.container_runtime import find_runtime, runtime_cli, runtime_command
from bakeoff.serving.gpu_pinning import GpuAssignment, assign_gpus, gpu_count
from bakeoff.serving.handle import BuildSteps, Placement, ServerHandle
from bakeoff.serving.images import ensure_image
from bakeoff.serving.process import port_in_use, wait_ready
from bakeoff.serving.runtime_facts import RuntimeFacts, find_gpu_runtime, live_runtime_facts

CONTAINER_CONFIG_DIR = "/bakeoff"
LABEL = "bakeoff=1"


def render_container_launch(
    backend: BackendSpec, knobs: dict[str, KnobValue], *, served_model_name: str, model_arg: str | None = None
) -> RenderedLaunch:
    """``render_launch`` with the paths and port as seen from inside the container.

    ``model_arg`` replaces the mounted folder as the model argument: a Hugging Face id
    (:meth:`bakeoff.models.model_source.ModelSource.container_mount` gives it).
    """
    if backend.container is None:
        raise LaunchError(f"backend {backend.name!r} has no 'container' section")
    launch = render_launch(
        backend,
        knobs,
        model=model_arg or backend.container.model_mount,
        served_model_name=served_model_name,
        port=backend.container.container_port,
        host="0.0.0.0",
    )
    return replace(launch, argv=container_config_argv(launch))


def container_config_argv(launch: RenderedLaunch) -> list[str]:
    """argv with the config-file argument pointing at its mount inside the container.

    ``render_launch`` resolves ``{config_file}`` to the bare file name, which suits a
    local process started in its run dir; in a container the file is at
    ``/bakeoff/{filename}``.
    """
    spec = launch.backend.config_file
    argv = list(launch.argv)
    if spec is None:
        return argv
    inside = f"{CONTAINER_CONFIG_DIR}/{spec.filename}"
    for i in range(len(argv) - 1):
        if argv[i] == spec.flag and argv[i + 1] == spec.filename:
            argv[i + 1] = inside
    return argv


def container_run_args(
    launch: RenderedLaunch,
    *,
    runtime: str,
    port: int,
    model_dir: Path | None,
    name: str,
    config_path: Path | None = None,
    model: ContainerModel | None = None,
    draft_dir: Path | None = None,
    facts: RuntimeFacts | None = None,
    gpus: GpuAssignment | None = None,
) -> list[str]:
    """The ``run -d ...`` arguments (after :func:`runtime_command`) for one launch. Pure.

    ``facts`` (the runtime's own ``info``) leaves out the ``--ulimit`` values it would refuse
    (rootless podman: a hard limit above the user's); without them every declared one is passed.

    The rendered argv's first word becomes ``--entrypoint`` so the backend YAML, not the
    image's ENTRYPOINT, decides what runs. ``config_path`` (the rendered config file on
    the host) is mounted read-only at ``/bakeoff/{filename}``. ``model`` (a Hugging Face
    id's cache mount and ``-e HF_TOKEN`` by name) replaces the ``model_dir`` mount.
    ``draft_dir`` (the campaign's ``model.draft_path``) is mounted read-only at ``/draft``,
    where the speculative knobs point the server; a launch that needs it and lacks it fails.
    ``gpus``: the GPUs the server holds (:mod:`bakeoff.serving.gpu_pinning`); None: the first
    ``tensor_parallel_size`` of them. Never all: a server pinned nowhere lands on GPU 0 beside
    every other cell, and NVML would meter GPUs it does not use.
    """
    spec = launch.backend.container
    if spec is None:
        raise LaunchError(f"backend {launch.backend.name!r} has no 'container' section")
    if not launch.argv:
        raise LaunchError(f"backend {launch.backend.name!r} renders an empty command")
    args = [
        "run", "-d",
        "--name", name,
        "--label", LABEL,
        "-p", f"127.0.0.1:{port}:{spec.container_port}",
    ]  # fmt: skip
    if model is not None:
        args += model.run_args()
    elif model_dir is not None:
        args += ["-v", f"{Path(model_dir).absolute()}:{spec.model_mount}:ro"]
    else:
        raise LaunchError(f"backend {launch.backend.name!r}: no model folder and no Hugging Face id to serve")
    if config_path is not None and launch.backend.config_file is not None:
        inside = f"{CONTAINER_CONFIG_DIR}/{launch.backend.config_file.filename}"
        args += ["-v", f"{Path(config_path).absolute()}:{inside}:ro"]
    needs_draft = draft_model_knob(launch.backend, launch.knobs)
    if needs_draft is not None and draft_dir is None:
        # Without the mount the server would fail minutes into its start on a missing /draft.
        raise LaunchError(
            f"backend {launch.backend.name!r}: {needs_draft}={launch.knobs[needs_draft]} reads a draft model "
            f"at {DRAFT_MOUNT}; set model.draft_path in the campaign"
        )
    if draft_dir is not None:
        args += ["-v", f"{Path(draft_dir).absolute()}:{DRAFT_MOUNT}:ro"]
    for key, value in sorted(launch.env.items()):
        args += ["-e", f"{key}={value}"]
    if spec.ipc_host:
        args.append("--ipc=host")
    if spec.shm_size:
        args += ["--shm-size", spec.shm_size]
    for ulimit in facts.accepted_ulimits(spec.ulimits) if facts is not None else spec.ulimits:
        args += ["--ulimit", ulimit]
    if spec.gpus:
        # docker's --gpus needs the NVIDIA container toolkit hook; podman uses CDI names.
        pinned = gpus or assign_gpus(gpu_count(launch.backend, launch.knobs), {})
        args += pinned.runtime_args(runtime)
    args += ["--entrypoint", launch.argv[0], spec.image, *launch.argv[1:]]
    return args


def leftover_containers(runtime: str, name_contains: str | None = None) -> list[str]:
    """IDs of containers (running or not) that bakeoff started and did not remove.

    ``name_contains`` narrows it to one backend's containers (their names hold its name).
    """
    filters = ["--filter", f"label={LABEL}"]
    if name_contains:
        filters += ["--filter", f"name={name_contains}"]
    proc = runtime_cli(runtime, "ps", "-a", *filters, "--format", "{{.ID}}")
    if proc.returncode != 0:
        raise LaunchError(f"`{runtime} ps` failed: {proc.stderr.strip()}")
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def container_running(runtime: str, ref: str) -> bool:
    proc = runtime_cli(runtime, "inspect", "--format", "{{.State.Running}}", ref)
    return proc.returncode == 0 and proc.stdout.strip() == "true"


CONTAINER_FILE = "server.container"


def reap_containers(root: Path) -> list[str]:
    """Remove containers recorded under ``root`` whose launcher never removed them (bakeoff killed).

    The container counterpart of :func:`bakeoff.serving.process.reap_leftovers`: a campaign resumed
    after a SIGKILL removes what the killed run left running.
    """
    removed = []
    for record in root.rglob(CONTAINER_FILE):
        runtime, _, name = record.read_text().strip().partition(" ")
        if runtime and name:
            remove_container(runtime, name)
            removed.append(name)
        record.unlink(missing_ok=True)
    return removed


def remove_container(runtime: str, ref: str, tries: int = 3) -> None:
    """``rm -f``, checked: a container still there after ``tries`` is an error naming it.

    A second Ctrl-C during removal still gets one more try. ``rm -f`` can fail while the
    runtime is busy (seen: podman left a stopped server behind, exit status unread, while a
    second test worker loaded both cores), so a failure is retried before it is reported.
    """
    # A benchmarked server holds nothing worth a graceful stop; kill it at once.
    args = ["rm", "-f", "-t", "2", ref] if runtime == "podman" else ["rm", "-f", ref]
    said = ""
    for attempt in range(tries):
        try:
            proc = runtime_cli(runtime, *args)
        except KeyboardInterrupt:
            runtime_cli(runtime, *args)
            raise
        if proc.returncode == 0 or not _container_exists(runtime, ref):
            return
        said = (proc.stderr or proc.stdout).strip()
        time.sleep(0.5 * (attempt + 1))
    raise LaunchError(f"{runtime} could not remove container {ref} ({said}); remove it: {runtime} rm -f {ref}")


def _container_exists(runtime: str, ref: str) -> bool:
    return runtime_cli(runtime, "inspect", "--format", "{{.Id}}", ref).returncode == 0


class _LogFollower:
    """Streams ``logs -f`` of a container into the run's server.log."""

    def __init__(self, runtime: str, ref: str, log_path: Path) -> None:
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [*runtime_command(runtime), "logs", "-f", ref],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for the follower to write what is left (it ends when the container stops)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


@contextlib.contextmanager
def run_container(
    launch: RenderedLaunch,
    *,
    port: int,
    served_model_name: str,
    model_dir: Path | None,
    run_dir: Path,
    runtime: str | None = None,
    model: ContainerModel | None = None,
    headers: Mapping[str, str] | None = None,
    draft_dir: Path | None = None,
    gpus: GpuAssignment | None = None,
) -> Iterator[ServerHandle]:
    """Run the launch's image on ``127.0.0.1:port`` until the block ends; always remove it.

    ``launch`` should come from :func:`render_container_launch`. Logs go to
    ``run_dir/server.log`` as the server writes them, so they are there on failure too.
    ``model`` serves a Hugging Face id instead of ``model_dir`` (see
    :func:`container_run_args`); ``headers`` (the API key) go with every health probe.
    """
    spec, runtime = _preflight(launch, runtime, port, model_dir, model)
    info = ensure_image(runtime, spec.image, build=spec.build)
    log_path, config_path = _prepare_run_dir(launch, run_dir)
    name = f"bakeoff-{launch.backend.name}-{port}-{uuid.uuid4().hex[:8]}"
    args = container_run_args(
        launch,
        runtime=runtime,
        port=port,
        model_dir=model_dir,
        name=name,
        config_path=config_path,
        model=model,
        draft_dir=draft_dir,
        facts=live_runtime_facts(runtime),
        gpus=gpus,
    )
    command_line = _record_launch(run_dir, log_path, runtime, name, args)
    follower: _LogFollower | None = None
    started = time.monotonic()
    try:
        container_id = _start_detached(runtime, args, name, spec.image)
        follower = _LogFollower(runtime, container_id, log_path)
        what = f"container {container_id}, image {spec.image}"
        _wait_container_ready(launch, port, runtime, container_id, what, follower, log_path, headers)
        yield ServerHandle(
            base_url=f"http://127.0.0.1:{port}",
            model=served_model_name,
            log_path=log_path,
            command_line=command_line,
            startup_s=time.monotonic() - started,
            kind="container",
            container_id=container_id,
            image=spec.image,
            image_digest=info.digest,
            build=BuildSteps(image_build_s=info.build_s),
            placement=Placement(gpus=gpus, runtime=runtime, container_name=name),
        )
    finally:
        # By name: it is known even when Ctrl-C came before `run -d` printed the ID.
        remove_container(runtime, name)
        (run_dir / CONTAINER_FILE).unlink(missing_ok=True)
        if follower is not None:
            follower.stop()


def _preflight(
    launch: RenderedLaunch, runtime: str | None, port: int, model_dir: Path | None, model: ContainerModel | None
) -> tuple[ContainerSpec, str]:
    """What must hold before an image is pulled: a container section, a runtime, a free port, the model."""
    spec = launch.backend.container
    if spec is None:
        raise LaunchError(f"backend {launch.backend.name!r} has no 'container' section")
    # A GPU server needs the runtime that can hand it the GPUs (docker with the NVIDIA runtime,
    # or podman with a CDI spec), not whichever is installed first.
    runtime = runtime or (find_gpu_runtime() if spec.gpus else find_runtime())
    if port_in_use(port):
        raise LaunchError(f"port {port} is already in use; pick another or stop what holds it")
    if model is None and (model_dir is None or not Path(model_dir).is_dir()):
        raise LaunchError(f"model folder {model_dir} does not exist")
    for folder in model.writable_dirs() if model is not None else []:
        folder.mkdir(parents=True, exist_ok=True)  # podman refuses to mount a missing folder
    return spec, runtime


def _prepare_run_dir(launch: RenderedLaunch, run_dir: Path) -> tuple[Path, Path | None]:
    """The server log's path and the rendered config file (written), if the backend takes one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = None
    if launch.config_text is not None and launch.backend.config_file is not None:
        config_path = run_dir / launch.backend.config_file.filename
        config_path.write_text(launch.config_text)
    return run_dir / "server.log", config_path


def _record_launch(run_dir: Path, log_path: Path, runtime: str, name: str, args: list[str]) -> str:
    """Leave the container's name for a reaper and its command line in the log; the command line."""
    # Written before the container exists: a bakeoff killed from here on leaves its name behind.
    atomic_write_bytes(run_dir / CONTAINER_FILE, f"{runtime} {name}\n".encode())
    command_line = shlex.join([*runtime_command(runtime), *args])
    with open(log_path, "ab") as log:
        log.write(f"$ {command_line}\n".encode())
    return command_line


def _start_detached(runtime: str, args: list[str], name: str, image: str) -> str:
    """``run -d`` the container; its short ID."""
    proc = runtime_cli(runtime, *args, timeout_s=300)
    if proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip()
        raise LaunchError(f"{runtime} could not start {image}: {detail}")
    return (proc.stdout.split() or [name])[-1][:12]


def _wait_container_ready(
    launch: RenderedLaunch,
    port: int,
    runtime: str,
    container_id: str,
    what: str,
    follower: _LogFollower,
    log_path: Path,
    headers: Mapping[str, str] | None,
) -> None:
    """Probe the health endpoint until it answers; a stopped container ends the wait with its log's tail."""

    def still_running() -> bool:
        if container_running(runtime, container_id):
            return True
        # Let the follower write the last lines before wait_ready quotes the tail.
        follower.drain()
        return False

    wait_ready(
        f"http://127.0.0.1:{port}{launch.backend.health.path}",
        timeout_s=launch.backend.health.timeout_s,
        interval_s=launch.backend.health.interval_s,
        still_running=still_running,
        log_path=log_path,
        what=f"{launch.backend.name} ({what})",
        headers=headers,
    )
