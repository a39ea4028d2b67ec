"""The findings of moving to vLLM 0.33, SGLang 0.5.23 and TensorRT-LLM 1.3.0rc29, one test each.

Read from the released code (the wheels ``bakeoff backends audit`` reads, TensorRT-LLM's
repository): vLLM 0.33 refuses a bfloat16 KV cache with another model dtype; its async
scheduling default moved (n-gram included), so a campaign running speculative methods pins
it and every run records it; TensorRT-LLM's draft-target tag is ``Draft_Target``; usage
telemetry needs ``TRTLLM_NO_USAGE_STATS=1``; the engine flow stays on an image that still
has ``trtllm-build``; an earlier release stays selectable with ``image_tag``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.cells import expand
from bakeoff.campaign.specs import load_campaign
from bakeoff.errors import KnobError, SpecError
from bakeoff.host.gpu_checks import check_model_dtype
from bakeoff.observe.origin import framework_version


def _campaign(tmp_path: Path, servers: list[dict[str, Any]]) -> Path:
    path = tmp_path / "c.yaml"
    body = {
        "name": "pins",
        "gpu": True,
        "repeats": 1,
        "model": {"hf_id": "org/name", "context_len": 4096},
        "servers": servers,
        "workloads": [{"kind": "concurrency", "levels": [1], "input_len": 8, "output_len": 8}],
    }
    path.write_text(yaml.safe_dump(body))
    return path


def _checkpoint(tmp_path: Path, dtype: str) -> Path:
    folder = tmp_path / f"ckpt-{dtype}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"torch_dtype": dtype, "max_position_embeddings": 4096}))
    return folder


# --- vLLM 0.33: a bfloat16 KV cache needs a bfloat16 model --------------------------------


def test_bf16_kv_with_a_float16_model_is_refused_naming_the_fix() -> None:
    with pytest.raises(
        SpecError, match=r"servers\[0\]\.knobs\.kv_cache_dtype: vllm 0\.33\.0 refuses.*set dtype: bfloat16"
    ):
        check_model_dtype("servers[0]", load_backend("vllm"), {"kv_cache_dtype": "bfloat16", "dtype": "float16"}, None)


def test_bf16_kv_with_dtype_auto_follows_the_checkpoint(tmp_path: Path) -> None:
    vllm = load_backend("vllm")
    knobs: dict[str, Any] = {"kv_cache_dtype": "bfloat16"}
    with pytest.raises(SpecError, match=r"model dtype is float16 \(dtype auto on .*config\.json\)"):
        check_model_dtype("servers[0]", vllm, knobs, _checkpoint(tmp_path, "float16"))
    check_model_dtype("servers[0]", vllm, knobs, _checkpoint(tmp_path, "bfloat16"))  # auto keeps bf16
    check_model_dtype("servers[0]", vllm, {**knobs, "dtype": "bfloat16"}, None)
    with pytest.raises(SpecError, match="model dtype is unknown"):
        check_model_dtype("servers[0]", vllm, knobs, None)  # the server would only find out at start-up


def test_a_campaign_with_the_bad_combination_fails_validation(tmp_path: Path) -> None:
    path = _campaign(tmp_path, [{"backend": "vllm", "knobs": {"dtype": "float16", "kv_cache_dtype": "bfloat16"}}])
    with pytest.raises(SpecError, match="refuses kv_cache_dtype bfloat16"):
        expand(load_campaign(path), None)


def test_sglang_takes_a_bf16_kv_cache_with_any_model_dtype() -> None:
    check_model_dtype("servers[0]", load_backend("sglang"), {"kv_cache_dtype": "bfloat16", "dtype": "float16"}, None)


# --- vLLM's async scheduling: pinned where speculative methods run, recorded per run ------


def test_a_speculative_campaign_pins_async_scheduling_on_every_vllm_server(tmp_path: Path) -> None:
    servers = [
        {"backend": "vllm", "label": "base"},
        {"backend": "vllm", "label": "ngram", "knobs": {"speculative": "ngram"}},
        {"backend": "vllm", "label": "mine", "knobs": {"speculative": "ngram", "async_scheduling": True}},
        {"backend": "sglang", "label": "sg"},
    ]
    cells = {c.server.label: c for c in expand(load_campaign(_campaign(tmp_path, servers)), None)}
    assert cells["base"].server.knobs["async_scheduling"] is False
    assert cells["ngram"].server.knobs["async_scheduling"] is False
    assert cells["mine"].server.knobs["async_scheduling"] is True  # set on purpose: kept
    assert "async_scheduling" not in cells["sg"].server.knobs
    launch = render_launch(
        cells["ngram"].backend, cells["ngram"].server.knobs, model="/m", served_model_name="m", port=1
    )
    assert "--no-async-scheduling" in launch.argv
    assert launch.effective_knobs["async_scheduling"] is False


def test_without_speculative_decoding_nothing_is_pinned_and_the_default_is_recorded(tmp_path: Path) -> None:
    servers = [{"backend": "vllm", "label": "a"}, {"backend": "vllm", "label": "b", "knobs": {"speculative": "none"}}]
    cells = expand(load_campaign(_campaign(tmp_path, servers)), None)
    assert all("async_scheduling" not in c.server.knobs for c in cells)
    launch = render_launch(cells[0].backend, cells[0].server.knobs, model="/m", served_model_name="m", port=1)
    assert not any("async-scheduling" in w for w in launch.argv)
    assert launch.effective_knobs["async_scheduling"] is True  # what 0.33 resolves None to


def test_a_pin_must_name_a_knob_of_its_backend() -> None:
    vllm = load_backend("vllm")
    spec = vllm.model_dump()
    spec["knobs"]["async_scheduling"]["pin_with"]["knob"] = "threads"
    with pytest.raises(ValueError, match="pinned with 'threads'"):
        type(vllm).model_validate(spec)


@pytest.mark.parametrize(("method", "words"), [("eagle3", "hit rates read higher"), ("draft", "caps max_model_len")])
def test_what_vllm_033_measures_differently_is_carried_into_the_report(method: str, words: str) -> None:
    knobs = {"speculative": method}
    launch = render_launch(load_backend("vllm"), knobs, model="/m", served_model_name="m", port=1)
    assert any(words in w for w in launch.warnings)
    plain = render_launch(load_backend("vllm"), {"speculative": "ngram"}, model="/m", served_model_name="m", port=1)
    assert not plain.warnings


# --- TensorRT-LLM 1.3.0rc29 ---------------------------------------------------------------


def test_trtllm_renders_the_draft_target_tag_of_its_tagged_union() -> None:
    launch = render_launch(load_backend("trtllm"), {"speculative": "draft"}, model="/m", served_model_name="m", port=1)
    assert launch.config_text is not None
    config = yaml.safe_load(launch.config_text)
    # llmapi/llm_args.py: DraftTargetDecodingConfig.decoding_type: Literal["Draft_Target"]
    assert config["speculative_config"]["decoding_type"] == "Draft_Target"


@pytest.mark.parametrize("name", ["trtllm", "trtllm-engine"])
def test_trtllm_usage_telemetry_is_off(name: str) -> None:
    launch = render_launch(load_backend(name), {}, model="/m", served_model_name="m", port=1)
    assert launch.env["TRTLLM_NO_USAGE_STATS"] == "1"


def _rc(image: str) -> int:
    match = re.search(r":1\.3\.0rc(\d+)", image)
    assert match is not None, image
    return int(match.group(1))


def test_the_engine_flow_stays_on_an_image_that_ships_trtllm_build() -> None:
    engine = load_backend("trtllm-engine")
    assert engine.engine_build is not None and engine.container is not None
    # Release images after rc20 have no trtllm-build; the PyTorch flow moved past that.
    assert _rc(engine.engine_build.image) <= 20 and _rc(engine.container.image) == _rc(engine.engine_build.image)
    pytorch = load_backend("trtllm").container
    assert pytorch is not None and _rc(pytorch.image) > 20


# --- the previous pins stay selectable -------------------------------------------------------


def test_image_tag_selects_the_previous_vllm_and_records_its_version(tmp_path: Path) -> None:
    servers = [
        {"backend": "vllm", "label": "new"},
        {"backend": "vllm", "label": "old", "image_tag": "v0.31.0-cu129"},
    ]
    cells = {c.server.label: c for c in expand(load_campaign(_campaign(tmp_path, servers)), None)}
    old = cells["old"].backend
    assert old.container is not None and old.container.image == "docker.io/vllm/vllm-openai:v0.31.0-cu129"
    assert framework_version(old, {}) == "0.31.0" and framework_version(cells["new"].backend, {}) == "0.33.0"
    with pytest.raises(KnobError, match=r"vllm 0\.31\.0 cannot take 'bitsandbytes'"):
        render_launch(old, {"quantization": "bitsandbytes"}, model="/m", served_model_name="m", port=1)


def test_a_tag_that_names_no_release_keeps_the_declared_version(tmp_path: Path) -> None:
    path = _campaign(tmp_path, [{"backend": "sglang", "image_tag": "latest"}])
    [cell] = expand(load_campaign(path), None)
    assert cell.backend.version == load_backend("sglang").version
