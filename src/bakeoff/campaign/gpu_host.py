"""What to do on the GPU host after a rehearsal: images, environment, commands, pre-flight, the campaign.

A rehearsal (:mod:`bakeoff.campaign.rehearsal`) proves a GPU campaign's path on a machine
without a GPU; this module turns the *original* campaign (its real model, not the rehearsal's
tiny stand-in) into the steps that run it for real:

1. the environment each server needs: variables its image names (``${NGC_REGISTRY}``),
   ``HF_TOKEN`` for a Hugging Face id, API-key variables, the model folders that must exist;
2. the pre-flight: ``nvidia-smi`` against the images' CUDA, ``bakeoff doctor``, ``bakeoff campaign validate``;
3. the images to pull;
4. each server's exact container command with the user's values (model, knobs, served
   name; the options file written beside the rehearsal), what the campaign itself runs;
5. the campaign command.

:func:`unset_variables` is also what ``campaign validate`` and ``campaign run`` warn with.
The steps are rendered for the console (:meth:`GpuHostSteps.text`) and the report
(:meth:`GpuHostSteps.markdown`), both from one list.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from bakeoff.backends.kv_pool import apply_kv_pool, kv_pool_settings
from bakeoff.backends.spec import BackendSpec, load_backend
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.models.model_source import HF_SECRET_ENV, ModelSource
from bakeoff.paths import models_dir
from bakeoff.serving.container_runtime import shell_words, shown_runtime
from bakeoff.serving.containers import render_container_launch
from bakeoff.serving.images import image_with_tag
from bakeoff.serving.launchers import rehearsed_container_command

_VARIABLE = re.compile(r"\$\{(\w+)\}")
# Where a rehearsal writes the options files its GPU-host commands mount.
GPU_HOST_DIR = "gpu-host"


@dataclass
class Step:
    title: str
    notes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)


@dataclass
class GpuHostSteps:
    """The numbered steps; rendered as plain text or as markdown from the same list."""

    steps: list[Step]

    def text(self, tag: str = "") -> str:
        lines = [f"{tag} On the GPU host (what this rehearsal stood in for):".lstrip()]
        for i, step in enumerate(self.steps, 1):
            lines.append(f"  {i}. {step.title}")
            lines += [f"     {note}" for note in step.notes]
            lines += [f"       {command}" for command in step.commands]
        return "\n".join(lines)

    def markdown(self) -> str:
        parts = []
        for i, step in enumerate(self.steps, 1):
            block = [f"{i}. **{step.title}**", *(f"   {note}" for note in step.notes)]
            if step.commands:
                block += ["", "   ```bash", *(f"   {c}" for c in step.commands), "   ```"]
            parts.append("\n".join(block))
        return "\n\n".join(parts)


def _image(backend: BackendSpec, tag: str | None) -> str:
    assert backend.container is not None
    return image_with_tag(backend.container.image, tag) if tag else backend.container.image


def unset_variables(spec: CampaignSpec) -> dict[str, list[str]]:
    """Variable -> the servers whose image names it while it is unset here (``${NGC_REGISTRY}``)."""
    found: dict[str, list[str]] = {}
    for server in spec.servers:
        backend = load_backend(server.backend)
        if backend.container is None or server.url:
            continue
        for name in _VARIABLE.findall(_image(backend, server.image_tag)):
            found.setdefault(name, []).append(server.label)
    return found


def unset_warnings(spec: CampaignSpec) -> list[str]:
    """One warning per unset variable an image needs (validate and run print them)."""
    return [
        f"warning: {name} is not set, and the image of {', '.join(labels)} names it (${{{name}}}); "
        f"export {name} (for NGC images: NVIDIA's container registry host) before running on the GPU host"
        for name, labels in unset_variables(spec).items()
    ]


def _model_source(spec: CampaignSpec, model_path: Path | None) -> ModelSource:
    """The model as the GPU host serves it: a server's own packaging, the campaign's folder or id."""
    if model_path is not None:
        return ModelSource(hf_id=None, local_dir=model_path)
    model = spec.model
    if model.hf_id is not None:
        return ModelSource(hf_id=model.hf_id, local_dir=None)
    return ModelSource(hf_id=None, local_dir=model.path or models_dir() / str(model.preset))


def gpu_host_steps(
    spec: CampaignSpec, campaign_file: Path, out_dir: Path, bakeoff_command: str = "campaign run"
) -> GpuHostSteps:
    """The steps that run ``spec`` (the original, not the rehearsal's copy) on a GPU host.

    ``bakeoff_command``: the command the rehearsal stood in for (``campaign run``, ``tune``).
    """
    servers = [(s, load_backend(s.backend)) for s in spec.servers if not s.url]
    if spec.kv_pool is not None:  # the commands carry each framework's value for the one KV-pool intent
        sized = apply_kv_pool(spec.kv_pool, [(s.label, b, dict(s.knobs)) for s, b in servers])
        servers = [(s.model_copy(update={"knobs": k}), b) for (s, b), k in zip(servers, sized, strict=True)]
    containers = [(s, b) for s, b in servers if b.container is not None]
    env = Step("Set the environment each server needs")
    for name, labels in unset_variables(spec).items():
        env.commands.append(f"export {name}=...   # unset here; the image of {', '.join(labels)} names it")
    for name in sorted({v for s, b in containers for v in _VARIABLE.findall(b.container.image if b.container else "")}):
        if os.environ.get(name):
            env.notes.append(f"{name} is {os.environ[name]} here (it names an image); export the same there.")
    if spec.model.hf_id is not None:
        secrets = " or ".join(HF_SECRET_ENV)
        env.commands.append(f"export HF_TOKEN=...   # {spec.model.hf_id}, if gated: passed by name, never written")
        env.notes.append(f"The servers mount your Hugging Face cache (HF_HOME) and get {secrets} by name.")
        env.notes.append(f"Fetch the tokenizer first: huggingface-cli download {spec.model.hf_id} tokenizer.json")
    folders = [(spec.model.path, "model.path")] + [(s.model_path, f"{s.label}'s model_path") for s in spec.servers]
    folders.append((spec.model.draft_path, "model.draft_path"))
    for folder, what in folders:
        if folder is not None:
            env.notes.append(f"{what}: {folder} must exist on the GPU host (mounted read-only).")
    for server, _ in servers:
        if server.api_key_env:
            env.commands.append(f"export {server.api_key_env}=...   # {server.label}'s API key")
    if not env.notes and not env.commands:
        env.notes.append("Nothing beyond what this machine has: no registry variable, token or API key is needed.")

    # As the user would type it from the checkout (a shipped campaign resolves to an absolute path).
    shown = campaign_file.relative_to(Path.cwd()) if campaign_file.is_relative_to(Path.cwd()) else campaign_file
    file = shlex.quote(str(shown))
    cudas = sorted({b.container.cuda_major for _, b in containers if b.container and b.container.cuda_major})
    cuda = f" (CUDA Version {cudas[-1]}.0 or newer: the images are CUDA {'/'.join(map(str, cudas))} builds)"
    preflight = Step(
        "Pre-flight",
        notes=[
            f"nvidia-smi: the driver's CUDA version{cuda if cudas else ''}; bakeoff refuses a mismatch before pulling.",
            "bakeoff doctor checks the runtime, driver, GPUs, disk, model folders and image names there "
            "(campaign run runs it first, before any pull);",
            "campaign validate on the GPU host also checks the model folders this machine could not;",
            "campaign preflight parses each server's exact launch with its framework's own parser, in its image.",
        ],
        commands=[
            "nvidia-smi",
            f"bakeoff doctor {file}",
            f"bakeoff campaign validate {file}",
            f"bakeoff campaign preflight {file}",
        ],
    )
    runtime = shown_runtime()
    images = sorted({_image(b, s.image_tag) for s, b in containers})
    pull = Step(
        "Pull the images (10-30 GB each; bakeoff records the digest each run used)",
        notes=[f"bakeoff picks podman, else docker ({runtime} here); BAKEOFF_CONTAINER_RUNTIME chooses."],
        commands=[shell_words([runtime, "pull", image]) for image in images],
    )
    by_hand = Step("What the campaign runs, server by server (to try one by hand; the campaign starts them itself)")
    if spec.kv_pool is not None:
        settings = kv_pool_settings(spec.kv_pool, [(s.label, b) for s, b in servers])
        by_hand.notes.append(
            f"kv_pool: {spec.kv_pool.text()}; each framework's own value: " + "; ".join(x.text() for x in settings)
        )
    for server, backend in containers:
        assert backend.container is not None
        model = _model_source(spec, server.model_path).container_mount(backend.container.model_mount)
        launch = render_container_launch(
            backend, dict(server.knobs), served_model_name=spec.model.served_name, model_arg=model.model_arg
        )
        config = None
        if launch.config_text is not None and backend.config_file is not None:
            config = out_dir / GPU_HOST_DIR / server.label / backend.config_file.filename
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(launch.config_text)
            by_hand.notes.append(
                f"{server.label}: copy {config} to the GPU host (the options file its command mounts; "
                "the campaign writes its own)."
            )
        if backend.engine_build is not None:
            by_hand.notes.append(
                f"{server.label}: bakeoff builds its engine first (bakeoff backends show {backend.name})"
            )
        name = f"bakeoff-{server.label}"
        command = rehearsed_container_command(
            launch, model, port=8000, draft_dir=spec.model.draft_path, config_path=config, name=name
        )
        image = _image(backend, server.image_tag)
        if image != backend.container.image:
            command = command.replace(backend.container.image, image)
        by_hand.commands += [f"# {server.label}", command]
    what = "Tune the campaign" if bakeoff_command == "tune" else "Run the campaign"
    run = Step(what, commands=[f"bakeoff {bakeoff_command} {file}"])
    return GpuHostSteps([env, preflight, pull, by_hand, run])
