"""Tests of bakeoff.serving.containers: the rendered ``run`` command, and real podman lifecycles.

The podman tests use a throwaway image made in a second from the host's own ``sleep`` and
``false`` (plus the C library), so they need neither a registry nor a built engine image;
the one success-path test uses the debootstrap base image when it has been built.
"""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml

import prerequisites
from bakeoff.backends.spec import BACKENDS_DIR, BackendSpec, load_backend
from bakeoff.errors import LaunchError, RuntimeMissingError
from bakeoff.serving.container_runtime import find_runtime, runtime_command
from bakeoff.serving.containers import (
    CONTAINER_FILE,
    container_run_args,
    leftover_containers,
    reap_containers,
    render_container_launch,
    run_container,
)
from bakeoff.serving.gpu_pinning import GpuAssignment
from bakeoff.serving.handle import ServerHandle
from bakeoff.serving.images import image_fix_hint
from bakeoff.serving.process import free_port

REPO = BACKENDS_DIR.parent
TINY_IMAGE = "localhost/bakeoff/test-tiny:1"
BASE_IMAGE = "localhost/bakeoff/debian-base:bookworm"


def _spec(image: str, command: list[str], name: str = "throwaway", **overrides: Any) -> BackendSpec:
    data: dict[str, Any] = {
        "name": name,
        "display_name": "throwaway",
        "runtime": "container",
        "command": command,
        "container": {"image": image},
        "health": {"path": "/health", "timeout_s": 3, "interval_s": 0.2},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return BackendSpec.model_validate(data)


def _values(args: list[str], flag: str) -> list[str]:
    """Every value that follows ``flag`` in an argument list."""
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]


# --- container_run_args: pure ----------------------------------------------------------


def _vllm_args(runtime: str = "podman") -> list[str]:
    backend = load_backend("vllm-cpu-container")
    launch = render_container_launch(backend, {"max_num_seqs": 8}, served_model_name="tiny")
    return container_run_args(launch, runtime=runtime, port=18123, model_dir=Path("/models/tiny"), name="bk-1")


class FlakyRuntime:
    """A runtime CLI whose ``rm -f`` fails ``failures`` times while the container stays."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.present = True
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, runtime: str, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        self.calls.append(args)
        if args[0] == "rm":
            if self.failures:
                self.failures -= 1
                return subprocess.CompletedProcess(args, 125, "", "container state improper")
            self.present = False
            return subprocess.CompletedProcess(args, 0, "", "")
        return subprocess.CompletedProcess(args, 0 if self.present else 125, "", "")


def test_a_failed_removal_is_retried_and_one_that_keeps_failing_names_the_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bakeoff.serving import containers

    monkeypatch.setattr(containers.time, "sleep", lambda s: None)
    flaky = FlakyRuntime(failures=2)
    monkeypatch.setattr(containers, "runtime_cli", flaky)
    containers.remove_container("podman", "bakeoff-x")
    assert not flaky.present and [c[0] for c in flaky.calls].count("rm") == 3

    stuck = FlakyRuntime(failures=99)
    monkeypatch.setattr(containers, "runtime_cli", stuck)
    with pytest.raises(LaunchError, match=r"could not remove container bakeoff-x \(container state improper\); "
                       r"remove it: podman rm -f bakeoff-x"):  # fmt: skip
        containers.remove_container("podman", "bakeoff-x")
    assert stuck.present


def test_run_args_start_detached_with_name_and_label() -> None:
    args = _vllm_args()
    assert args[:2] == ["run", "-d"]
    assert _values(args, "--name") == ["bk-1"]
    assert _values(args, "--label") == ["bakeoff=1"]


def test_run_args_map_host_port_on_loopback_to_fixed_container_port() -> None:
    assert _values(_vllm_args(), "-p") == ["127.0.0.1:18123:8000"]


def test_run_args_mount_model_read_only_at_model_mount() -> None:
    assert _values(_vllm_args(), "-v") == ["/models/tiny:/model:ro"]


def _speculative_args(draft_dir: Path | None) -> list[str]:
    launch = render_container_launch(load_backend("vllm"), {"speculative": "eagle3"}, served_model_name="m")
    return container_run_args(
        launch, runtime="podman", port=18123, model_dir=Path("/models/m"), name="bk-2", draft_dir=draft_dir
    )


def test_run_args_mount_the_draft_model_read_only_where_speculative_knobs_look() -> None:
    args = _speculative_args(Path("/models/eagle3-head"))
    assert _values(args, "-v") == ["/models/m:/model:ro", "/models/eagle3-head:/draft:ro"]
    assert '"model":"/draft"' in args[-1]


def test_run_args_refuse_a_speculative_launch_without_its_draft_model() -> None:
    with pytest.raises(LaunchError, match=r"speculative=eagle3 reads a draft model at /draft; set model\.draft_path"):
        _speculative_args(None)
    # No speculative knob, no draft mount.
    assert not any(v.endswith(":/draft:ro") for v in _values(_vllm_args(), "-v"))


def test_run_args_pass_backend_env() -> None:
    env = _values(_vllm_args(), "-e")
    assert "VLLM_CPU_KVCACHE_SPACE=4" in env
    assert "VLLM_SERVER_DEV_MODE=1" in env


def test_run_args_shm_size_and_no_gpu_or_ipc_for_cpu_backend() -> None:
    args = _vllm_args()
    assert _values(args, "--shm-size") == ["4g"]
    assert "--ipc=host" not in args
    assert "--gpus" not in args
    assert "--device" not in args
    assert "--ulimit" not in args


def test_run_args_end_with_entrypoint_image_and_rendered_argv() -> None:
    args = _vllm_args()
    i = args.index("--entrypoint")
    assert args[i + 1] == "/opt/venv/bin/python"
    assert args[i + 2] == "localhost/bakeoff/vllm-cpu:0.32.0"
    tail = args[i + 3 :]
    assert tail[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _values(tail, "--model") == ["/model"]
    assert _values(tail, "--port") == ["8000"]
    assert _values(tail, "--host") == ["0.0.0.0"]
    assert _values(tail, "--served-model-name") == ["tiny"]
    assert _values(tail, "--max-num-seqs") == ["8"]


def _gpu_spec() -> BackendSpec:
    return _spec(
        "vllm/vllm-openai:v0.11.0",
        ["trtllm-serve", "{model}", "--port", "8000"],
        accelerator="gpu",
        container={
            "gpus": True,
            "ipc_host": True,
            "ulimits": ["memlock=-1", "stack=67108864"],
            "model_mount": "/models/m",
        },
        config_file={"flag": "--extra_llm_api_options", "filename": "options.yaml"},
        knobs={"max_num_seqs": {"type": "int", "default": 256, "config_key": "max_batch_size"}},
    )


@pytest.mark.parametrize(
    ("runtime", "pinned", "gpu_flags"),
    [
        # docker's --gpus value is CSV: a list of devices is quoted inside it (docker run --gpus reference).
        ("docker", ("2", "5"), ["--gpus", '"device=2,5"']),
        ("podman", ("2", "5"), ["--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=5"]),
        # Not told which: the first tensor_parallel_size GPUs, never all of them.
        ("docker", None, ["--gpus", "device=0"]),
        ("podman", None, ["--device", "nvidia.com/gpu=0"]),
    ],
)
def test_run_args_gpu_flags(runtime: str, pinned: tuple[str, ...] | None, gpu_flags: list[str]) -> None:
    launch = render_container_launch(_gpu_spec(), {"max_num_seqs": 4}, served_model_name="m")
    args = container_run_args(
        launch,
        runtime=runtime,
        port=9000,
        model_dir=Path("/srv/m"),
        name="g",
        config_path=Path("/runs/1/options.yaml"),
        gpus=GpuAssignment(pinned, "test") if pinned is not None else None,
    )
    i = args.index(gpu_flags[0])
    assert args[i : i + len(gpu_flags)] == gpu_flags
    assert not any(a.endswith("all") for a in args if a != "--ipc=host")
    other = "--device" if runtime == "docker" else "--gpus"
    assert other not in args
    assert "--ipc=host" in args
    assert _values(args, "--ulimit") == ["memlock=-1", "stack=67108864"]
    assert _values(args, "-v") == [
        "/srv/m:/models/m:ro",
        "/runs/1/options.yaml:/bakeoff/options.yaml:ro",
    ]
    # The config flag inside the container points at the mounted file, not the bare name.
    assert _values(args, "--extra_llm_api_options") == ["/bakeoff/options.yaml"]
    assert yaml.safe_load(launch.config_text or "") == {"max_batch_size": 4}


def test_backend_image_matches_build_script_tag() -> None:
    env = (REPO / "docker" / "vllm-cpu" / "image.env").read_text()
    tag = next(line.split("=", 1)[1] for line in env.splitlines() if line.startswith("TAG="))
    backend = load_backend("vllm-cpu-container")
    assert backend.container is not None
    assert backend.container.image == tag
    assert backend.container.build == "vllm-cpu"
    assert (REPO / "docker" / "vllm-cpu" / "Containerfile").is_file()


def test_image_fix_hint_builds_local_images_and_pulls_others() -> None:
    assert image_fix_hint("podman", "localhost/bakeoff/vllm-cpu:0.32.0") == ("scripts/build-images.sh vllm-cpu")
    assert image_fix_hint("podman", "anything:1", build="x") == "scripts/build-images.sh x"
    assert image_fix_hint("docker", "vllm/vllm-openai:v0.11.0") == "docker pull vllm/vllm-openai:v0.11.0"


def test_find_runtime_without_any_runtime_names_setup_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BAKEOFF_CONTAINER_RUNTIME", raising=False)
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(RuntimeMissingError, match=r"scripts/setup-podman\.sh"):
        find_runtime()


def test_find_runtime_rejects_unknown_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAKEOFF_CONTAINER_RUNTIME", "lxc")
    with pytest.raises(RuntimeMissingError, match="lxc"):
        find_runtime()


# --- real podman --------------------------------------------------------------------


@pytest.fixture
def _podman_installed() -> None:
    prerequisites.podman()


needs_podman = pytest.mark.usefixtures("_podman_installed")


def _podman(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*runtime_command("podman"), *args], input=stdin, capture_output=True, check=False)


def _tiny_rootfs_tar() -> bytes:
    """A tar of the host's sleep and false with the shared libraries they load."""
    binaries = [shutil.which("sleep"), shutil.which("false")]
    paths: set[str] = {b for b in binaries if b}
    for binary in list(paths):
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        paths.update(w for line in out.splitlines() for w in line.split() if w.startswith("/"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(paths):
            # Follow symlinks: the image gets the file's content at the path the loader asks for.
            tar.add(str(Path(path).resolve()), arcname=path.lstrip("/"))
    return buf.getvalue()


@pytest.fixture(scope="session")
def tiny_image() -> str:
    if _podman("image", "exists", TINY_IMAGE).returncode != 0:
        proc = _podman(
            "import",
            "--change",
            "ENV PATH=/usr/bin:/bin",
            "-",
            TINY_IMAGE,
            stdin=_tiny_rootfs_tar(),
        )
        assert proc.returncode == 0, proc.stderr.decode()
    return TINY_IMAGE


@pytest.fixture
def backend_name() -> Iterator[str]:
    """A backend name of this test alone; fails the test if a container of it is left behind.

    Unique, so other test runs sharing the machine's podman cannot confuse the check.
    """
    name = f"throwaway-{uuid.uuid4().hex[:8]}"
    yield name
    assert leftover_containers("podman", name_contains=name) == []


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    return path


def _run(
    spec: BackendSpec, model_dir: Path, run_dir: Path, port: int | None = None
) -> AbstractContextManager[ServerHandle]:
    launch = render_container_launch(spec, {}, served_model_name="m")
    return run_container(
        launch,
        port=port or free_port(),
        served_model_name="m",
        model_dir=model_dir,
        run_dir=run_dir,
        runtime="podman",
    )


@needs_podman
@pytest.mark.container
def test_missing_image_names_build_command(backend_name: str, model_dir: Path, tmp_path: Path) -> None:
    spec = _spec(
        "localhost/bakeoff/not-built:0",
        ["/bin/true"],
        backend_name,
        container={"build": "not-built"},
    )
    with pytest.raises(LaunchError) as err, _run(spec, model_dir, tmp_path / "run"):
        pass
    assert "localhost/bakeoff/not-built:0" in str(err.value)
    assert "scripts/build-images.sh not-built" in str(err.value)


@needs_podman
@pytest.mark.container
def test_container_exiting_during_startup_fails_fast_with_log(
    backend_name: str, tiny_image: str, model_dir: Path, tmp_path: Path
) -> None:
    spec = _spec(tiny_image, ["/usr/bin/sleep", "--bogus-option"], backend_name, health={"timeout_s": 60})
    with (
        pytest.raises(LaunchError, match="exited during startup") as err,
        _run(spec, model_dir, tmp_path / "run"),
    ):
        pass
    # sleep's own complaint reached server.log and the error message.
    assert "bogus" in str(err.value)
    assert "bogus" in (tmp_path / "run" / "server.log").read_text()


@needs_podman
@pytest.mark.container
def test_container_running_false_fails_fast(
    backend_name: str, tiny_image: str, model_dir: Path, tmp_path: Path
) -> None:
    spec = _spec(tiny_image, ["/usr/bin/false"], backend_name, health={"timeout_s": 60})
    with (
        pytest.raises(LaunchError, match="exited during startup"),
        _run(spec, model_dir, tmp_path / "run"),
    ):
        pass


@needs_podman
@pytest.mark.container
def test_readiness_timeout_removes_container(
    backend_name: str, tiny_image: str, model_dir: Path, tmp_path: Path
) -> None:
    spec = _spec(tiny_image, ["/usr/bin/sleep", "600"], backend_name, health={"timeout_s": 3})
    with (
        pytest.raises(LaunchError, match="not ready after 3 s"),
        _run(spec, model_dir, tmp_path / "run"),
    ):
        pass
    assert (tmp_path / "run" / "server.log").read_text().startswith("$ podman")


@needs_podman
@pytest.mark.container
def test_port_in_use_is_refused(backend_name: str, tiny_image: str, model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        spec = _spec(tiny_image, ["/usr/bin/sleep", "600"], backend_name)
        with (
            pytest.raises(LaunchError, match=f"port {port} is already in use"),
            _run(spec, model_dir, tmp_path / "run", port=port),
        ):
            pass


# A bakeoff killed mid-start: run_container's clean-up never runs, only the record it wrote first survives.
_KILLED_BAKEOFF = """\
import sys
from pathlib import Path

from bakeoff.backends.spec import BackendSpec
from bakeoff.serving.containers import render_container_launch, run_container

spec = BackendSpec.model_validate_json(sys.argv[1])
launch = render_container_launch(spec, {}, served_model_name="m")
with run_container(launch, port=int(sys.argv[2]), served_model_name="m", model_dir=Path(sys.argv[3]),
                   run_dir=Path(sys.argv[4]), runtime="podman"):
    pass
"""


@needs_podman
@pytest.mark.container
def test_the_container_of_a_killed_campaign_is_reaped_with_real_podman(
    backend_name: str, tiny_image: str, model_dir: Path, tmp_path: Path
) -> None:
    cells = tmp_path / "cells"
    run_dir = cells / "a__w"
    # Never ready (sleep serves nothing): the launcher waits, holding the container, until it is killed.
    spec = _spec(tiny_image, ["/usr/bin/sleep", "600"], backend_name, health={"timeout_s": 600})
    argv = [
        sys.executable,
        "-c",
        _KILLED_BAKEOFF,
        spec.model_dump_json(),
        str(free_port()),
        str(model_dir),
        str(run_dir),
    ]
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 60
        while not leftover_containers("podman", name_contains=backend_name):
            assert proc.poll() is None and time.monotonic() < deadline, "the container never started"
            time.sleep(0.2)
        proc.kill()  # SIGKILL: no finally, no rm -f
        proc.wait()
        assert leftover_containers("podman", name_contains=backend_name), "the kill should leave it running"
        (name,) = reap_containers(cells)  # what a resumed campaign does first
        assert name.startswith(f"bakeoff-{backend_name}-") and not (run_dir / CONTAINER_FILE).exists()
        assert leftover_containers("podman", name_contains=backend_name) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        reap_containers(cells)


@needs_podman
@pytest.mark.container
def test_ready_server_yields_handle_and_is_removed_after(backend_name: str, model_dir: Path, tmp_path: Path) -> None:
    prerequisites.image(BASE_IMAGE)
    (model_dir / "health").write_text("ok\n")
    # python3's http.server serves the model mount, so /health answers 200 from the file.
    command = ["python3", "-m", "http.server", "8000", "--directory", "{model}"]
    spec = _spec(BASE_IMAGE, command, backend_name, health={"timeout_s": 60})
    with _run(spec, model_dir, tmp_path / "run") as handle:
        assert handle.kind == "container"
        assert handle.image == BASE_IMAGE
        assert (handle.image_digest or "").startswith("sha256:")
        assert handle.container_id
        assert handle.startup_s > 0
        with urllib.request.urlopen(handle.base_url + "/health", timeout=5) as resp:
            assert resp.read() == b"ok\n"
        container_id = handle.container_id
    assert _podman("container", "exists", container_id).returncode != 0


def test_missing_registry_image_is_pulled_and_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bakeoff.serving.images import ensure_image, recorded_build_s

    # A stand-in CLI: `image inspect` fails until `pull` has run; no registry is reachable here.
    fake = tmp_path / "fakectl"
    fake.write_text(
        "#!/bin/bash\n"
        f'state="{tmp_path}/pulled"\n'
        'if [ "$1" = pull ]; then sleep 0.2; touch "$state"; exit 0; fi\n'
        'if [ "$1 $2" = "image inspect" ]; then\n'
        '  [ -f "$state" ] || exit 125\n'
        '  echo \'[{"Id": "abc", "RepoDigests": ["r/x@sha256:feed"]}]\'; exit 0\n'
        "fi\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(tmp_path / "cache"))
    info = ensure_image(str(fake), "vendor/server:1.0")
    assert info.present and info.digest == "sha256:feed"
    pulled_s = recorded_build_s("vendor/server:1.0")
    assert pulled_s is not None and pulled_s >= 0.2
    (tmp_path / "pulled").unlink()  # locally built images are never pulled, only named
    with pytest.raises(LaunchError, match=r"scripts/build-images.sh vllm-cpu"):
        ensure_image(str(fake), "localhost/bakeoff/vllm-cpu:9.9", build="vllm-cpu")
