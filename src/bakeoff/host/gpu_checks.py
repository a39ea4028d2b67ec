"""Checks that keep a GPU comparison fair and startable, run before any server starts.

- CUDA: each GPU image is built for one CUDA major (``container.cuda_major``); a host
  driver whose CUDA version (the ``CUDA Version: X.Y`` of ``nvidia-smi``) is older cannot
  run it. :func:`check_cuda_compat` refuses that and names the tag built for the host's
  CUDA major (``container.cuda_images``), or says to upgrade the driver.
- KV-cache dtype: a ModelOpt export (TensorRT-LLM's checkpoints) defaults its KV cache to
  FP8 and records it in ``hf_quant_config.json`` (``quantization.kv_cache_quant_algo``),
  which the server then follows while the others keep the model dtype. Such a campaign
  compares KV precisions, not frameworks: :func:`check_kv_dtypes` refuses it, naming each
  server's KV dtype. KV dtypes set on purpose by the ``kv_cache_dtype`` knob are an A/B
  and pass.
- Draft models: a speculative knob that reads ``/draft`` needs ``model.draft_path``
  (:func:`check_draft_models`).
- Model dtype: a knob value the framework refuses unless the model dtype is the same
  (``needs_model_dtype``: vLLM 0.33's bfloat16 KV cache) is checked against the ``dtype``
  knob, or the checkpoint's ``config.json`` when dtype is auto (:func:`check_model_dtype`).

Everything here is pure (``nvidia-smi`` is asked by :func:`bakeoff.host.gpus.query_nvidia_smi`),
so it is tested with sample ``nvidia-smi`` outputs and temporary checkpoint folders.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from bakeoff.backends.knobs import draft_model_knob
from bakeoff.backends.spec import BackendSpec, KnobValue
from bakeoff.errors import LaunchError, SpecError

QUANT_CONFIG = "hf_quant_config.json"
_CUDA_VERSION = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")
# Spellings of one KV element type across the frameworks and ModelOpt's config.
_KV_ALIASES = {
    "fp8": "fp8_e4m3",  # vLLM's and TensorRT-LLM's fp8 is e4m3; ModelOpt writes "FP8"
    "bf16": "bfloat16",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
}


def parse_cuda_version(nvidia_smi_text: str) -> tuple[int, int]:
    """(major, minor) of the driver's CUDA version from ``nvidia-smi`` output."""
    match = _CUDA_VERSION.search(nvidia_smi_text)
    if match is None:
        raise LaunchError("nvidia-smi printed no 'CUDA Version: X.Y'; is the NVIDIA driver loaded?")
    return int(match.group(1)), int(match.group(2))


def check_cuda_compat(backend: BackendSpec, nvidia_smi_text: str) -> None:
    """Refuse an image built for a newer CUDA than the host driver supports (:func:`cuda_refusal`)."""
    if backend.container is None or backend.container.cuda_major is None:
        return  # a CPU image needs no driver
    refusal = cuda_refusal(backend, *parse_cuda_version(nvidia_smi_text))
    if refusal is not None:
        raise LaunchError(refusal)


def cuda_refusal(backend: BackendSpec, major: int, minor: int) -> str | None:
    """Why the host driver (CUDA ``major.minor``) cannot run the backend's image, with the fix; None when it can.

    A driver runs images of its own CUDA major and older ones, so only an older major fails;
    an older minor of the same major runs under CUDA's minor-version compatibility
    (:func:`cuda_minor_note` says what that leaves out).
    """
    spec = backend.container
    if spec is None or spec.cuda_major is None or major >= spec.cuda_major:
        return None
    fits = sorted((m, image) for m, image in spec.cuda_images.items() if m <= major)
    if fits:
        m, image = fits[-1]
        fix = (
            f"use {image} (the CUDA {m} build of the same release): set container.image to it and "
            f"container.cuda_major to {m} in backends/{backend.name}.yaml, or upgrade the driver"
        )
    else:
        fix = (
            f"no CUDA {major} build of it exists; upgrade the NVIDIA driver to one with CUDA "
            f"{spec.cuda_major}.{spec.cuda_minor}"
        )
    return (
        f"backend {backend.name!r}: image {spec.image} is built for CUDA {spec.cuda_major}.{spec.cuda_minor} but "
        f"the host driver supports CUDA {major}.{minor}; {fix}"
    )


def cuda_minor_note(backend: BackendSpec, major: int, minor: int) -> str | None:
    """What an older driver minor of the image's own CUDA major leaves out, or None when the driver is as new."""
    spec = backend.container
    if spec is None or spec.cuda_major is None or major != spec.cuda_major or minor >= spec.cuda_minor:
        return None
    return (
        f"backend {backend.name!r}: image {spec.image} is built for CUDA {spec.cuda_major}.{spec.cuda_minor} and the "
        f"host driver supports {major}.{minor}: it runs under CUDA minor-version compatibility, but kernels "
        "shipped only as PTX fail to JIT-compile; upgrade the driver to one with CUDA "
        f"{spec.cuda_major}.{spec.cuda_minor}"
    )


def checkpoint_kv_dtype(model_dir: Path) -> str | None:
    """The KV-cache dtype a ModelOpt checkpoint asks for, normalized; None when it asks none."""
    path = model_dir / QUANT_CONFIG
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: not readable JSON ({exc}); re-export the checkpoint") from exc
    quant = data.get("quantization") if isinstance(data, dict) else None
    algo = quant.get("kv_cache_quant_algo") if isinstance(quant, dict) else None
    return normalize_kv_dtype(str(algo)) if algo else None


def normalize_kv_dtype(value: str) -> str:
    text = value.strip().lower()
    return _KV_ALIASES.get(text, text)


@dataclass(frozen=True)
class KvDtype:
    """One server's effective KV-cache element type and where it comes from."""

    label: str
    dtype: str
    source: str  # "knob", "checkpoint" or "model dtype"

    def describe(self) -> str:
        return f"{self.label}: {self.dtype} ({self.source})"


def effective_kv_dtype(label: str, knobs: dict[str, KnobValue], model_dir: Path | None) -> KvDtype:
    """The knob when set, else what the checkpoint asks for, else the model's own dtype."""
    knob = knobs.get("kv_cache_dtype")
    if knob is not None and str(knob) != "auto":
        return KvDtype(label, normalize_kv_dtype(str(knob)), "knob")
    if model_dir is not None and model_dir.is_dir():
        from_checkpoint = checkpoint_kv_dtype(model_dir)
        if from_checkpoint is not None:
            return KvDtype(label, from_checkpoint, f"checkpoint {model_dir / QUANT_CONFIG}")
    dtype = knobs.get("dtype")
    if dtype is not None and str(dtype) != "auto":
        return KvDtype(label, normalize_kv_dtype(str(dtype)), "model dtype")
    return KvDtype(label, "model dtype", "model dtype")


def check_kv_dtypes(kv: list[KvDtype]) -> None:
    """Refuse servers whose KV dtypes differ because a checkpoint chose one for its server."""
    if len({k.dtype for k in kv}) <= 1:
        return
    implicit = [k for k in kv if k.source.startswith("checkpoint")]
    if not implicit:
        return  # set on purpose with kv_cache_dtype: an A/B of KV precision
    names = ", ".join(k.label for k in implicit)
    raise SpecError(
        "servers differ in KV-cache dtype, so the comparison would measure KV precision, not frameworks: "
        + "; ".join(k.describe() for k in kv)
        + f". Fix: re-export the checkpoint of {names} with ModelOpt's --kv_cache_qformat none "
        "(KV cache in the model dtype), or set kv_cache_dtype on the other servers to match"
    )


def check_draft_models(backends: list[tuple[str, BackendSpec, dict[str, KnobValue]]], draft_path: Path | None) -> None:
    """Refuse a speculative knob that reads /draft when the campaign names no draft model."""
    if draft_path is not None:
        return
    for where, backend, knobs in backends:
        knob = draft_model_knob(backend, knobs)
        if knob is not None:
            raise SpecError(
                f"{where}.knobs.{knob}: {knobs[knob]} needs a draft model (an EAGLE head or a small model "
                "with the same vocabulary); set model.draft_path to its folder, or use speculative: ngram or none"
            )


def checkpoint_dtype(model_dir: Path | None) -> str | None:
    """The weights' dtype a Hugging Face checkpoint declares (``torch_dtype``, or ``dtype``), normalized."""
    path = None if model_dir is None else model_dir / "config.json"
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    value = data.get("torch_dtype") or data.get("dtype") if isinstance(data, dict) else None
    return normalize_kv_dtype(str(value)) if value else None


def check_model_dtype(where: str, backend: BackendSpec, knobs: dict[str, KnobValue], model_dir: Path | None) -> None:
    """Refuse a knob value the framework only takes with the same model dtype (``needs_model_dtype``).

    ``dtype: auto`` keeps a float16 or bfloat16 checkpoint's own dtype, so the checkpoint's
    ``config.json`` decides; when it cannot be read the value is refused too, since the
    server would only find out at start-up.
    """
    for name, spec in backend.knobs.items():
        value = knobs.get(name)
        if value is None or str(value) not in spec.needs_model_dtype:
            continue
        wanted = normalize_kv_dtype(str(value))
        dtype = knobs.get("dtype")
        model: str | None
        if dtype is not None and str(dtype) != "auto":
            model, source = normalize_kv_dtype(str(dtype)), "the dtype knob"
        else:
            declared = checkpoint_dtype(model_dir)
            model = declared if declared in ("float16", "bfloat16") else None
            source = f"dtype auto on {model_dir / 'config.json'}" if model_dir is not None else "dtype auto"
        if model == wanted:
            continue
        seen = f"the model dtype is {model} ({source})" if model else f"the model dtype is unknown ({source})"
        raise SpecError(
            f"{where}.knobs.{name}: {backend.name} {backend.version} refuses {name} {value} unless the model dtype "
            f"is {wanted} too, and {seen}. Fix: set dtype: {wanted} on this server, or {name}: auto"
        )
