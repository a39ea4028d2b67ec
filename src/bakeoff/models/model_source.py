"""Where a campaign's model comes from, and what a server needs to read it.

A model is a generated preset, a local Hugging Face folder, or a Hugging Face model id.
An id is served the way users run the official images: the server gets the id as its
model argument, the user's Hugging Face cache (``HF_HOME``, default
``~/.cache/huggingface``) is mounted at the image's cache path, and ``HF_TOKEN`` is passed
through by name (``-e HF_TOKEN``), so its value lives only in the runtime's environment
and never in an argv, a log or a report.

Planning needs the tokenizer before any server starts, and bakeoff never downloads at run
time: for an id it is read from the cache (``hub/models--ORG--NAME/snapshots/REV/``, the
revision ``refs/main`` points at, else the newest snapshot holding ``tokenizer.json``), and
a cache without it is a :class:`SpecError` naming the command that fills it.

Everything here is pure apart from reading the cache folder; the launcher calls
:func:`resolve_model` once per campaign and asks the result for what each server needs:

    source = resolve_model(spec.model)              # after load_campaign
    tokenizer = load_tokenizer(source.tokenizer_dir())
    # container backends: the model argument, extra mounts and env names for `run`
    mount = source.container_mount(backend.container.model_mount)
    # process backends (and GGUF conversion) read a local folder
    folder = source.local_dir_or_raise()
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator, model_validator

from bakeoff.errors import SpecError
from bakeoff.models.presets import resolve_model_dir
from bakeoff.schema import Strict

# The names `bakeoff model make --preset` makes (bakeoff.models.presets.PRESET_NAMES; a test holds them equal).
PresetName = Literal["tiny", "small", "trained", "trained-draft"]
PRESET_CHOICES: tuple[str, ...] = get_args(PresetName)
# Where the official vLLM, SGLang and TensorRT-LLM images (running as root) keep the cache.
CONTAINER_HF_HOME = "/root/.cache/huggingface"
# Passed by name only: the runtime copies each value from its own environment.
HF_SECRET_ENV = ("HF_TOKEN",)


def hf_home(environ: Mapping[str, str] | None = None) -> Path:
    """The user's Hugging Face home: ``HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``."""
    env = os.environ if environ is None else environ
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface"


def hf_hub_cache(environ: Mapping[str, str] | None = None) -> Path:
    """The hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    return hf_home(env) / "hub"


def cached_snapshot(hf_id: str, hub_cache: Path) -> Path | None:
    """The cached snapshot folder of ``hf_id`` that holds a tokenizer, or None.

    The revision ``refs/main`` names comes first (what a server resolving the id would
    load); otherwise the most recently written snapshot with a ``tokenizer.json``.
    """
    repo = hub_cache / ("models--" + hf_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    main = repo / "refs" / "main"
    if main.is_file():
        pinned = snapshots / main.read_text().strip()
        if (pinned / "tokenizer.json").is_file():
            return pinned
    candidates = [d for d in snapshots.iterdir() if (d / "tokenizer.json").is_file()]
    if not candidates:
        return None
    return max(candidates, key=lambda d: (d / "tokenizer.json").stat().st_mtime)


@dataclass(frozen=True)
class ContainerModel:
    """What ``container_run_args`` adds for the model: its argument, mounts and env names.

    ``mounts`` are ``(host path, container path, read_only)``; ``env`` is set literally
    (no secrets in it); ``pass_env`` are names whose values the runtime copies from its
    own environment (``-e NAME``), so they never appear in the command line.
    """

    model_arg: str
    mounts: tuple[tuple[Path, str, bool], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()

    def writable_dirs(self) -> list[Path]:
        """Host folders mounted read-write; podman refuses a missing one, so create them first."""
        return [host for host, _, read_only in self.mounts if not read_only]

    def run_args(self) -> list[str]:
        """The ``-v`` and ``-e`` arguments for ``podman run`` / ``docker run``."""
        args: list[str] = []
        for host, inside, read_only in self.mounts:
            args += ["-v", f"{host.absolute()}:{inside}{':ro' if read_only else ''}"]
        for key, value in sorted(self.env.items()):
            args += ["-e", f"{key}={value}"]
        for name in self.pass_env:
            args += ["-e", name]
        return args


@dataclass(frozen=True)
class ModelSource:
    """One campaign model, resolved: a local folder, a Hugging Face id, or both.

    For an id, ``local_dir`` is its cached snapshot when there is one (None otherwise).
    """

    hf_id: str | None
    local_dir: Path | None
    hub_cache: Path | None = None
    home: Path | None = None

    def tokenizer_dir(self) -> Path:
        """The folder ``tokenizer.json`` is read from for planning; never downloads."""
        if self.local_dir is not None and (self.local_dir / "tokenizer.json").is_file():
            return self.local_dir
        if self.hf_id is not None:
            raise SpecError(
                f"model.hf_id: no tokenizer.json for {self.hf_id} in the Hugging Face cache "
                f"({self.hub_cache}); bakeoff plans exact-length prompts before any server starts "
                f"and never downloads at run time. Fetch it first: "
                f"huggingface-cli download {self.hf_id} tokenizer.json tokenizer_config.json config.json "
                "(set HF_TOKEN for gated models), or set HF_HOME to the cache that has it"
            )
        raise SpecError(f"model.path: no tokenizer.json in {self.local_dir}; point it at a complete model folder")

    def local_dir_or_raise(self) -> Path:
        """A local folder for servers that read files directly (processes, GGUF conversion)."""
        if self.local_dir is not None and (self.local_dir / "config.json").is_file():
            return self.local_dir
        raise SpecError(
            f"model.hf_id: {self.hf_id} is not fully in the Hugging Face cache ({self.hub_cache}); "
            f"a local server reads the files itself: huggingface-cli download {self.hf_id}"
        )

    def container_mount(self, model_mount: str, environ: Mapping[str, str] | None = None) -> ContainerModel:
        """The model argument and mounts a container backend gets.

        A local folder is mounted read-only at ``model_mount`` and named by that path. An
        id is passed as is, with the user's Hugging Face home mounted read-write at the
        image's cache path (the server downloads what is missing into it, as it does when
        users run the image themselves) and ``HF_TOKEN`` passed by name when it is set.
        """
        if self.hf_id is None:
            assert self.local_dir is not None
            return ContainerModel(model_arg=model_mount, mounts=((self.local_dir, model_mount, True),))
        env = os.environ if environ is None else environ
        home = self.home or hf_home(env)
        hub = self.hub_cache or hf_hub_cache(env)
        mounts = [(home, CONTAINER_HF_HOME, False)]
        if hub.absolute() != (home / "hub").absolute():
            # HF_HUB_CACHE outside HF_HOME: the image only looks under its HF_HOME.
            mounts.append((hub, f"{CONTAINER_HF_HOME}/hub", False))
        return ContainerModel(
            model_arg=self.hf_id,
            mounts=tuple(mounts),
            env={"HF_HOME": CONTAINER_HF_HOME},
            pass_env=tuple(name for name in HF_SECRET_ENV if env.get(name)),
        )


def resolve_model(
    model: ModelRef, models_dir: Path | None = None, environ: Mapping[str, str] | None = None
) -> ModelSource:
    """Resolve a campaign's ``model:`` section; a preset or folder that is missing is a SpecError."""
    if model.hf_id is not None:
        env = os.environ if environ is None else environ
        hub = hf_hub_cache(env)
        local = cached_snapshot(model.hf_id, hub)
        return ModelSource(hf_id=model.hf_id, local_dir=local, hub_cache=hub, home=hf_home(env))

    return ModelSource(hf_id=None, local_dir=resolve_model_dir(model.preset, model.path, models_dir))


_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


class ModelRef(Strict):
    """Which model to serve: a generated preset, a Hugging Face folder, or a Hugging Face model id.

    ``hf_id`` (``meta-llama/Llama-3.1-8B-Instruct``) is served the way users run the
    official images: the id as the model argument, the user's Hugging Face cache mounted,
    ``HF_TOKEN`` passed through from the environment. See :mod:`bakeoff.models.model_source`.
    """

    preset: PresetName | None = None
    path: Path | None = None
    hf_id: str | None = Field(default=None, description="Hugging Face model id, e.g. org/name")
    served_name: str = "bakeoff-model"
    context_len: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="context length, for validating before the model folder is present"
    )
    draft_path: Path | None = Field(
        default=None,
        description="draft model folder (EAGLE head or small model) for speculative knobs; mounted at /draft",
    )

    @field_validator("hf_id")
    @classmethod
    def _hf_id(cls, value: str | None) -> str | None:
        if value is not None and (not _HF_ID.match(value) or ".." in value or "--" in value):
            raise ValueError(f"{value!r} is not a Hugging Face model id; write it as org/name")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelRef:
        if sum(v is not None for v in (self.preset, self.path, self.hf_id)) != 1:
            raise ValueError(f"set exactly one of 'preset' ({'|'.join(PRESET_CHOICES)}), 'path' or 'hf_id'")
        return self


MODEL_FORMS = (
    "write it as 'model: tiny' (a generated preset), 'model: models/my-model' (a folder), or as a "
    "mapping: {preset: tiny|small|trained}, {path: FOLDER} or {hf_id: org/name}"
)


def model_shorthand(value: object) -> object:
    """``model: tiny`` is a preset, ``model: some/folder`` a folder; mappings pass through.

    A Hugging Face id is not guessed from a bare string (``org/name`` reads like a
    folder too): it needs ``{hf_id: org/name}``.
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError(f"model is empty; {MODEL_FORMS}")
        return {"preset": text} if text in PRESET_CHOICES else {"path": text}
    if value is not None and not isinstance(value, dict | ModelRef):
        kind = type(value).__name__
        raise ValueError(f"model must be a folder, a preset name or a mapping, got {kind}; {MODEL_FORMS}")
    return value
