"""W4A16 checkpoints for vLLM-CPU: which shapes its WNA16 kernel takes, what a checkpoint stores, and
the refusal when no quantization environment is there (the GPTQ itself runs in .venv-quant)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from bakeoff.errors import LaunchError
from bakeoff.models import quantized
from bakeoff.models.quantized import QUANT_PYTHON_ENV, w4a16_checkpoint, weight_types, wna16_shape_problems

LLAMA = {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64, "num_key_value_heads": 1}


def test_the_trained_models_shapes_fit_the_cpu_wna16_kernel() -> None:
    # The trained preset: qkv 128x256, o 128x128, gate_up 128x768, down 384x128.
    assert wna16_shape_problems({**LLAMA, "intermediate_size": 384}) == []


def test_shapes_the_kernel_refuses_are_named() -> None:
    # 48-wide heads: qkv_proj's 96 + 2x48 = 192 outputs fit, its 96 inputs are no multiple of the group.
    narrow = wna16_shape_problems({**LLAMA, "hidden_size": 96, "head_dim": 48, "intermediate_size": 256})
    assert any(p.startswith("qkv_proj's input size 96 is not a multiple of the group size 128") for p in narrow)
    odd = wna16_shape_problems({**LLAMA, "intermediate_size": 200})
    assert odd == [
        "gate_up_proj is 128x400: the kernel needs input and output sizes that are multiples of 32",
        "down_proj is 200x128: the kernel needs input and output sizes that are multiples of 32",
    ]


def _safetensors(path: Path, tensors: dict[str, str]) -> None:
    header = json.dumps(
        {name: {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]} for name, dtype in tensors.items()}
    )
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4)


def test_a_checkpoints_weight_types_count_packed_int4_apart(tmp_path: Path) -> None:
    _safetensors(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.self_attn.q_proj.weight_packed": "I32",
            "model.layers.0.self_attn.q_proj.weight_scale": "BF16",
            "model.layers.0.self_attn.q_proj.weight_shape": "I64",
            "model.layers.0.mlp.down_proj.weight_packed": "I32",
            "model.layers.0.mlp.down_proj.weight_scale": "BF16",
            "lm_head.weight": "BF16",
            "model.norm.weight": "BF16",
        },
    )
    assert weight_types(tmp_path) == {"BF16": 2, "INT4 g128 (packed)": 2}


def test_without_a_quantization_environment_the_fix_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "trained"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA, "intermediate_size": 384}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(QUANT_PYTHON_ENV, raising=False)
    monkeypatch.setattr(quantized, "checkout_root", lambda: None)
    with pytest.raises(LaunchError, match=r"scripts/bootstrap.sh quant"):
        w4a16_checkpoint(model, tmp_path / "cache")
    monkeypatch.setenv(QUANT_PYTHON_ENV, str(tmp_path / "nothing"))
    with pytest.raises(LaunchError, match="not an executable interpreter"):
        w4a16_checkpoint(model, tmp_path / "cache")
    (model / "config.json").write_text(json.dumps({**LLAMA, "intermediate_size": 200}))
    with pytest.raises(LaunchError, match="WNA16 kernel cannot take this model: gate_up_proj"):
        w4a16_checkpoint(model, tmp_path / "cache")
