"""TensorRT-LLM's engine build as its own timed, cached step.

The engine flow (``backends/trtllm-engine.yaml``) compiles the checkpoint into a TensorRT
engine before anything is served. That build takes minutes, so it is timed on its own
(reports count it as engineering effort, apart from server startup) and cached: an engine
is reused whenever the model and every knob baked into it are the same.

Layout of the cache, shared with ``docker/trtllm/build-engine.sh``::

    <cache_dir>/<key>/engine/      the engine folder, served as the model folder
    <cache_dir>/<key>/build.json   written last, only after every step succeeded

The steps run in the backend's ``engine_build.image`` with the checkpoint mounted
read-only at ``/model`` and ``<cache_dir>/<key>`` at ``/work``. Commands go through a
``run`` callable so the caching and rendering can be tested without a GPU.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bakeoff.backends.launch_render import baked_knobs, render_engine_build
from bakeoff.backends.spec import BackendSpec, KnobValue
from bakeoff.console import working
from bakeoff.errors import LaunchError, SpecError
from bakeoff.paths import user_cache_dir
from bakeoff.serving.container_runtime import find_runtime, runtime_command
from bakeoff.serving.gpu_pinning import GpuAssignment, assign_gpus
from bakeoff.serving.process import log_tail

# v2: engines converted in float16 (v1 engines were bfloat16 and must not be reused as float16).
KEY_VERSION = "bakeoff-engine-key v2"
MODEL_MOUNT = "/model"
WORK_MOUNT = "/work"
RECORD = "build.json"
# Weights are fingerprinted by their first and last MiB: hashing a 16 GB checkpoint in
# full on every cell would cost more than the check is worth, and random or fine-tuned
# weights already differ in those bytes.
_SAMPLE_BYTES = 1 << 20
_SMALL_FILE = 16 << 20
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

# (argv, log file) -> exit status
StepRunner = Callable[[list[str], Path], int]


@dataclass(frozen=True)
class EngineBuild:
    """A built (or cached) engine and what it took."""

    path: Path  # engine folder on the host: mount it as the model folder
    seconds: float  # build time; for a cache hit, the time the original build took
    cached: bool
    key: str


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_line(path: Path) -> str:
    size = path.stat().st_size
    if size <= _SMALL_FILE and not path.name.endswith(_WEIGHT_SUFFIXES):
        return f"file {path.name} {_sha256_bytes(path.read_bytes())}"
    with path.open("rb") as handle:
        head = handle.read(_SAMPLE_BYTES)
        handle.seek(max(0, size - _SAMPLE_BYTES))
        tail = handle.read(_SAMPLE_BYTES)
    return f"sample {path.name} {size} {_sha256_bytes(head)} {_sha256_bytes(tail)}"


def _knob_text(value: KnobValue | None) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def engine_key_manifest(model_dir: Path, backend: BackendSpec, knobs: dict[str, KnobValue]) -> str:
    """The text the cache key hashes: builder image, model files, baked knob values.

    Runtime knobs are left out on purpose: changing them restarts the server on the same
    engine. The builder image is in because an engine runs only on the TensorRT version
    that built it.
    """
    if backend.engine_build is None:
        raise SpecError(f"backend {backend.name!r} has no engine build")
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise SpecError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    lines = [KEY_VERSION, f"image {backend.engine_build.image}"]
    files = sorted((p for p in model_dir.iterdir() if p.is_file()), key=lambda p: p.name)
    lines += [_file_line(p) for p in files]
    baked = baked_knobs(backend, knobs)
    lines += [f"knob {name}={_knob_text(baked[name])}" for name in sorted(baked)]
    return "\n".join(lines) + "\n"


def engine_cache_key(model_dir: Path, backend: BackendSpec, knobs: dict[str, KnobValue]) -> str:
    """Cache key of the engine for this model and knob set: 16 hex digits."""
    return _sha256_bytes(engine_key_manifest(model_dir, backend, knobs).encode())[:16]


def default_cache_dir() -> Path:
    """``engines/`` in the user cache folder (see :func:`bakeoff.paths.user_cache_dir`)."""
    return user_cache_dir() / "engines"


def engine_step_args(
    backend: BackendSpec,
    step: list[str],
    *,
    runtime: str,
    model_dir: Path,
    work_dir: Path,
    gpus: GpuAssignment | None = None,
) -> list[str]:
    """``run --rm ...`` arguments (after the runtime command) for one build step. Pure.

    ``gpus``: the cell's GPUs (the build runs where its server will); None: GPU 0.
    """
    if backend.engine_build is None:
        raise SpecError(f"backend {backend.name!r} has no engine build")
    args = [
        "run", "--rm",
        "-v", f"{Path(model_dir).resolve()}:{MODEL_MOUNT}:ro",
        "-v", f"{Path(work_dir).resolve()}:{WORK_MOUNT}",
    ]  # fmt: skip
    spec = backend.container
    if spec is not None:
        # The build runs the same MPI/NCCL stack as the server: same shm and ulimit needs.
        if spec.ipc_host:
            args.append("--ipc=host")
        for ulimit in spec.ulimits:
            args += ["--ulimit", ulimit]
    # Tactic selection in trtllm-build runs kernels: the build needs the GPU too.
    args += (gpus or assign_gpus(1, {})).runtime_args(runtime)
    args += ["--entrypoint", step[0], backend.engine_build.image, *step[1:]]
    return args


def run_logged(argv: list[str], log_path: Path) -> int:
    """Run one command, appending its output to ``log_path``; its exit status."""
    with log_path.open("ab") as log, working(f"engine build: {Path(argv[-1]).name if argv else ''}"):
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    return proc.returncode


def read_record(work_dir: Path) -> dict[str, object] | None:
    """The build record of a finished build, or None when the build never completed."""
    try:
        record = json.loads((work_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not (work_dir / "engine" / "config.json").is_file():
        return None
    return record


def build_engine(
    model_dir: Path,
    backend: BackendSpec,
    knobs: dict[str, KnobValue],
    *,
    cache_dir: Path | None = None,
    run: StepRunner = run_logged,
    runtime: str | None = None,
    gpus: GpuAssignment | None = None,
) -> EngineBuild:
    """Build the engine for this model and knob set, or reuse the cached one.

    Every step runs in the builder image; a failing step raises :class:`LaunchError`
    quoting the end of ``<cache_dir>/<key>/build.log``. The record is written only after
    the last step, so an interrupted build is redone, never reused.
    """
    if backend.engine_build is None:
        raise SpecError(f"backend {backend.name!r} has no engine build")
    key = engine_cache_key(model_dir, backend, knobs)
    work_dir = (cache_dir or default_cache_dir()) / key
    engine_dir = work_dir / "engine"
    record = read_record(work_dir)
    if record is not None:
        seconds = record.get("seconds")
        recorded = float(seconds) if isinstance(seconds, int | float) else 0.0
        return EngineBuild(path=engine_dir, seconds=recorded, cached=True, key=key)

    runtime = runtime or find_runtime()
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / "build.log"
    steps = render_engine_build(
        backend,
        knobs,
        model=MODEL_MOUNT,
        checkpoint_dir=f"{WORK_MOUNT}/checkpoint",
        engine_dir=f"{WORK_MOUNT}/engine",
    )
    if any(work_dir.joinpath(d).exists() for d in ("engine", "checkpoint")):
        # Leftovers of an interrupted build belong to the container's user (root under
        # rootful podman): remove them from inside a container too.
        steps.insert(0, ["rm", "-rf", f"{WORK_MOUNT}/engine", f"{WORK_MOUNT}/checkpoint"])
    started = time.monotonic()
    for number, step in enumerate(steps, start=1):
        argv = [
            *runtime_command(runtime),
            *engine_step_args(backend, step, runtime=runtime, model_dir=model_dir, work_dir=work_dir, gpus=gpus),
        ]
        status = run(argv, log_path)
        if status != 0:
            raise LaunchError(
                f"engine build for {backend.name} failed at step {number}/{len(steps)} "
                f"({step[0]}, exit status {status}); log: {log_path}\n{log_tail(log_path)}"
            )
    seconds = time.monotonic() - started
    if not (engine_dir / "config.json").is_file():
        raise LaunchError(f"engine build for {backend.name} finished but left no engine in {engine_dir}")
    (work_dir / RECORD).write_text(
        json.dumps(
            {"key": key, "seconds": seconds, "image": backend.engine_build.image, "steps": steps},
            indent=2,
        )
    )
    return EngineBuild(path=engine_dir, seconds=seconds, cached=False, key=key)
