"""4-bit checkpoints for vLLM-CPU: which shapes its W4A16 and W4A8 kernels take, what a checkpoint
stores, and the refusal when no quantization environment is there (the GPTQ itself runs in
.venv-quant; a real W4A8 checkpoint served by vLLM-CPU: tests/test_e2e_vllm_int4.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from bakeoff.errors import LaunchError
from bakeoff.models import quantized
from bakeoff.models.quantized import QUANT_PYTHON_ENV, quantized_checkpoint, shape_problems, weight_types

LLAMA = {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64, "num_key_value_heads": 1}


def test_the_trained_models_shapes_fit_the_cpu_wna16_kernel() -> None:
    # The trained preset: qkv 128x256, o 128x128, gate_up 128x768, down 384x128.
    assert shape_problems({**LLAMA, "intermediate_size": 384}) == []


def test_shapes_the_kernel_refuses_are_named() -> None:
    # 48-wide heads: qkv_proj's 96 + 2x48 = 192 outputs fit, its 96 inputs are no multiple of the group.
    narrow = shape_problems({**LLAMA, "hidden_size": 96, "head_dim": 48, "intermediate_size": 256})
    assert any(p.startswith("qkv_proj's input size 96 is not a multiple of the group size 128") for p in narrow)
    odd = shape_problems({**LLAMA, "intermediate_size": 200})
    assert odd == [
        "gate_up_proj is 128x400: the kernel needs input and output sizes that are multiples of 32",
        "down_proj is 200x128: the kernel needs input and output sizes that are multiples of 32",
    ]
    # W4A8's kernel (Dynamic4bitLinearKernel) asks only that the group divide each input size.
    assert shape_problems({**LLAMA, "intermediate_size": 200}, "w4a8") == [
        "down_proj's input size 200 is not a multiple of the group size 128"
    ]
    assert shape_problems({**LLAMA, "intermediate_size": 384}, "w4a8") == []


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


def test_a_w4a8_checkpoint_stores_int4_in_int8_and_says_activations_are_quantized(tmp_path: Path) -> None:
    # llm-compressor writes W4A8 int-quantized: each 4-bit weight in an int8, no weight_packed.
    _safetensors(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.self_attn.q_proj.weight": "I8",
            "model.layers.0.self_attn.q_proj.weight_scale": "BF16",
            "model.layers.0.mlp.down_proj.weight": "I8",
            "lm_head.weight": "BF16",
        },
    )
    group = {"weights": {"num_bits": 4}, "input_activations": {"num_bits": 8, "strategy": "token", "dynamic": True}}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"config_groups": {"group_0": group}}}))
    assert weight_types(tmp_path) == {"INT4 g128 (in int8), activations INT8 per token": 2, "BF16": 1}
    # The same int8 tensors in an 8-bit checkpoint are plain I8: only 4-bit weights are relabelled.
    group["weights"] = {"num_bits": 8}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"config_groups": {"group_0": group}}}))
    assert weight_types(tmp_path) == {"I8": 2, "BF16": 1}


def test_without_a_quantization_environment_the_fix_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "trained"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA, "intermediate_size": 384}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(QUANT_PYTHON_ENV, raising=False)
    monkeypatch.setattr(quantized, "checkout_root", lambda: None)
    with pytest.raises(LaunchError, match=r"scripts/bootstrap.sh quant"):
        quantized_checkpoint(model, "w4a16", tmp_path / "cache")
    monkeypatch.setenv(QUANT_PYTHON_ENV, str(tmp_path / "nothing"))
    with pytest.raises(LaunchError, match="not an executable interpreter"):
        quantized_checkpoint(model, "w4a16", tmp_path / "cache")
    with pytest.raises(LaunchError, match="bakeoff makes w4a16, w4a8 checkpoints"):
        quantized_checkpoint(model, "w8a8", tmp_path / "cache")
    (model / "config.json").write_text(json.dumps({**LLAMA, "intermediate_size": 200}))
    with pytest.raises(LaunchError, match="w4a16 kernel cannot take this model: gate_up_proj"):
        quantized_checkpoint(model, "w4a16", tmp_path / "cache")
