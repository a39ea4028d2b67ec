"""Tests of bakeoff.backends.spec and the backend YAMLs: every knob rendered, every refusal.

Every YAML in ``backends/`` is loaded, and every knob it maps is rendered with a
non-default value and checked where it must land: the flag and its value in argv, the
environment variable, or the nested key of the options file (and, for the engine flow,
the engine-build step). The GPU backends' flags are then checked word for word, as are
the compose files against the YAMLs they mirror. Nothing here needs a GPU.
"""

from __future__ import annotations

import copy
import functools
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from bakeoff.backends.knobs import check_knob, model_file_choice, parse_knob_args
from bakeoff.backends.launch_render import baked_knobs, change_cost, render_engine_build, render_launch
from bakeoff.backends.spec import (
    BACKENDS_DIR,
    DRAFT_MOUNT,
    KNOB_VOCABULARY,
    BackendSpec,
    KnobSpec,
    KnobValue,
    list_backends,
    load_backend,
)
from bakeoff.errors import KnobError, SpecError
from bakeoff.serving.containers import render_container_launch
from bakeoff.serving.show_launch import describe_launch

REPO = BACKENDS_DIR.parent
GPU_BACKENDS = ["vllm", "sglang", "trtllm", "trtllm-engine"]
ENGINE_DIRS = {
    "model": "/model",
    "checkpoint_dir": "/work/checkpoint",
    "engine_dir": "/work/engine",
}


def _render(backend: BackendSpec | str, knobs: dict[str, KnobValue] | None = None) -> Any:
    spec = load_backend(backend) if isinstance(backend, str) else backend
    return render_launch(spec, knobs or {}, model="/m", served_model_name="tiny", port=8123)


def _contains(argv: list[str], words: list[str]) -> bool:
    """True when ``words`` occur in ``argv`` as one contiguous run."""
    n = len(words)
    return any(argv[i : i + n] == words for i in range(len(argv) - n + 1))


def _config(launch: Any) -> dict[str, Any]:
    assert launch.config_text is not None
    data = yaml.safe_load(launch.config_text)
    assert isinstance(data, dict)
    return data


def _dotted(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


@functools.cache
def _shipped(name: str) -> BackendSpec:
    """A shipped backend as the parameter lists below see it: each file parsed once per collection,
    not once per knob (every pytest-xdist worker collects this module)."""
    return load_backend(name)


def _all_knobs() -> list[tuple[str, str]]:
    return [(name, knob) for name in list_backends() for knob in _shipped(name).knobs]


def _rendering_knobs() -> list[tuple[str, str]]:
    """Knobs with a target of their own (not parameters that fill another knob)."""
    return [(name, knob) for name, knob in _all_knobs() if _shipped(name).knobs[knob].fills is None]


def _fill_knobs() -> list[tuple[str, str]]:
    return [(name, knob) for name, knob in _all_knobs() if _shipped(name).knobs[knob].fills is not None]


def _sample(spec: KnobSpec) -> KnobValue:
    """A valid value different from the knob's default."""
    if spec.type == "bool":
        return not spec.default if spec.default is not None else True
    if spec.choices is not None:
        return next(c for c in spec.choices if c != spec.default)
    if spec.type == "int":
        number = max(int(spec.minimum or 1), 1) + 7
        if number == spec.default:
            number += 1
        assert spec.maximum is None or number <= spec.maximum
        return number
    if spec.type == "float":
        low = spec.minimum if spec.minimum is not None else 0.0
        high = spec.maximum if spec.maximum is not None else low + 1.0
        return round((low + high) / 2, 3)
    return "sample-value"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _filled(value: Any, tokens: int = 4) -> Any:
    """A value_map entry with ``{draft_model}`` and the speculative token count filled in."""
    if value == "{num_speculative_tokens}":
        return tokens
    if value == "{num_speculative_tokens+1}":
        return tokens + 1
    if isinstance(value, str):
        return value.replace("{draft_model}", DRAFT_MOUNT)
    if isinstance(value, list):
        return [_filled(v, tokens) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, tokens) for k, v in value.items()}
    return value


def _words(flag: str | None, native: Any) -> list[str]:
    items = [_text(v) for v in native] if isinstance(native, list) else [_text(native)]
    return [flag, *items] if flag else items


# --- every YAML loads and fits the vocabulary ------------------------------------------


@pytest.mark.parametrize("name", list_backends())
def test_every_backend_yaml_loads_within_the_vocabulary(name: str) -> None:
    backend = load_backend(name)
    assert backend.name == name
    assert set(backend.knobs) <= set(KNOB_VOCABULARY)
    assert set(backend.unsupported) <= set(KNOB_VOCABULARY)
    assert not set(backend.knobs) & set(backend.unsupported)


@pytest.mark.parametrize(("name", "knob"), _all_knobs())
def test_every_knob_default_is_a_value_it_accepts(name: str, knob: str) -> None:
    backend = load_backend(name)
    spec = backend.knobs[knob]
    if spec.default is not None:
        assert check_knob(backend, knob, spec.default) == spec.default
    else:
        # No default of its own (the framework decides): one that is always rendered would render "None".
        assert not spec.always_set
    # Any other valid value comes back as the knob's declared type.
    accepted = check_knob(backend, knob, _sample(spec))
    assert type(accepted) is {"int": int, "float": float, "bool": bool, "str": str}[spec.type]
    assert spec.note == "" or spec.note.strip() == spec.note


def test_the_gpu_backends_exist() -> None:
    assert set(GPU_BACKENDS) <= set(list_backends())


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_gpu_backends_run_in_a_pinned_image_with_gpu_ipc_and_ulimits(name: str) -> None:
    backend = load_backend(name)
    assert backend.runtime == "container" and backend.accelerator == "gpu"
    spec = backend.container
    assert spec is not None
    repo, _, tag = spec.image.rpartition(":")
    assert repo and tag and tag != "latest" and any(ch.isdigit() for ch in tag)
    assert spec.image.startswith(
        ("docker.io/vllm/vllm-openai:", "docker.io/lmsysorg/sglang:", "${NGC_REGISTRY}/nvidia/")
    )
    assert spec.gpus and spec.ipc_host
    assert "memlock=-1" in spec.ulimits and "stack=67108864" in spec.ulimits
    assert backend.health.path == "/health"
    assert backend.metrics.format == "prometheus" and backend.metrics.path
    # The server listens on the fixed container port; the YAML never uses {port}.
    assert "{port}" not in backend.command and "8000" in backend.command
    assert "{served_model_name}" in backend.command
    assert backend.request.extra_body == {"ignore_eos": True}


# --- every knob lands where its map says -----------------------------------------------


@pytest.mark.parametrize(("name", "knob"), _rendering_knobs())
def test_every_knob_renders_into_its_target(name: str, knob: str) -> None:
    backend = load_backend(name)
    spec = backend.knobs[knob]
    value = _sample(spec)
    launch = _render(backend, {knob: value})
    assert launch.knobs == {knob: check_knob(backend, knob, value)}
    assert knob in launch.non_default
    key = str(value).lower() if isinstance(value, bool) else str(value)
    native = _filled(spec.value_map.get(key, value))
    if spec.true_flag or spec.false_flag:
        flag = spec.true_flag if value else spec.false_flag
        other = spec.false_flag if value else spec.true_flag
        if flag:
            assert _contains(launch.argv, shlex.split(flag))
        if other:
            assert not _contains(launch.argv, shlex.split(other))
    elif spec.flag:
        if native is None:
            assert spec.flag not in launch.argv
        else:
            assert _contains(launch.argv, _words(spec.flag, native))
            assert launch.argv.count(spec.flag) == 1
    elif spec.env:
        assert launch.env[spec.env] == _text(native)
    elif spec.config_key:
        config = _config(launch)
        if native is None:
            with pytest.raises(KeyError):
                _dotted(config, spec.config_key)
        else:
            assert _dotted(config, spec.config_key) == native
    if spec.build_step is not None:
        steps = render_engine_build(backend, {knob: value}, **ENGINE_DIRS)
        default_steps = render_engine_build(backend, {}, **ENGINE_DIRS)
        if native is None:
            assert steps == default_steps
        else:
            assert _contains(steps[spec.build_step], _words(spec.build_flag, native))


@pytest.mark.parametrize(("name", "knob"), _fill_knobs())
def test_a_fill_knob_lands_inside_the_knob_it_fills(name: str, knob: str) -> None:
    backend = load_backend(name)
    spec = backend.knobs[knob]
    assert spec.fills is not None
    target = backend.knobs[spec.fills]
    method = next(v for v, native in target.value_map.items() if "{" + knob in json.dumps(native))
    value = _sample(spec)
    assert isinstance(value, int)
    launch = _render(backend, {spec.fills: method, knob: value})
    assert launch.non_default == {spec.fills: method, knob: value}
    expected = _filled(target.value_map[method], value)
    if target.flag:
        assert _contains(launch.argv, _words(target.flag, expected))
    else:
        assert target.config_key is not None
        assert _dotted(_config(launch), target.config_key) == expected
    # Alone it would change nothing: refused, naming the knob it needs.
    with pytest.raises(KnobError, match=f"only takes effect with '{spec.fills}'"):
        _render(backend, {knob: value})


@pytest.mark.parametrize(("name", "knob"), _all_knobs())
def test_an_unset_knob_adds_nothing_beyond_the_backends_own_launch(name: str, knob: str) -> None:
    """Left unset, a knob renders nothing of its own (unless always_set); each kind of target has its check."""
    backend = load_backend(name)
    spec = backend.knobs[knob]
    launch = _render(backend)
    steps = render_engine_build(backend, {}, **ENGINE_DIRS) if backend.engine_build is not None else []
    if spec.always_set:
        default = _text(spec.default)
        if spec.config_key:
            assert _dotted(_config(launch), spec.config_key) == spec.default
        elif spec.flag:
            assert _contains(launch.argv, [spec.flag, default])
        else:
            assert spec.build_step is not None and spec.build_flag is not None
            assert _contains(steps[spec.build_step], [spec.build_flag, default])
    elif spec.fills:
        assert "{" not in launch.command_line
    elif spec.true_flag or spec.false_flag:
        for flag in (spec.true_flag, spec.false_flag):
            if flag:
                assert not _contains(launch.argv, shlex.split(flag)), f"{flag} rendered with {knob} unset"
    elif spec.flag:
        assert spec.flag not in launch.argv or spec.flag in backend.command
    elif spec.env:
        # Only the backend's own environment may set it, and then to the default the knob declares
        # (vllm-cpu's VLLM_CPU_KVCACHE_SPACE=4): what `backends show` says is what the server gets.
        assert launch.env.get(spec.env) == backend.env.get(spec.env)
        if spec.env in backend.env:
            assert backend.env[spec.env] == _text(spec.default)
    elif spec.config_key:
        base = backend.config_file.base if backend.config_file else {}
        with pytest.raises(KeyError):
            _dotted(_config(launch) if launch.config_text is not None else {}, spec.config_key)
        assert spec.config_key.split(".")[0] not in base
    elif spec.model_file:
        # It picks the served file (llama.cpp's quantized GGUF), never a flag: unset, the default file.
        assert model_file_choice(backend, {}) == spec.default
        assert not set(map(str, spec.choices or [])) & set(launch.argv)
    elif spec.build_step is not None:
        # A build-only knob (the engine flow's quantization): none of its values in the build step.
        step = steps[spec.build_step]
        if spec.build_flag:
            assert spec.build_flag not in step
        natives = [_filled(n) for n in spec.value_map.values() if n is not None]
        assert natives or spec.build_flag, f"{knob}: a build knob with neither a flag nor mapped values"
        assert not any(_contains(step, _words(spec.build_flag, n)) for n in natives)
    else:
        pytest.fail(f"{name}.{knob}: a knob target this test has no check for; add a branch")


# --- vLLM, flag by flag ----------------------------------------------------------------


def test_vllm_command_and_value_flags() -> None:
    launch = _render(
        "vllm",
        {
            "max_num_seqs": 64,
            "max_num_batched_tokens": 4096,
            "gpu_memory_utilization": 0.85,
            "kv_cache_dtype": "fp8",
            "quantization": "fp8",
            "max_model_len": 2048,
            "tensor_parallel_size": 2,
        },
    )
    assert launch.argv[:4] == ["vllm", "serve", "/m", "--served-model-name"]
    for words in (
        ["--served-model-name", "tiny"],
        ["--host", "0.0.0.0"],
        ["--port", "8000"],
        ["--enable-prompt-tokens-details"],
        ["--max-num-seqs", "64"],
        ["--max-num-batched-tokens", "4096"],
        ["--gpu-memory-utilization", "0.85"],
        ["--kv-cache-dtype", "fp8"],
        ["--quantization", "fp8"],
        ["--max-model-len", "2048"],
        ["--tensor-parallel-size", "2"],
    ):
        assert _contains(launch.argv, words), words
    assert launch.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert launch.config_text is None


@pytest.mark.parametrize(
    ("knob", "on", "off"),
    [
        ("chunked_prefill", "--enable-chunked-prefill", "--no-enable-chunked-prefill"),
        ("prefix_caching", "--enable-prefix-caching", "--no-enable-prefix-caching"),
    ],
)
def test_vllm_bool_knobs_pick_the_true_or_false_flag(knob: str, on: str, off: str) -> None:
    for given, flag, absent in ((True, on, off), ("false", off, on), ("on", on, off)):
        argv = _render("vllm", {knob: given}).argv
        assert flag in argv and absent not in argv


def test_vllm_speculative_renders_compact_json_with_the_draft_mount() -> None:
    argv = _render("vllm", {"speculative": "ngram"}).argv
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    argv = _render("vllm", {"speculative": "draft", "num_speculative_tokens": 6}).argv
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "draft_model", "model": "/draft", "num_speculative_tokens": 6}
    argv = _render("vllm", {"speculative": "none", "quantization": "none"}).argv
    assert "--speculative-config" not in argv and "--quantization" not in argv


@pytest.mark.parametrize("name", list_backends())
def test_the_environment_a_reset_endpoint_needs_is_in_every_launch(name: str) -> None:
    """vLLM serves /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1: without it every reset is a 404."""
    backend = load_backend(name)
    needed = backend.cache_reset.env
    assert not needed or backend.cache_reset.kind == "http"
    assert needed.items() <= _render(backend).env.items()


# --- SGLang ----------------------------------------------------------------------------


def test_sglang_value_flags() -> None:
    launch = _render(
        "sglang",
        {
            "max_num_seqs": 48,
            "max_num_batched_tokens": 4096,
            "gpu_memory_utilization": 0.8,
            "max_model_len": 4096,
            "tensor_parallel_size": 2,
            "quantization": "w8a8_fp8",
        },
    )
    assert launch.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    for words in (
        ["--model-path", "/m"],
        ["--served-model-name", "tiny"],
        ["--enable-metrics"],
        ["--enable-cache-report"],
        ["--max-running-requests", "48"],
        ["--chunked-prefill-size", "4096"],
        ["--mem-fraction-static", "0.8"],
        ["--context-length", "4096"],
        ["--tp-size", "2"],
        ["--quantization", "w8a8_fp8"],
    ):
        assert _contains(launch.argv, words), words


def test_sglang_bool_knobs_and_their_native_spelling() -> None:
    assert _contains(_render("sglang", {"chunked_prefill": False}).argv, ["--chunked-prefill-size", "-1"])
    assert "--chunked-prefill-size" not in _render("sglang", {"chunked_prefill": True}).argv
    assert "--disable-radix-cache" in _render("sglang", {"prefix_caching": False}).argv
    assert "--disable-radix-cache" not in _render("sglang", {"prefix_caching": True}).argv
    argv = _render("sglang", {"kv_cache_dtype": "fp8"}).argv
    assert _contains(argv, ["--kv-cache-dtype", "fp8_e4m3"])


def test_sglang_refuses_two_knobs_on_one_flag() -> None:
    with pytest.raises(KnobError, match="both set --chunked-prefill-size"):
        _render("sglang", {"chunked_prefill": False, "max_num_batched_tokens": 4096})


def test_sglang_speculative_renders_the_algorithm_and_its_flags() -> None:
    argv = _render("sglang", {"speculative": "eagle"}).argv
    start = argv.index("--speculative-algorithm")
    # 4 proposed tokens in one chain: SGLang counts the verified root among its draft tokens.
    assert argv[start:] == [
        "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", "/draft",
        "--speculative-num-steps", "4",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "5",
    ]  # fmt: skip
    # SGLang's NGRAM is a trie-based token tree without a lookup window: another algorithm.
    with pytest.raises(
        KnobError, match=r"cannot take 'ngram': SGLang's NGRAM \(0.5.18 and 0.5.23\) drafts a token tree"
    ):
        _render("sglang", {"speculative": "ngram"})


# --- TensorRT-LLM, PyTorch flow --------------------------------------------------------


def test_trtllm_defaults_write_chunked_prefill_and_the_metrics_switches() -> None:
    launch = _render("trtllm")
    assert _config(launch) == {
        "enable_chunked_prefill": False,
        "enable_iter_perf_stats": True,
        "return_perf_metrics": True,
    }
    assert launch.argv[:2] == ["trtllm-serve", "/m"]
    assert _contains(launch.argv, ["--served_model_name", "tiny"])
    assert _contains(launch.argv, ["--backend", "pytorch"])
    assert launch.argv[-2:] == ["--config", "options.yaml"]
    assert launch.non_default == {}


def test_trtllm_knobs_nest_into_the_options_file() -> None:
    launch = _render(
        "trtllm",
        {
            "max_num_seqs": 128,
            "max_num_batched_tokens": 4096,
            "gpu_memory_utilization": 0.5,
            "chunked_prefill": True,
            "prefix_caching": False,
            "kv_cache_dtype": "fp8",
            "max_model_len": 8192,
            "tensor_parallel_size": 2,
            "speculative": "eagle3",
            "num_speculative_tokens": 3,
            "dtype": "float16",
        },
    )
    assert _config(launch) == {
        "enable_chunked_prefill": True,
        "enable_iter_perf_stats": True,
        "return_perf_metrics": True,
        "max_batch_size": 128,
        "max_num_tokens": 4096,
        "max_seq_len": 8192,
        "tensor_parallel_size": 2,
        "dtype": "float16",
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.5,
            "enable_block_reuse": False,
            "dtype": "fp8",
        },
        "speculative_config": {
            "decoding_type": "Eagle3",
            "max_draft_len": 3,
            "speculative_model_dir": "/draft",
        },
    }
    # Nothing of the tuning leaks onto the command line.
    assert "--max_batch_size" not in launch.argv and "--kv_cache_free_gpu_memory_fraction" not in launch.argv


def test_trtllm_ngram_and_no_speculation() -> None:
    config = _config(_render("trtllm", {"speculative": "ngram"}))
    assert config["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 3,
    }
    assert "speculative_config" not in _config(_render("trtllm", {"speculative": "none"}))


def test_trtllm_refuses_quantization_saying_why() -> None:
    with pytest.raises(KnobError) as err:
        _render("trtllm", {"quantization": "fp8"})
    message = str(err.value)
    assert "'trtllm'" in message and "'quantization'" in message and "pre-quantized" in message


# --- TensorRT-LLM, engine flow ---------------------------------------------------------


def test_trtllm_engine_build_steps_at_defaults() -> None:
    steps = render_engine_build(load_backend("trtllm-engine"), {}, **ENGINE_DIRS)
    assert steps[0] == [
        "python3", "/app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py",
        "--model_dir", "/model", "--output_dir", "/work/checkpoint", "--dtype", "float16",
    ]  # fmt: skip
    assert steps[1] == [
        "trtllm-build", "--checkpoint_dir", "/work/checkpoint", "--output_dir", "/work/engine",
        "--gemm_plugin", "auto", "--use_paged_context_fmha", "enable",
    ]  # fmt: skip
    assert steps[2][:2] == ["sh", "-c"] and "/work/engine/tokenizer" in steps[2][2]
    assert "{" not in steps[2][2].replace("{engine_dir}", "")
    assert steps[3] == ["rm", "-rf", "/work/checkpoint"]


def test_trtllm_engine_baked_knobs_go_to_the_build_and_the_runtime() -> None:
    backend = load_backend("trtllm-engine")
    knobs: dict[str, KnobValue] = {
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "max_model_len": 4096,
        "tensor_parallel_size": 2,
        "quantization": "int4_wo",
    }
    steps = render_engine_build(backend, knobs, **ENGINE_DIRS)
    assert steps[0][-5:] == [
        "--tp_size",
        "2",
        "--use_weight_only",
        "--weight_only_precision",
        "int4",
    ]
    assert steps[1][-6:] == [
        "--max_batch_size",
        "64",
        "--max_num_tokens",
        "2048",
        "--max_seq_len",
        "4096",
    ]
    config = _config(_render(backend, knobs))
    assert (config["max_batch_size"], config["max_num_tokens"]) == (64, 2048)
    assert (config["max_seq_len"], config["tensor_parallel_size"]) == (4096, 2)
    assert "quantization" not in config and "enable_iter_perf_stats" not in config


def test_trtllm_engine_serves_the_engine_folder_with_its_tokenizer() -> None:
    launch = _render("trtllm-engine")
    assert launch.argv[:6] == [
        "trtllm-serve",
        "/m",
        "--backend",
        "tensorrt",
        "--tokenizer",
        "/m/tokenizer",
    ]
    assert _config(launch) == {"enable_chunked_prefill": False, "return_perf_metrics": True}


def test_trtllm_engine_refuses_knobs_it_cannot_build() -> None:
    for knob, value in (("kv_cache_dtype", "fp8"), ("speculative", "ngram")):
        with pytest.raises(KnobError, match="trtllm-engine has no such knob"):
            _render("trtllm-engine", {knob: value})


def test_baked_knobs_fill_in_defaults() -> None:
    backend = load_backend("trtllm-engine")
    assert baked_knobs(backend, {"max_num_seqs": "32", "gpu_memory_utilization": 0.5}) == {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 8192,
        "max_model_len": None,
        "tensor_parallel_size": 1,
        "quantization": "none",
    }
    with pytest.raises(SpecError, match="no engine build"):
        render_engine_build(load_backend("vllm"), {}, **ENGINE_DIRS)


# --- change cost -----------------------------------------------------------------------


def test_change_cost_nothing_restart_rebuild() -> None:
    engine = load_backend("trtllm-engine")
    assert change_cost(engine, {"max_num_seqs": 64}, {"max_num_seqs": 64}) == "nothing"
    assert change_cost(engine, {}, {"gpu_memory_utilization": 0.5}) == "restart"
    assert change_cost(engine, {}, {"chunked_prefill": True}) == "restart"
    for knob, value in (
        ("max_num_seqs", 64),
        ("max_num_batched_tokens", 4096),
        ("max_model_len", 4096),
        ("tensor_parallel_size", 2),
        ("quantization", "int8_wo"),
    ):
        assert change_cost(engine, {}, {knob: value}) == "rebuild", knob
    assert change_cost(engine, {"prefix_caching": True}, {"prefix_caching": False, "max_num_seqs": 8}) == "rebuild"
    assert change_cost(load_backend("trtllm"), {}, {"max_num_seqs": 64}) == "restart"
    assert change_cost(load_backend("vllm"), {"max_num_seqs": 64}, {}) == "restart"


def test_every_baked_knob_costs_a_rebuild_and_only_those() -> None:
    for name in list_backends():
        backend = load_backend(name)
        for knob, spec in backend.knobs.items():
            assert (spec.build_step is not None) == (spec.change_needs == "rebuild"), (name, knob)


# --- refusals --------------------------------------------------------------------------


def test_unknown_knob_names_backend_and_knob() -> None:
    with pytest.raises(KnobError) as err:
        _render("vllm", {"max_num_seqz": 4})
    message = str(err.value)
    assert "'vllm'" in message and "'max_num_seqz'" in message and "not a bakeoff knob" in message


def test_knob_the_backend_lacks_lists_what_it_supports() -> None:
    with pytest.raises(KnobError) as err:
        _render("vllm", {"kv_cache_space_gib": 4})
    message = str(err.value)
    assert "vllm has no such knob" in message and "max_num_seqs" in message


@pytest.mark.parametrize(
    ("name", "knob", "value", "match"),
    [
        ("vllm", "kv_cache_dtype", "int4", "choose one of: auto, bfloat16"),
        ("sglang", "speculative", "medusa", "choose one of: none, eagle, eagle3, draft"),
        ("trtllm", "kv_cache_dtype", "fp8_e5m2", "choose one of: auto, fp8"),
        ("trtllm-engine", "quantization", "fp8", "choose one of: none, int8_wo, int4_wo"),
        ("vllm", "max_num_seqs", "many", "expected a int"),
        ("vllm", "max_num_seqs", 1.5, "expected a int"),
        ("trtllm", "max_num_seqs", True, "expected a int"),
        ("sglang", "gpu_memory_utilization", "most", "expected a float"),
        ("vllm", "prefix_caching", "maybe", "expected true/false"),
        ("vllm", "max_num_seqs", 0, "below the minimum 1"),
        ("sglang", "max_model_len", 8, "below the minimum 16"),
        ("trtllm", "gpu_memory_utilization", 0.01, "below the minimum 0.05"),
        ("vllm", "gpu_memory_utilization", 1.5, "above the maximum 1.0"),
    ],
)
def test_bad_values_are_refused_naming_backend_and_knob(name: str, knob: str, value: KnobValue, match: str) -> None:
    with pytest.raises(KnobError, match=match) as err:
        _render(name, {knob: value})
    assert f"'{name}'" in str(err.value) and f"'{knob}'" in str(err.value)


def test_cli_strings_are_coerced() -> None:
    knobs = parse_knob_args(["max_num_seqs=32", "prefix_caching=off", "gpu_memory_utilization=0.7"])
    launch = _render("vllm", knobs)
    assert launch.knobs == {
        "max_num_seqs": 32,
        "prefix_caching": False,
        "gpu_memory_utilization": 0.7,
    }
    with pytest.raises(SpecError):
        parse_knob_args(["max_num_seqs"])


# --- schema guards ---------------------------------------------------------------------


def _raw(name: str) -> dict[str, Any]:
    data = yaml.safe_load((BACKENDS_DIR / f"{name}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_a_baked_knob_must_say_rebuild() -> None:
    data = _raw("trtllm-engine")
    data["knobs"]["max_num_seqs"]["change_needs"] = "restart"
    with pytest.raises(ValueError, match="change_needs: rebuild"):
        BackendSpec.model_validate(data)


def test_knobs_baked_in_must_match_the_build_step_knobs() -> None:
    data = _raw("trtllm-engine")
    data["engine_build"]["knobs_baked_in"].remove("quantization")
    with pytest.raises(ValueError, match="knobs_baked_in"):
        BackendSpec.model_validate(data)
    data = _raw("trtllm-engine")
    data["knobs"]["quantization"]["build_step"] = 9
    with pytest.raises(ValueError, match="not an engine_build step"):
        BackendSpec.model_validate(data)


def test_a_knob_cannot_be_both_mapped_and_unsupported() -> None:
    data = _raw("trtllm")
    data["unsupported"]["max_num_seqs"] = "no"
    with pytest.raises(ValueError, match="both mapped and listed as unsupported"):
        BackendSpec.model_validate(data)


def test_a_knob_needs_one_runtime_target() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        KnobSpec.model_validate({"type": "int", "default": 1, "flag": "--a", "env": "A"})
    with pytest.raises(ValueError, match="exactly one of"):
        KnobSpec.model_validate({"type": "int", "default": 1})
    with pytest.raises(ValueError, match="build_flag needs build_step"):
        KnobSpec.model_validate({"type": "int", "default": 1, "flag": "--a", "build_flag": "--b"})


def test_unknown_placeholder_in_the_command_is_a_spec_error() -> None:
    data = _raw("vllm")
    data["command"] = [*data["command"], "{nope}"]
    with pytest.raises(SpecError, match="unknown placeholder"):
        _render(BackendSpec.model_validate(data))


# --- compose files mirror the YAMLs ----------------------------------------------------


def _compose(name: str) -> dict[str, Any]:
    data = yaml.safe_load((REPO / "docker" / name / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("folder", "service", "backend_name"),
    [
        ("vllm", "vllm", "vllm"),
        ("sglang", "sglang", "sglang"),
        ("trtllm", "trtllm", "trtllm"),
        ("trtllm", "trtllm-engine", "trtllm-engine"),
    ],
)
def test_compose_service_matches_its_backend(folder: str, service: str, backend_name: str) -> None:
    svc = copy.deepcopy(_compose(folder)["services"][service])
    backend = load_backend(backend_name)
    assert backend.container is not None
    launch = render_container_launch(backend, {}, served_model_name="${SERVED_MODEL_NAME:-model}")
    assert svc["image"] == backend.container.image
    assert [*svc["entrypoint"], *svc["command"]] == launch.argv
    assert svc["ipc"] == "host"
    assert svc["ulimits"] == {
        "memlock": {"soft": -1, "hard": -1},
        "stack": {"soft": 67108864, "hard": 67108864},
    }
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert svc["ports"] == ["127.0.0.1:${PORT:-8000}:8000"]
    assert any(v.endswith(":/model:ro") for v in svc["volumes"])
    assert svc.get("environment", {}) == launch.env
    assert "/health" in " ".join(svc["healthcheck"]["test"])
    if launch.config_text is not None:
        host_file = next(v.split(":")[0] for v in svc["volumes"] if v.endswith(":/bakeoff/options.yaml:ro"))
        shipped = yaml.safe_load((REPO / "docker" / folder / host_file).read_text())
        assert shipped == yaml.safe_load(launch.config_text)


# --- describe_launch -------------------------------------------------------------------


def test_describe_shows_command_options_costs_and_notes() -> None:
    text = describe_launch("trtllm-engine", {"max_num_seqs": 64, "chunked_prefill": "true"}, model="/models/tiny")
    assert "${NGC_REGISTRY}/nvidia/tensorrt-llm/release:" in text
    assert "--ipc=host" in text and "--ulimit memlock=-1" in text
    # Without the model folder the cache key is unknown; the engine folder is still named.
    assert "<key>/engine:/model:ro" in text and "not built yet" in text
    assert "--served_model_name tiny" in text
    assert "trtllm-build" in text and "--max_batch_size 64" in text
    assert "options.yaml (--config):" in text and "enable_chunked_prefill: true" in text
    assert "max_num_seqs = 64 (default: 2048): changing it needs rebuild" in text
    assert "chunked_prefill = true (default: false): changing it needs restart" in text
    assert "notes:" in text


def test_describe_engine_flow_mounts_the_cached_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bakeoff.serving.engine_build import engine_cache_key

    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    backend = load_backend("trtllm-engine")
    key = engine_cache_key(model, backend, {"max_num_seqs": 8})
    engine = tmp_path / "cache" / "engines" / key / "engine"
    text = describe_launch("trtllm-engine", {"max_num_seqs": 8}, model=str(model))
    assert f"-v {engine}:/model:ro" in text and "not built yet" in text
    engine.mkdir(parents=True)
    (engine / "config.json").write_text("{}")
    (engine.parent / "build.json").write_text('{"seconds": 1}')
    text = describe_launch("trtllm-engine", {"max_num_seqs": 8}, model=str(model))
    assert f"already built: {engine}" in text and "--served_model_name tiny" in text


def test_describe_a_process_backend_and_defaults() -> None:
    text = describe_launch("vllm-cpu", {})
    assert "all at the backend's defaults" in text
    assert "vllm.entrypoints.openai.api_server" in text
    text = describe_launch("vllm", {"max_num_seqs": 8})
    assert "max_num_seqs = 8 (default: chosen by the backend): changing it needs restart" in text
    assert "VLLM_SERVER_DEV_MODE=1" in text


def test_describe_refuses_like_render() -> None:
    with pytest.raises(KnobError):
        describe_launch("sglang", {"threads": 4})
    with pytest.raises(SpecError, match="unknown backend"):
        describe_launch("nope", {})


def test_container_rendering_points_the_config_flag_inside() -> None:
    backend = load_backend("trtllm")
    launch = render_container_launch(backend, {"max_num_seqs": 4}, served_model_name="m")
    assert launch.argv[-2:] == ["--config", "/bakeoff/options.yaml"]
    assert launch.argv[1] == "/model"
    assert Path(launch.argv[-1]).name == "options.yaml"


# --- one knob value, one algorithm and one token count on every backend -----------------

SPECULATIVE_BACKENDS = ["vllm", "sglang", "trtllm", "vllm-cpu", "llamacpp"]


def _speculation(name: str, knobs: dict[str, KnobValue]) -> tuple[str, int]:
    """(native method name, tokens proposed per step) as the framework will read them."""
    launch = _render(name, knobs)
    if name == "llamacpp":
        argv = launch.argv
        size = "--spec-draft-n-max" if "--spec-draft-n-max" in argv else "--spec-ngram-simple-size-m"
        return argv[argv.index("--spec-type") + 1], int(argv[argv.index(size) + 1])
    if name in ("vllm", "vllm-cpu"):
        config = json.loads(launch.argv[launch.argv.index("--speculative-config") + 1])
        return str(config["method"]), int(config["num_speculative_tokens"])
    if name == "sglang":
        argv = launch.argv
        steps = int(argv[argv.index("--speculative-num-steps") + 1])
        assert argv[argv.index("--speculative-eagle-topk") + 1] == "1"
        # SGLang refuses topk 1 unless draft tokens = steps + 1 (the root is counted).
        assert int(argv[argv.index("--speculative-num-draft-tokens") + 1]) == steps + 1
        return argv[argv.index("--speculative-algorithm") + 1], steps
    spec = _config(launch)["speculative_config"]
    return str(spec["decoding_type"]), int(spec["max_draft_len"])


NATIVE_METHODS = {
    "eagle": {"vllm": "eagle", "sglang": "EAGLE"},
    "eagle3": {"vllm": "eagle3", "sglang": "EAGLE3", "trtllm": "Eagle3"},
    "draft": {
        "vllm": "draft_model",
        "sglang": "STANDALONE",
        "trtllm": "Draft_Target",
        "vllm-cpu": "draft_model",
        "llamacpp": "draft-simple",
    },
    "ngram": {"vllm": "ngram", "trtllm": "NGram", "vllm-cpu": "ngram", "llamacpp": "ngram-simple"},
}


@pytest.mark.parametrize("method", sorted(NATIVE_METHODS))
@pytest.mark.parametrize("tokens", [None, 2, 7])
def test_a_speculative_value_means_one_algorithm_and_token_count_everywhere(method: str, tokens: int | None) -> None:
    knobs: dict[str, KnobValue] = {"speculative": method}
    if tokens is not None:
        knobs["num_speculative_tokens"] = tokens
    for name in SPECULATIVE_BACKENDS:
        native = NATIVE_METHODS[method].get(name)
        if native is None:
            # Where the framework lacks the algorithm, the value is refused with a reason.
            with pytest.raises(KnobError, match=f"cannot take '{method}': "):
                _render(name, knobs)
            continue
        assert _speculation(name, knobs) == (native, tokens or 4)


def test_num_speculative_tokens_has_one_default_on_every_backend() -> None:
    defaults = {
        name: load_backend(name).knobs["num_speculative_tokens"].default
        for name in list_backends()
        if "num_speculative_tokens" in load_backend(name).knobs
    }
    assert set(defaults) == set(SPECULATIVE_BACKENDS)
    assert set(defaults.values()) == {4}


def test_ngram_looks_up_the_same_window_on_vllm_and_trtllm() -> None:
    argv = _render("vllm", {"speculative": "ngram"}).argv
    vllm = json.loads(argv[argv.index("--speculative-config") + 1])
    trtllm = _config(_render("trtllm", {"speculative": "ngram"}))["speculative_config"]
    # vLLM tries n-grams from prompt_lookup_max down to prompt_lookup_min; TensorRT-LLM from
    # max_matching_ngram_size down to 1.
    assert vllm["prompt_lookup_min"] == 1
    assert vllm["prompt_lookup_max"] == trtllm["max_matching_ngram_size"] == 3


def test_trtllm_refuses_eagle_one_because_its_eagle_is_eagle3() -> None:
    with pytest.raises(KnobError, match=r"EAGLE-3 heads only.*use eagle3"):
        _render("trtllm", {"speculative": "eagle"})


# --- values a pinned framework version cannot take, kernels, warnings, dtype ----------


def test_vllm_refuses_bitsandbytes_quoting_why() -> None:
    with pytest.raises(
        KnobError, match=r'0.33.0 cannot take .bitsandbytes.*plugin package.*"Unknown quantization method"'
    ):
        _render("vllm", {"quantization": "bitsandbytes"})
    # SGLang still ships it (0.5.18 and 0.5.23: arg_groups/choices.py QUANTIZATION_CHOICES).
    assert _contains(_render("sglang", {"quantization": "bitsandbytes"}).argv, ["--quantization", "bitsandbytes"])


def test_sglang_awq_runs_the_marlin_kernel_like_vllm() -> None:
    argv = _render("sglang", {"quantization": "awq"}).argv
    assert _contains(argv, ["--quantization", "awq_marlin"]) and "awq" not in argv


def test_vllm_chunked_prefill_off_carries_vllms_warning() -> None:
    launch = _render("vllm", {"chunked_prefill": False})
    assert len(launch.warnings) == 1
    assert "chunked_prefill=false" in launch.warnings[0] and "crash or produce incorrect outputs" in launch.warnings[0]
    assert _render("vllm", {"chunked_prefill": True}).warnings == []
    assert _render("vllm").warnings == []
    text = describe_launch("vllm", {"chunked_prefill": False})
    assert "warnings:" in text and "crash or produce incorrect outputs" in text


def test_dtype_is_a_shared_knob_with_each_frameworks_spelling() -> None:
    assert "dtype" in KNOB_VOCABULARY
    assert _contains(_render("vllm", {"dtype": "float16"}).argv, ["--dtype", "float16"])
    assert _contains(_render("sglang", {"dtype": "float16"}).argv, ["--dtype", "float16"])
    assert _config(_render("trtllm", {"dtype": "float16"}))["dtype"] == "float16"
    with pytest.raises(KnobError, match="converted in float16"):
        _render("trtllm-engine", {"dtype": "float16"})
    assert _contains(_render("vllm-cpu", {"dtype": "float32"}).argv, ["--dtype", "float32"])
    with pytest.raises(KnobError, match="weight type is fixed when the GGUF is written"):
        _render("llamacpp", {"dtype": "float16"})


def test_a_fill_knob_has_no_target_of_its_own_and_fills_a_mapped_knob() -> None:
    with pytest.raises(ValueError, match="renders through the knob it fills"):
        KnobSpec.model_validate({"type": "int", "default": 4, "fills": "speculative", "flag": "--n"})
    vllm = yaml.safe_load((BACKENDS_DIR / "vllm.yaml").read_text())
    del vllm["knobs"]["speculative"]
    with pytest.raises(ValueError, match="fills 'speculative', which this backend does not map"):
        BackendSpec.model_validate(vllm)


# --- eager mode -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("vllm", ["--enforce-eager"]),
        ("vllm-cpu", ["--enforce-eager"]),
        ("vllm-cpu-container", ["--enforce-eager"]),
        ("sglang", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]),
    ],
)
def test_enforce_eager_renders_each_frameworks_switch_and_nothing_when_off(name: str, words: list[str]) -> None:
    on, off = _render(name, {"enforce_eager": True}), _render(name, {"enforce_eager": False})
    assert " ".join(words) in " ".join(on.argv)
    assert not set(words) & set(off.argv)
    assert on.non_default == {"enforce_eager": True} and off.non_default == {}


@pytest.mark.parametrize(
    ("name", "why"), [("trtllm", "cuda_graph_config"), ("trtllm-engine", "ahead of time"), ("llamacpp", "no graph")]
)
def test_enforce_eager_is_refused_where_there_is_no_eager_switch(name: str, why: str) -> None:
    with pytest.raises(KnobError) as err:
        _render(name, {"enforce_eager": True})
    assert f"'{name}'" in str(err.value) and why in str(err.value)
