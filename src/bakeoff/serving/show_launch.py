"""``bakeoff backends show``: a backend's exact launch for a knob set, for review.

Renders what would run without running it: the container command (or local command),
the TensorRT-LLM options file and engine-build steps, which knobs differ from the
backend's defaults and what changing each costs (nothing, a restart, a rebuild), and the
framework's own warnings about the values chosen.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from bakeoff.backends.knobs import draft_model_knob
from bakeoff.backends.launch_render import RenderedLaunch, flag_text, render_engine_build, render_launch
from bakeoff.backends.spec import BackendSpec, KnobValue, load_backend
from bakeoff.errors import SpecError
from bakeoff.serving.container_runtime import runtime_command, shell_words, shown_runtime
from bakeoff.serving.containers import container_run_args, render_container_launch
from bakeoff.serving.engine_build import default_cache_dir, engine_cache_key, read_record

# Shown in place of model.draft_path when a speculative knob needs a draft model.
DRAFT_PLACEHOLDER_DIR = Path("/path/to/draft-model")


def _default_text(value: KnobValue | None) -> str:
    return "chosen by the backend" if value is None else flag_text(value)


def describe_launch(name: str, knobs: dict[str, KnobValue], *, model: str = "/model", port: int = 8000) -> str:
    """Human-readable launch for ``bakeoff backends show``: command, config, knob costs, notes.

    ``model`` is the model folder on the host (the container mounts it); ``port`` the host
    port. Container backends show the exact ``podman``/``docker run`` command.
    """
    backend = load_backend(name)
    served = Path(model).name or "model"
    lines = [f"backend: {backend.name} ({backend.display_name}) {backend.version}".rstrip()]
    build_lines: list[str] = []
    mounted = model
    if backend.engine_build is not None:
        steps = render_engine_build(
            backend,
            knobs,
            model="/model",
            checkpoint_dir="/work/checkpoint",
            engine_dir="/work/engine",
        )
        # The server mounts the built engine folder, not the checkpoint.
        mounted, built = _engine_folder(backend, knobs, model)
        build_lines += [
            "",
            f"engine build (image {backend.engine_build.image}; cached by model + baked knobs;",
            f"  {'already built' if built else 'not built yet'}: {mounted}):",
        ]
        build_lines += [f"  {i + 1}. {shlex.join(step)}" for i, step in enumerate(steps)]
    if backend.runtime == "container":
        launch, command = _container_command(backend, knobs, model=mounted, port=port, served=served)
    else:
        launch = render_launch(backend, knobs, model=model, served_model_name=served, port=port)
        env = [f"{k}={v}" for k, v in sorted(launch.env.items())]
        command = shlex.join(["env", *env, *launch.argv]) if env else launch.command_line
    lines += ["", "command:", f"  {command}", *build_lines]
    if launch.config_text is not None and backend.config_file is not None:
        lines += ["", f"{backend.config_file.filename} ({backend.config_file.flag}):"]
        lines += [f"  {line}" for line in launch.config_text.rstrip().splitlines()]
    lines += ["", "knobs:", *_knob_lines(backend, launch)]
    notes = [
        *backend.notes,
        *(f"{k}: {backend.knobs[k].note}" for k in launch.knobs if backend.knobs[k].note),
    ]
    if notes:
        lines += ["", "notes:", *(f"  - {note}" for note in notes)]
    if launch.warnings:
        lines += ["", "warnings:", *(f"  - {warning}" for warning in launch.warnings)]
    return "\n".join(lines) + "\n"


def _knob_lines(backend: BackendSpec, launch: RenderedLaunch) -> list[str]:
    """Every knob the command sets, the ones equal to the backend's default included.

    A knob set to its default value (``chunked_prefill=true`` where that is the default)
    still pins it in the command; leaving it out would read as "nothing was set".
    """
    if not launch.knobs:
        return ["  none set: all at the backend's defaults"]
    lines = []
    for knob, value in launch.knobs.items():
        spec = backend.knobs[knob]
        same = "" if knob in launch.non_default else ", the same value"
        lines.append(
            f"  {knob} = {flag_text(value)} (default: {_default_text(spec.default)}{same}): "
            f"changing it needs {spec.change_needs}"
        )
    return lines


def _engine_folder(backend: BackendSpec, knobs: dict[str, KnobValue], model: str) -> tuple[str, bool]:
    """Where the engine for this model and knob set is cached, and whether it is built."""
    try:
        key = engine_cache_key(Path(model), backend, knobs)
    except SpecError:
        # The key hashes the model's files; without the folder it cannot be known here.
        return str(default_cache_dir() / "<key>" / "engine"), False
    work = default_cache_dir() / key
    return str(work / "engine"), read_record(work) is not None


def _container_command(
    backend: BackendSpec, knobs: dict[str, KnobValue], *, model: str, port: int, served: str
) -> tuple[RenderedLaunch, str]:
    launch = render_container_launch(backend, knobs, served_model_name=served)
    runtime = shown_runtime()
    config = Path.cwd() / backend.config_file.filename if backend.config_file else None
    draft = DRAFT_PLACEHOLDER_DIR if draft_model_knob(backend, launch.knobs) else None
    args = container_run_args(
        launch,
        runtime=runtime,
        port=port,
        model_dir=Path(model),
        name=f"bakeoff-{backend.name}-{port}",
        config_path=config,
        draft_dir=draft,
    )
    return launch, shell_words([*runtime_command(runtime), *args])
