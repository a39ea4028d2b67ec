"""Tests of bakeoff.host.gpu_checks and the GPU campaigns: CUDA tags, KV dtypes, draft models, defaults.

Sample ``nvidia-smi`` outputs stand in for a driver, temporary folders with a fake
``hf_quant_config.json`` for ModelOpt checkpoints, and a pinned table generated from the
vLLM 0.33.0 and SGLang 0.5.23 wheels by ``bakeoff backends audit --write-defaults``
(tests/data/framework_defaults.yaml) for their defaults. Nothing here needs a GPU.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from bakeoff.backends.launch_render import render_engine_build, render_launch
from bakeoff.backends.spec import BACKENDS_DIR, load_backend
from bakeoff.campaign.cells import expand
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.errors import LaunchError, SpecError
from bakeoff.host.gpu_checks import (
    check_cuda_compat,
    checkpoint_kv_dtype,
    parse_cuda_version,
)
from bakeoff.host.gpus import query_nvidia_smi

REPO = BACKENDS_DIR.parent
DEFAULTS = Path(__file__).parent / "data" / "framework_defaults.yaml"

SMI_CUDA_12 = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.127.05             Driver Version: 550.127.05     CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+
"""
SMI_CUDA_13 = SMI_CUDA_12.replace("550.127.05", "580.65.06").replace("CUDA Version: 12.4", "CUDA Version: 13.0")


# --- the driver's CUDA version against each image's -----------------------------------


def test_cuda_version_is_read_from_nvidia_smi() -> None:
    assert parse_cuda_version(SMI_CUDA_12) == (12, 4)
    assert parse_cuda_version(SMI_CUDA_13) == (13, 0)
    with pytest.raises(LaunchError, match="no 'CUDA Version"):
        parse_cuda_version("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")


@pytest.mark.parametrize(
    ("name", "other_tag"),
    [("vllm", "docker.io/vllm/vllm-openai:v0.33.0-cu129"), ("sglang", "docker.io/lmsysorg/sglang:v0.5.23-cu129")],
)
def test_a_cuda_12_driver_is_told_the_cu129_tag(name: str, other_tag: str) -> None:
    backend = load_backend(name)
    assert backend.container is not None and backend.container.cuda_major == 13
    assert ":v" in backend.container.image and "-cu" not in backend.container.image
    with pytest.raises(
        LaunchError, match=f"built for CUDA 13.0 but the host driver supports CUDA 12.4; use {other_tag}"
    ):
        check_cuda_compat(backend, SMI_CUDA_12)
    check_cuda_compat(backend, SMI_CUDA_13)  # a CUDA 13 driver runs the plain tag


def test_trtllm_has_no_cuda_12_build_so_the_driver_must_be_upgraded() -> None:
    for name in ("trtllm", "trtllm-engine"):
        with pytest.raises(LaunchError, match="no CUDA 12 build of it exists; upgrade the NVIDIA driver"):
            check_cuda_compat(load_backend(name), SMI_CUDA_12)
        check_cuda_compat(load_backend(name), SMI_CUDA_13)


def test_cpu_images_need_no_driver() -> None:
    check_cuda_compat(load_backend("vllm-cpu-container"), "no GPU here")
    check_cuda_compat(load_backend("vllm-cpu"), "no GPU here")


def _fake_smi(folder: Path, body: str, code: int = 0) -> None:
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n/bin/cat <<'OUT'\n{body}OUT\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_query_nvidia_smi_runs_it_and_reports_a_missing_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="nvidia-smi not found"):
        query_nvidia_smi()
    _fake_smi(tmp_path, SMI_CUDA_12)
    assert parse_cuda_version(query_nvidia_smi()) == (12, 4)
    _fake_smi(tmp_path, "Failed to initialize NVML\n", code=9)
    with pytest.raises(LaunchError, match="nvidia-smi failed: Failed to initialize NVML"):
        query_nvidia_smi()
    assert os.environ["PATH"] == str(tmp_path)


# --- KV-cache dtype of a ModelOpt checkpoint ------------------------------------------


def _checkpoint(folder: Path, kv_algo: str | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    quant = {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": kv_algo}
    (folder / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quant}))
    return folder


def test_checkpoint_kv_dtype_reads_hf_quant_config(tmp_path: Path) -> None:
    assert checkpoint_kv_dtype(_checkpoint(tmp_path / "fp8", "FP8")) == "fp8_e4m3"
    assert checkpoint_kv_dtype(_checkpoint(tmp_path / "none", None)) is None
    assert checkpoint_kv_dtype(tmp_path) is None  # no hf_quant_config.json at all
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "hf_quant_config.json").write_text("{not json")
    with pytest.raises(SpecError, match="not readable JSON"):
        checkpoint_kv_dtype(bad)


def _campaign(servers: list[dict[str, Any]], **model: Any) -> CampaignSpec:
    return CampaignSpec.model_validate(
        {
            "name": "t",
            "gpu": True,
            "repeats": 1,
            "model": {"path": "/models/llama-7b", "context_len": 4096, **model},
            "servers": servers,
            "workloads": [{"kind": "concurrency", "levels": [1], "input_len": 16, "output_len": 8}],
        }
    )


def test_a_checkpoint_that_makes_the_kv_cache_fp8_is_refused(tmp_path: Path) -> None:
    fp8 = _checkpoint(tmp_path / "w4a16-fp8kv", "FP8")
    spec = _campaign(
        [
            {"backend": "vllm", "label": "vllm-awq", "knobs": {"dtype": "float16", "quantization": "awq"}},
            {"backend": "trtllm", "label": "trtllm-awq", "model_path": str(fp8), "knobs": {"dtype": "float16"}},
        ]
    )
    with pytest.raises(SpecError) as err:
        expand(spec, None)
    text = str(err.value)
    assert "vllm-awq: float16" in text and "trtllm-awq: fp8_e4m3 (checkpoint" in text
    assert "--kv_cache_qformat none" in text and "set kv_cache_dtype on the other servers" in text
    # Re-exported with --kv_cache_qformat none: the KV cache follows the model dtype.
    spec.servers[1].model_path = _checkpoint(tmp_path / "w4a16-nokv", None)
    assert len(expand(spec, None)) == 2
    # Or the others match the checkpoint on purpose.
    spec.servers[1].model_path = fp8
    spec.servers[0].knobs["kv_cache_dtype"] = "fp8"
    assert len(expand(spec, None)) == 2


def test_kv_dtypes_set_on_purpose_are_an_ab_not_an_error() -> None:
    spec = _campaign(
        [
            # vLLM 0.33 takes a bfloat16 KV cache only with a bfloat16 model.
            {"backend": "vllm", "label": "bf16-kv", "knobs": {"kv_cache_dtype": "bfloat16", "dtype": "bfloat16"}},
            {"backend": "vllm", "label": "fp8-kv", "knobs": {"kv_cache_dtype": "fp8", "dtype": "bfloat16"}},
        ]
    )
    assert len(expand(spec, None)) == 2


# --- draft models for speculative decoding --------------------------------------------


@pytest.mark.parametrize(("backend", "method"), [("vllm", "eagle"), ("sglang", "eagle3"), ("trtllm", "draft")])
def test_a_speculative_knob_reading_draft_needs_model_draft_path(backend: str, method: str, tmp_path: Path) -> None:
    servers = [{"backend": backend, "knobs": {"speculative": method}}]
    with pytest.raises(SpecError, match=r"servers\[0\]\.knobs\.speculative: .* set model\.draft_path"):
        expand(_campaign(servers), None)
    assert len(expand(_campaign(servers, draft_path=str(tmp_path)), None)) == 1


def test_ngram_needs_no_draft_model() -> None:
    assert len(expand(_campaign([{"backend": "vllm", "knobs": {"speculative": "ngram"}}]), None)) == 1


# --- vLLM's and SGLang's declared defaults against their released code ----------------


def _pinned() -> dict[str, Any]:
    data = yaml.safe_load(DEFAULTS.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_declared_defaults_match_the_released_framework(name: str) -> None:
    backend = load_backend(name)
    table = _pinned()[name]
    assert table["version"] == backend.version
    assert set(table["knobs"]) == set(backend.knobs), "every knob needs a pinned default with its source"
    for knob, entry in table["knobs"].items():
        assert entry["source"].split(":")[0].endswith(".py"), f"{name}.{knob}: name the file it was read from"
        assert backend.knobs[knob].default == entry["default"], f"{name}.{knob}: {entry['source']}"
        if backend.knobs[knob].fills is not None:
            assert entry.get("bakeoff_default_because"), f"{name}.{knob}: say why bakeoff picks its default"


# --- the GPU campaigns ------------------------------------------------------------------


def _gpu_campaigns() -> list[Path]:
    return sorted((REPO / "campaigns").glob("gpu-*.yaml"))


@pytest.mark.parametrize("path", _gpu_campaigns(), ids=lambda p: p.stem)
def test_every_server_of_a_7b_gpu_campaign_launches_in_float16(path: Path) -> None:
    """One server in bfloat16 beside float16 ones would compare precisions: each launch (or engine) renders float16."""
    for server in load_campaign(path).servers:
        backend = load_backend(server.backend)
        if "dtype" not in backend.knobs:  # TensorRT-LLM's engine flow: the engine's dtype, set at its conversion
            steps = render_engine_build(backend, dict(server.knobs), model="/m", checkpoint_dir="/c", engine_dir="/e")
            assert [s[s.index("--dtype") + 1] for s in steps if "--dtype" in s] == ["float16"], server.label
            continue
        launch = render_launch(backend, dict(server.knobs), model="/m", served_model_name="m", port=1)
        target = backend.knobs["dtype"]
        if target.flag:
            assert launch.argv[launch.argv.index(target.flag) + 1] == "float16", server.label
        else:
            assert target.config_key and launch.config_text is not None, server.label
            assert yaml.safe_load(launch.config_text)[target.config_key] == "float16", server.label


def test_the_rag_campaign_states_vllms_unchunked_warning_and_carries_it() -> None:
    path = REPO / "campaigns" / "gpu-rag-8k.yaml"
    assert "may cause the engine to crash or produce incorrect outputs" in path.read_text()
    spec = load_campaign(path)
    warned = {}
    for server in spec.servers:
        launch = render_launch(load_backend(server.backend), server.knobs, model="/m", served_model_name="m", port=1)
        warned[server.label] = launch.warnings
    assert [label for label, w in warned.items() if w] == ["vllm-unchunked"]
