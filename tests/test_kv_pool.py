"""One KV-pool intent mapped like for like: each framework's memory knob, from the rule its backend declares."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from bakeoff.backends.kv_pool import KvPool, apply_kv_pool, kv_pool_settings, kv_pool_value
from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.cells import expand
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.errors import KnobError
from bakeoff.report.setup import kv_pool_table

REPO = Path(__file__).resolve().parents[1]
GPU_AGENTIC = REPO / "campaigns" / "gpu-agentic.yaml"
POOL = KvPool(share_of_gpu=0.55, gpu_memory_gib=79.6, weights_gib=15.0, activations_gib=6.0)


def test_each_basis_gets_the_value_that_sizes_the_same_pool() -> None:
    pool_gib = 0.55 * 79.6
    total, static, free = (kv_pool_value(b, POOL) for b in ("total", "total_static", "free_after_load"))
    # Read back through each framework's own meaning, every value leaves the declared pool (to 0.001 of memory).
    assert total * 79.6 - 15.0 - 6.0 == pytest.approx(pool_gib, abs=0.08)  # vLLM: everything in its share
    assert static * 79.6 - 15.0 == pytest.approx(pool_gib, abs=0.08)  # SGLang: weights + pool
    assert free * (79.6 - 15.0 - 6.0) == pytest.approx(pool_gib, abs=0.06)  # TensorRT-LLM: of what is left
    assert (total, static, free) == (0.813, 0.738, 0.747)  # rounded down: never a larger pool than declared
    assert total * 79.6 - 21.0 <= pool_gib and free * (79.6 - 21.0) <= pool_gib


def test_the_gpu_backends_declare_what_their_memory_knob_is_a_share_of() -> None:
    names = ("vllm", "sglang", "trtllm", "trtllm-engine")
    bases = {name: load_backend(name).knobs["gpu_memory_utilization"].memory_basis for name in names}
    assert bases == {
        "vllm": "total",
        "sglang": "total_static",
        "trtllm": "free_after_load",
        "trtllm-engine": "free_after_load",
    }


def test_a_pool_that_does_not_fit_or_is_stated_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="exceed the GPU's 80 GiB"):
        KvPool(share_of_gpu=0.8, gpu_memory_gib=80, weights_gib=15, activations_gib=6)
    vllm = load_backend("vllm")
    with pytest.raises(KnobError, match=r"knobs\.gpu_memory_utilization and kv_pool both size the KV pool"):
        apply_kv_pool(POOL, [("a", vllm, {"gpu_memory_utilization": 0.9})])
    with pytest.raises(KnobError, match="'llamacpp' does not map with a memory_basis"):
        kv_pool_settings(POOL, [("b", load_backend("llamacpp"))])
    assert apply_kv_pool(None, [("a", vllm, {"dtype": "float16"})]) == [{"dtype": "float16"}]


def test_a_cpu_campaign_cannot_declare_a_gpu_pool() -> None:
    raw = {
        "name": "c",
        "model": {"preset": "tiny"},
        "servers": [{"backend": "vllm-cpu"}],
        "workloads": [{"kind": "concurrency", "levels": [1], "input_len": 8, "output_len": 2}],
        "kv_pool": POOL.model_dump(),
    }
    with pytest.raises(ValidationError, match="kv_pool sizes GPU frameworks' KV pools"):
        CampaignSpec.model_validate(raw)


def test_gpu_agentic_renders_each_frameworks_own_value_and_the_report_shows_the_intent(tmp_path: Path) -> None:
    spec = load_campaign(GPU_AGENTIC)
    assert spec.kv_pool is not None and spec.kv_pool.share_of_gpu == 0.55
    cells = expand(spec, None)
    rendered = {}
    for cell in cells:
        launch = render_launch(cell.backend, cell.server.knobs, model="/model", served_model_name="m", port=8000)
        rendered[cell.server.label] = (launch.argv, launch.config_text or "")
    argv, _ = rendered["vllm-prefix"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.813"
    argv, _ = rendered["sglang-radix"]
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.738"
    _, config = rendered["trtllm-block-reuse"]
    assert "free_gpu_memory_fraction: 0.747" in config
    # The report's table, read from the campaign copy: the declared pool beside each framework's knob and value.
    shutil.copy(GPU_AGENTIC, tmp_path / "campaign.yaml")
    table = kv_pool_table(tmp_path)
    assert list(table["server"]) == ["vllm-prefix", "vllm-no-prefix", "sglang-radix", "trtllm-block-reuse"]
    assert list(table["value"]) == ["0.813", "0.813", "0.738", "0.747"]
    assert set(table["declared KV pool"]) == {"55% of 79.6 GiB = 43.8 GiB"}
    assert list(table["framework knob"])[2:] == ["--mem-fraction-static", "kv_cache_config.free_gpu_memory_fraction"]
