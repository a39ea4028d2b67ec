"""4-bit weight checkpoints for vLLM-CPU: made once per model by GPTQ in the quantization environment, cached.

vLLM serves 4-bit weights from a checkpoint quantized beforehand; the field's tool for that is
llm-compressor (GPTQ, AWQ), whose pins fit neither the harness nor the engine, so it lives in
its own environment, ``.venv-quant`` (``scripts/bootstrap.sh quant``, pinned by
``constraints-quant.txt``), found like the engine's:

1. ``$BAKEOFF_QUANT_PYTHON``, else
2. ``.venv-quant/bin/python`` in the working directory, else in the source checkout.

:func:`quantized_checkpoint` returns the checkpoint of a model folder in one of
:data:`SCHEMES`, building it on first use with :mod:`bakeoff.models.gptq_quantize` (run as a
script by that interpreter) calibrated on documents of the trained world's text, and caches it
in ``~/.cache/bakeoff/models`` keyed by the source weights, the scheme and the recipe.

==========  ================================================================================
scheme      weights, activations, and the vLLM-CPU kernel that serves it
==========  ================================================================================
``w4a16``   int4 g128, bf16; ``CPUWNA16LinearKernel`` (``cpu_gemm_wna16``: AVX-512 builds only)
``w4a8``    int4 g128, int8 per token at run time; ``Dynamic4bitLinearKernel`` (PyTorch's
            ``_dyn_quant_matmul_4bit``, any x86 or Arm host)
==========  ================================================================================

:func:`shape_problems` says which of a model's linear layers the scheme's kernel cannot take
(``CPUWNA16LinearKernel.can_implement``: input and output sizes multiples of 32, the group
size dividing each input size; ``Dynamic4bitLinearKernel``: the group size dividing each input size).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bakeoff.errors import LaunchError
from bakeoff.models.training import TRAINED
from bakeoff.models.world import corpus
from bakeoff.paths import checkout_root, user_cache_dir

QUANT_PYTHON_ENV = "BAKEOFF_QUANT_PYTHON"
QUANT_VENV = ".venv-quant"
SCRIPT = Path(__file__).with_name("gptq_quantize.py")
# The quantization knob's values (backend YAML) -> compressed-tensors' preset scheme name.
SCHEMES = {"w4a16": "W4A16", "w4a8": "W4A8"}
CARD = "bakeoff-quant.json"
GROUP_SIZE = 128
CALIBRATION_DOCUMENTS = 256
TIMEOUT_S = 1800.0
# compressed-tensors' pack-quantized layout: weight_packed plus these, per quantized layer.
PACKED_PARTS = ("weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")


def find_quant_python() -> Path | None:
    explicit = os.environ.get(QUANT_PYTHON_ENV)
    if explicit:
        return Path(explicit).expanduser()
    candidates = [Path.cwd() / QUANT_VENV / "bin" / "python"]
    checkout = checkout_root()
    if checkout is not None:
        candidates.append(checkout / QUANT_VENV / "bin" / "python")
    return next((p.absolute() for p in candidates if os.access(p, os.X_OK)), None)


def shape_problems(config: dict[str, Any], scheme: str = "w4a16") -> list[str]:
    """Each linear layer of a Llama-style ``config.json`` that the scheme's vLLM-CPU kernel refuses, worded."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads") or heads) * head_dim
    inter = int(config["intermediate_size"])
    # (name, input size, output size) as vLLM fuses them: qkv_proj and gate_up_proj.
    layers = [
        ("qkv_proj", hidden, heads * head_dim + 2 * kv),
        ("o_proj", heads * head_dim, hidden),
        ("gate_up_proj", hidden, 2 * inter),
        ("down_proj", inter, hidden),
    ]
    problems = []
    for name, k, n in layers:
        if scheme == "w4a16" and (k % 32 or n % 32):
            problems.append(f"{name} is {k}x{n}: the kernel needs input and output sizes that are multiples of 32")
        elif k % GROUP_SIZE:
            problems.append(f"{name}'s input size {k} is not a multiple of the group size {GROUP_SIZE}")
    return problems


def _key(model_dir: Path, scheme: str) -> str:
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        path = model_dir / name
        if path.is_file():
            digest.update(path.read_bytes())
    digest.update(SCRIPT.read_bytes())
    digest.update(f"{scheme}/{GROUP_SIZE}/{CALIBRATION_DOCUMENTS}".encode())
    return digest.hexdigest()[:16]


def quantized_checkpoint(model_dir: Path, scheme: str, cache_dir: Path | None = None) -> Path:
    """The ``scheme`` (:data:`SCHEMES`; GPTQ, group 128) checkpoint of ``model_dir``: cached, else built now."""
    if scheme not in SCHEMES:
        raise LaunchError(f"quantization {scheme!r}: bakeoff makes {', '.join(SCHEMES)} checkpoints")
    config = json.loads((model_dir / "config.json").read_text())
    problems = shape_problems(config, scheme)
    if problems:
        raise LaunchError(f"{model_dir}: vLLM-CPU's {scheme} kernel cannot take this model: {'; '.join(problems)}")
    cached = (cache_dir or user_cache_dir()) / "models" / f"{model_dir.name}-{scheme}-{_key(model_dir, scheme)}"
    if (cached / CARD).is_file():
        return cached
    python = find_quant_python()
    if python is not None and not os.access(python, os.X_OK):
        raise LaunchError(f"{QUANT_PYTHON_ENV}={python}: not an executable interpreter; fix or unset it")
    if python is None:
        raise LaunchError(
            f"no quantization environment ({QUANT_VENV}) to make the {scheme} checkpoint of {model_dir}; create it "
            f"with scripts/bootstrap.sh quant, or point {QUANT_PYTHON_ENV} at an interpreter with llmcompressor"
        )
    partial = cached.with_name(cached.name + f".{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    calibration = partial / "calibration.jsonl"
    documents = corpus(TRAINED.world, documents=CALIBRATION_DOCUMENTS)
    calibration.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    try:
        done = subprocess.run(
            [str(python), str(SCRIPT), SCHEMES[scheme], str(model_dir), str(partial), str(calibration)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"GPTQ of {model_dir} ran past {TIMEOUT_S:.0f} s") from exc
    (partial / "quantize.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise LaunchError(f"GPTQ of {model_dir} failed; see {partial / 'quantize.log'}: {done.stderr.strip()[-600:]}")
    card = json.loads(done.stdout.strip().splitlines()[-1])
    card.update({"source": str(model_dir), "group_size": GROUP_SIZE, "interpreter": str(python)})
    (partial / CARD).write_text(json.dumps(card, indent=2) + "\n")
    shutil.rmtree(cached, ignore_errors=True)
    partial.replace(cached)
    return cached


def _scheme_of(checkpoint: Path) -> tuple[int | None, int | None]:
    """(weight bits, activation bits) of a compressed-tensors checkpoint's first config group."""
    config = checkpoint / "config.json"
    quant = (json.loads(config.read_text()).get("quantization_config") or {}) if config.is_file() else {}
    groups = [g for g in (quant.get("config_groups") or {}).values() if isinstance(g, dict)]
    if not groups:
        return None, None
    weights, acts = groups[0].get("weights") or {}, groups[0].get("input_activations") or {}
    return weights.get("num_bits"), acts.get("num_bits")


def weight_types(checkpoint: Path) -> dict[str, int]:
    """Weight tensors by stored type in a safetensors checkpoint: a 4-bit weight counts once as
    INT4 (its scales, shape and zero points are part of it), every other tensor by its dtype.

    W4A16 stores 4-bit weights packed (``weight_packed``, eight an int32); W4A8 stores each in an
    int8 (``weight``, int-quantized), and quantizes activations too: the INT4 entry says both.
    """
    weight_bits, act_bits = _scheme_of(checkpoint)
    acts = f", activations INT{act_bits} per token" if act_bits else ""
    counts: dict[str, int] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        with path.open("rb") as f:
            header: dict[str, Any] = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name == "__metadata__" or name.endswith(PACKED_PARTS):
                continue
            if name.endswith("weight_packed"):
                kind = f"INT4 g{GROUP_SIZE} (packed){acts}"
            elif weight_bits == 4 and info["dtype"] == "I8":
                kind = f"INT4 g{GROUP_SIZE} (in int8){acts}"
            else:
                kind = str(info["dtype"])
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
