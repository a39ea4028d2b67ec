"""How a cell's server comes up: one launcher per kind, chosen in one place.

A cell's server is started by exactly one of these launchers, each a context manager
that yields a ready :class:`~bakeoff.serving.process.ServerHandle` and the
:class:`~bakeoff.backends.launch_render.RenderedLaunch` behind it, and tears down what it started on
every exit path:

========== ===============================================================================
kind       what runs
========== ===============================================================================
process    the backend's command as a local process group (vLLM-CPU, llama.cpp)
container  the backend's image under podman or docker (the GPU frameworks, vLLM-CPU image)
rehearsal  the reference server in the backend's framework profile, standing in for the
           container; the real container command is still rendered and recorded, and the
           campaign's quality set is answered with planted answers
           (:mod:`bakeoff.serving.stand_in_quality`)
external   nothing: the server at ``url`` in the campaign (a hosted endpoint, a gateway)
========== ===============================================================================

:func:`launcher_kind` decides which; :data:`LAUNCHERS` maps a kind to its function and
:data:`bakeoff.serving.handle.SERVER_KINDS` to what the kind means around the start (launched
by bakeoff or not, a stand-in or not, a typical start-up), so a new kind is added in those two
dicts and nowhere else: callers ask :func:`server_kind` or the handle, never compare kind
strings. Nothing here measures: :mod:`bakeoff.campaign.execute` drives the load once a handle is
yielded.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from bakeoff.backends.knobs import model_file_choice
from bakeoff.backends.launch_render import RenderedLaunch, render_launch
from bakeoff.backends.spec import BackendSpec
from bakeoff.errors import LaunchError, ServerUnreachableError, SpecError
from bakeoff.host.gpu_checks import check_cuda_compat
from bakeoff.host.gpus import query_nvidia_smi
from bakeoff.measure.control import check_server
from bakeoff.models.gguf import conversion_seconds, convert_to_gguf, gguf_for_quantization, tensor_types
from bakeoff.models.model_source import ContainerModel, ModelSource
from bakeoff.models.quantized import SCHEMES as QUANTIZED_SCHEMES
from bakeoff.models.quantized import quantized_checkpoint
from bakeoff.models.quantized import weight_types as quantized_weight_types
from bakeoff.results.store import write_json
from bakeoff.serving.container_runtime import runtime_command, shell_words, shown_runtime
from bakeoff.serving.containers import container_run_args, render_container_launch, run_container
from bakeoff.serving.engine_build import build_engine
from bakeoff.serving.engine_env import interpreter
from bakeoff.serving.gpu_pinning import GpuAssignment, assign_gpus, gpu_count
from bakeoff.serving.handle import SERVER_KINDS, BuildSteps, LauncherKind, Placement, ServerHandle, ServerKind
from bakeoff.serving.process import free_port, run_local_process
from bakeoff.serving.stand_in_quality import (
    BROKEN_EVERY,
    CANNED_FILE,
    LOSSY_PROMPT_LOGPROB,
    PLANTED_FILE,
    PROMPT_LOGPROB,
    StandIn,
    canned_answers,
    lossy_settings,
)

if TYPE_CHECKING:
    from bakeoff.backends.server_config import ServerConfig

# The reference server's pace in a rehearsal: fast enough that a GPU campaign's levels
# finish in seconds, slow enough that every request streams many separate chunks.
REHEARSAL_TTFT_MS = 20.0
REHEARSAL_ITL_MS = 2.0
# With a reasoning_parser set, chat answers open with this many thinking tokens in the
# framework's reasoning field, so the rehearsal exercises the phase parsing too.
REHEARSAL_REASONING_TOKENS = 8
# With a speculative method set, each decode step accepts this share of its drafts (planted,
# bakeoff.ref.speculation), so the report's speculative table fills from the stand-in's counters.
REHEARSAL_DRAFT_ACCEPTANCE = 0.5


@dataclass(frozen=True)
class LaunchContext:
    """What every launcher needs to start one cell's server."""

    server: ServerConfig
    backend: BackendSpec
    source: ModelSource
    served_name: str
    run_dir: Path
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold the API key
    draft_dir: Path | None = None  # the campaign's model.draft_path, for speculative decoding
    port: int | None = None  # the host port to serve on (bakeoff serve --port); None: a free one
    stand_in: StandIn | None = None  # a rehearsal's quality answers and real checkpoint; None: no quality set
    # The GPUs the server holds; None: from CUDA_VISIBLE_DEVICES (Ray's share) or the first N (gpu_pinning).
    gpus: GpuAssignment | None = None

    def host_port(self) -> int:
        return self.port if self.port is not None else free_port()

    def gpu_assignment(self) -> GpuAssignment | None:
        """The GPUs a GPU server is pinned to (None for a CPU server)."""
        if self.backend.accelerator != "gpu":
            return None
        if self.gpus is not None:
            return self.gpus
        count = gpu_count(self.backend, self.server.knobs)
        return assign_gpus(count, os.environ, label=f"server {self.server.label!r}")


Started = Iterator[tuple[ServerHandle, RenderedLaunch]]
Launcher = Callable[[LaunchContext], contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]]


def launcher_kind(backend: BackendSpec, server: ServerConfig) -> LauncherKind:
    """Which launcher starts this server; a rehearsal's (``launcher: rehearsal``) replaces only GPU containers."""
    if server.url:
        return "external"
    if server.rehearsed and backend.accelerator == "gpu":
        if backend.rehearsal_profile is None:
            raise SpecError(f"backend {backend.name!r} has no rehearsal_profile; it cannot be rehearsed")
        return "rehearsal"
    return "container" if backend.runtime == "container" else "process"


def server_kind(backend: BackendSpec, server: ServerConfig) -> ServerKind:
    """What this server's launcher kind means around its start (:class:`~bakeoff.serving.handle.ServerKind`)."""
    return SERVER_KINDS[launcher_kind(backend, server)]


@contextlib.contextmanager
def _process(ctx: LaunchContext) -> Started:
    backend = ctx.backend
    model_dir = ctx.source.local_dir_or_raise()
    model_arg = str(model_dir)
    convert_s = None
    draft = {"draft_model": str(ctx.draft_dir)} if ctx.draft_dir is not None else {}
    weights: dict[str, int] | None = None
    if backend.model_format == "gguf":
        gguf = gguf_for_quantization(model_dir, model_file_choice(backend, ctx.server.knobs))
        model_arg, convert_s = str(gguf), conversion_seconds(gguf)
        weights = tensor_types(gguf)
        if ctx.draft_dir is not None:
            # A draft for llama.cpp is a GGUF too; the draft runs in bf16 whatever the target's type.
            draft = {"draft_model": str(convert_to_gguf(ctx.draft_dir))}
    elif (scheme := model_file_choice(backend, ctx.server.knobs)) in QUANTIZED_SCHEMES:
        # vLLM reads 4-bit weights from a checkpoint quantized beforehand (GPTQ, cached).
        checkpoint = quantized_checkpoint(model_dir, str(scheme))
        model_arg, weights = str(checkpoint), quantized_weight_types(checkpoint)
    port = ctx.host_port()
    launch = render_launch(
        backend,
        ctx.server.knobs,
        model=model_arg,
        served_model_name=ctx.served_name,
        port=port,
        python=interpreter(backend),
        **draft,
    )
    with run_local_process(
        launch, port=port, served_model_name=ctx.served_name, run_dir=ctx.run_dir, headers=ctx.headers
    ) as handle:
        # The GGUF conversion is llama.cpp's build step.
        step = "GGUF conversion" if convert_s is not None else None
        handle.build = replace(handle.build, engine_build_s=convert_s, engine_build_step=step)
        handle.weight_types = weights
        yield handle, launch


def _require_image(backend: BackendSpec) -> None:
    assert backend.container is not None
    if "${" in backend.container.image:
        raise LaunchError(
            f"{backend.name}: image {backend.container.image} names an unset variable; "
            "export it (e.g. NGC_REGISTRY=<NVIDIA's container registry host>) and retry"
        )


@contextlib.contextmanager
def _container(ctx: LaunchContext) -> Started:
    backend = ctx.backend
    assert backend.container is not None
    _require_image(backend)
    if backend.accelerator == "gpu":
        # Before any pull: an image newer than the driver's CUDA fails only after minutes.
        check_cuda_compat(backend, query_nvidia_smi())
    gpus = ctx.gpu_assignment()
    source, engine_s, engine_cached = ctx.source, None, None
    if backend.engine_build is not None:
        # The engine flow serves a prebuilt engine: build (or reuse) it first, timed.
        engine = build_engine(source.local_dir_or_raise(), backend, ctx.server.knobs, gpus=gpus)
        source, engine_s, engine_cached = ModelSource(hf_id=None, local_dir=engine.path), engine.seconds, engine.cached
    model = source.container_mount(backend.container.model_mount)
    launch = render_container_launch(
        backend, ctx.server.knobs, served_model_name=ctx.served_name, model_arg=model.model_arg
    )
    with run_container(
        launch,
        port=ctx.host_port(),
        served_model_name=ctx.served_name,
        model_dir=None,
        run_dir=ctx.run_dir,
        model=model,
        headers=ctx.headers,
        draft_dir=ctx.draft_dir,
        gpus=gpus,
    ) as handle:
        step = "trtllm-build" if engine_s is not None else None
        handle.build = replace(
            handle.build, engine_build_s=engine_s, engine_build_cached=engine_cached, engine_build_step=step
        )
        yield handle, launch


def rehearsal_argv(
    profile: str,
    *,
    port: int,
    served_name: str,
    prefix_caching: bool = True,
    reasoning: bool = False,
    draft_tokens: int = 0,
    canned: Path | None = None,
    prompt_logprob: float = PROMPT_LOGPROB,
    startup_log: bool = False,
) -> list[str]:
    """The reference server in one framework's profile, at the rehearsal's pace.

    Of the knobs, only ``prefix_caching`` (hits or none), ``reasoning_parser`` (thinking in
    its own field or not) and ``speculative`` (``draft_tokens`` a step, several tokens a
    chunk, the framework's draft counters) change what the wire shows, so the stand-in
    honours those; the lossy ones (quantized weights or KV cache) change what it answers:
    ``canned`` (the quality set's answers, some planted wrong) and ``prompt_logprob``
    (:mod:`bakeoff.serving.stand_in_quality`). Every other knob is rendered into the recorded
    command only. ``startup_log``: the profile's start-up log lines (TensorRT-LLM's PyTorch-flow
    build markers, read into the effort record as on a GPU host).
    """
    extra = ["--reasoning-tokens", str(REHEARSAL_REASONING_TOKENS)] if reasoning else []
    if draft_tokens:
        extra += ["--spec-tokens", str(draft_tokens), "--spec-accept", str(REHEARSAL_DRAFT_ACCEPTANCE)]
    if canned is not None:
        extra += ["--canned", str(canned)]
    if startup_log:
        extra.append("--startup-log")
    return [
        sys.executable, "-m", "bakeoff.ref.server",
        "--profile", profile,
        "--port", str(port),
        "--model", served_name,
        "--ttft-ms", str(REHEARSAL_TTFT_MS),
        "--itl-ms", str(REHEARSAL_ITL_MS),
        "--prefix-cache" if prefix_caching else "--no-prefix-cache",
        "--prompt-logprob", str(prompt_logprob),
        *extra,
    ]  # fmt: skip


def rehearsal_draft_tokens(launch: RenderedLaunch) -> int:
    """Draft tokens a step the stand-in proposes: the server's ``num_speculative_tokens`` when it
    speculates, else 0."""
    knobs = launch.effective_knobs
    if knobs.get("speculative") in (None, "none"):
        return 0
    count = knobs.get("num_speculative_tokens")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def rehearsed_container_command(
    launch: RenderedLaunch,
    model: ContainerModel,
    *,
    port: int,
    draft_dir: Path | None = None,
    config_path: Path | None = None,
    name: str | None = None,
    gpus: GpuAssignment | None = None,
) -> str:
    """The exact container command a GPU host would execute for this launch (never run here).

    The runtime is the one ``backends show`` names (:func:`shown_runtime`); ``config_path`` is
    where the rendered options file was written (a rehearsal writes it into its run folder).
    """
    runtime = shown_runtime()
    args = container_run_args(
        launch,
        runtime=runtime,
        port=port,
        model_dir=None,
        name=name or f"bakeoff-{launch.backend.name}",
        config_path=config_path,
        model=model,
        draft_dir=draft_dir,
        gpus=gpus,
    )
    return shell_words([*runtime_command(runtime), *args])


def _plant_quality(ctx: LaunchContext, launch: RenderedLaunch) -> tuple[Path | None, float]:
    """Write the stand-in's canned answers and the record of what it plants; return (canned file, prompt logprob).

    The checkpoint judged is the stand-in's real one when the campaign names it, else the
    launch's own model (``bakeoff serve --rehearse``, a single launch in a test).
    """
    stand_in = ctx.stand_in or StandIn(checkpoint=str(ctx.source.local_dir or ctx.source.hf_id or "") or None)
    lossy = lossy_settings(launch.effective_knobs, stand_in.checkpoint)
    canned, broken = canned_answers(stand_in.answers, lossy=bool(lossy))
    path = ctx.run_dir / CANNED_FILE if stand_in.answers else None
    if path is not None:
        write_json(path, canned)
    logprob = LOSSY_PROMPT_LOGPROB if lossy else PROMPT_LOGPROB
    planted = {"lossy": lossy, "broken_every": BROKEN_EVERY, "broken_items": broken, "prompt_logprob": logprob}
    write_json(ctx.run_dir / PLANTED_FILE, {**planted, "canned": path.name if path is not None else None})
    return path, logprob


@contextlib.contextmanager
def _rehearsal(ctx: LaunchContext) -> Started:
    """The reference server in the framework's wire profile instead of its GPU container.

    Everything bakeoff itself does stays real: the container launch is rendered (and its
    config file written) exactly as for a GPU host, the health probe, metric scrapes and
    cache resets go to the backend's own paths, and the handle says ``rehearsal``. With a
    quality set (``ctx.stand_in``) the stand-in answers it from a canned file written into
    the run folder, wrong on a planted share of the items where the launch is lossy; what it
    planted is recorded beside it (:mod:`bakeoff.serving.stand_in_quality`).
    """
    backend = ctx.backend
    assert backend.rehearsal_profile is not None and backend.container is not None
    model = ctx.source.container_mount(backend.container.model_mount)
    launch = render_container_launch(
        backend, ctx.server.knobs, served_model_name=ctx.served_name, model_arg=model.model_arg
    )
    port = ctx.host_port()
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    config = None
    if launch.config_text is not None and backend.config_file is not None:
        config = ctx.run_dir / f"rehearsed-{backend.config_file.filename}"
        config.write_text(launch.config_text)
    gpus = ctx.gpu_assignment()
    command = rehearsed_container_command(
        launch, model, port=port, draft_dir=ctx.draft_dir, config_path=config, gpus=gpus
    )
    prefix_caching = launch.knobs.get("prefix_caching", True) is not False
    reasoning = launch.knobs.get("reasoning_parser") not in (None, "none")
    canned, logprob = _plant_quality(ctx, launch)
    argv = rehearsal_argv(
        backend.rehearsal_profile,
        port=port,
        served_name=ctx.served_name,
        prefix_caching=prefix_caching,
        reasoning=reasoning,
        draft_tokens=rehearsal_draft_tokens(launch),
        canned=canned,
        prompt_logprob=logprob,
        # A flow that builds at start logs its build (TensorRT-LLM's PyTorch flow); an engine flow built before.
        startup_log=backend.engine_build is None,
    )
    stand_in = RenderedLaunch(backend, argv, {}, None, launch.knobs, launch.non_default)
    with run_local_process(
        stand_in, port=port, served_model_name=ctx.served_name, run_dir=ctx.run_dir, headers=ctx.headers
    ) as handle:
        # The engine flow's build is rendered (gpu-host steps), never run here.
        step = "trtllm-build: not run in a rehearsal" if backend.engine_build is not None else None
        handle.build = BuildSteps(engine_build_step=step)
        handle.placement = Placement(gpus=gpus)
        handle.kind = "rehearsal"
        handle.command_line = command
        handle.image = backend.container.image if backend.container else None
        yield handle, launch


@contextlib.contextmanager
def _external(ctx: LaunchContext) -> Started:
    """A server bakeoff does not launch: check it answers and serves the model, then use it."""
    url = str(ctx.server.url).rstrip("/")
    try:
        check_server(url, ctx.served_name, headers=dict(ctx.headers))
    except ServerUnreachableError as exc:
        raise LaunchError(f"server {ctx.server.label!r} (url {url}): {exc}") from exc
    launch = RenderedLaunch(ctx.backend, [], {}, None, dict(ctx.server.knobs), {})
    handle = ServerHandle(
        base_url=url,
        model=ctx.served_name,
        log_path=ctx.run_dir / "server.log",
        command_line=f"(external server at {url}; not launched by bakeoff)",
        startup_s=0.0,
        kind="external",
    )
    yield handle, launch


LAUNCHERS: dict[LauncherKind, Launcher] = {
    "process": _process,
    "container": _container,
    "rehearsal": _rehearsal,
    "external": _external,
}


def start_server(ctx: LaunchContext) -> contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]:
    """Start ``ctx``'s server with the launcher its kind needs."""
    return LAUNCHERS[launcher_kind(ctx.backend, ctx.server)](ctx)
