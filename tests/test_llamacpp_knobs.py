"""llama.cpp's quantization and speculative knobs: resolved to a GGUF file and to server flags.

``quantization`` renders no flag: the launcher serves the GGUF ``llama-quantize`` wrote for
that type, cached beside the bf16 conversion. These tests run the real resolution and caching
code against a stand-in ``llama-quantize`` (a script that records its argv and copies the file),
so they need no llama.cpp build.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bakeoff.backends.knobs import model_file_choice
from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.errors import KnobError, LaunchError
from bakeoff.models import gguf

STAND_IN = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls.log"
cp "$1" "$2"
"""


@pytest.fixture
def llamacpp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "llamacpp"
    (home / "bin").mkdir(parents=True)
    tool = home / "bin" / "llama-quantize"
    tool.write_text(STAND_IN)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("BAKEOFF_LLAMACPP_HOME", str(home))
    return home


@pytest.fixture
def model_with_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    model = tmp_path / "model"
    bf16 = gguf.default_gguf_path(model)
    bf16.parent.mkdir(parents=True)
    bf16.write_bytes(b"GGUF bf16")
    # The conversion itself is tested in test_llamacpp.py; here it is the cached file.
    monkeypatch.setattr(gguf, "convert_to_gguf", lambda model_dir, out=None, outtype="bf16": bf16)
    return model


def test_the_quantization_knob_picks_the_file_not_a_flag() -> None:
    backend = load_backend("llamacpp")
    plain = render_launch(backend, {}, model="/m.gguf", served_model_name="t", port=1).argv
    quantized = render_launch(backend, {"quantization": "q4_k_m"}, model="/m.gguf", served_model_name="t", port=1)
    assert quantized.argv == plain
    assert model_file_choice(backend, {"quantization": "q4_k_m"}) == "q4_k_m"
    assert model_file_choice(backend, {}) == "none"
    assert model_file_choice(load_backend("vllm-cpu"), {}) == "none"
    with pytest.raises(KnobError, match="choose one of"):
        model_file_choice(backend, {"quantization": "awq"})


@pytest.mark.parametrize(("knob", "native"), [("q8_0", "Q8_0"), ("q4_k_m", "Q4_K_M"), ("q4_0", "Q4_0")])
def test_each_type_is_quantized_once_and_cached(
    llamacpp_home: Path, model_with_bf16: Path, knob: str, native: str
) -> None:
    path = gguf.gguf_for_quantization(model_with_bf16, knob)
    assert path == model_with_bf16 / "gguf" / f"model-{knob}.gguf"
    assert path.read_bytes() == b"GGUF bf16"
    again = gguf.gguf_for_quantization(model_with_bf16, knob)
    assert again == path
    calls = (llamacpp_home / "bin" / "calls.log").read_text().splitlines()
    assert len(calls) == 1 and calls[0].split()[-1] == native
    assert gguf.conversion_seconds(path) is not None


def test_a_newer_bf16_conversion_makes_the_quantized_file_stale(llamacpp_home: Path, model_with_bf16: Path) -> None:
    path = gguf.gguf_for_quantization(model_with_bf16, "q8_0")
    bf16 = gguf.default_gguf_path(model_with_bf16)
    later = path.stat().st_mtime + 10
    os.utime(bf16, (later, later))
    gguf.gguf_for_quantization(model_with_bf16, "q8_0")
    assert len((llamacpp_home / "bin" / "calls.log").read_text().splitlines()) == 2


def test_none_serves_the_bf16_conversion(llamacpp_home: Path, model_with_bf16: Path) -> None:
    assert gguf.gguf_for_quantization(model_with_bf16, "none") == gguf.default_gguf_path(model_with_bf16)
    assert not (llamacpp_home / "bin" / "calls.log").exists()


def test_a_failing_quantizer_leaves_no_file(llamacpp_home: Path, model_with_bf16: Path) -> None:
    (llamacpp_home / "bin" / "llama-quantize").write_text("#!/bin/sh\necho 'bad type' >&2\nexit 3\n")
    with pytest.raises(LaunchError, match="bad type"):
        gguf.gguf_for_quantization(model_with_bf16, "q4_0")
    assert list((model_with_bf16 / "gguf").glob("model-q4_0*.gguf*")) == [
        model_with_bf16 / "gguf" / "model-q4_0.gguf.quantize.log"
    ]


@pytest.mark.parametrize(
    ("knobs", "words"),
    [
        (
            {"speculative": "draft"},
            ["--spec-type", "draft-simple", "--model-draft", "/d.gguf", "--spec-draft-n-max", "4"],
        ),
        (
            {"speculative": "ngram", "num_speculative_tokens": 6},
            ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "6"],
        ),
    ],
)
def test_speculative_renders_the_servers_flags(knobs: dict[str, str | int], words: list[str]) -> None:
    argv = render_launch(
        load_backend("llamacpp"), knobs, model="/m.gguf", served_model_name="t", port=1, draft_model="/d.gguf"
    ).argv
    start = argv.index("--spec-type")
    assert argv[start : start + len(words)] == words


def test_speculative_tokens_without_a_method_is_refused() -> None:
    with pytest.raises(KnobError, match="only takes effect with 'speculative'"):
        render_launch(
            load_backend("llamacpp"), {"num_speculative_tokens": 4}, model="/m", served_model_name="t", port=1
        )


def test_vllm_cpu_quantization_is_a_checkpoint_not_a_flag() -> None:
    backend = load_backend("vllm-cpu")
    with pytest.raises(KnobError, match="choose one of: none, w4a16"):
        render_launch(backend, {"quantization": "awq"}, model="/m", served_model_name="t", port=1)
    # w4a16 picks the GPTQ checkpoint the launcher serves; vLLM reads its scheme from the checkpoint.
    launch = render_launch(backend, {"quantization": "w4a16"}, model="/m", served_model_name="t", port=1)
    assert "--quantization" not in launch.argv


def test_effective_dtypes_name_what_each_server_stores() -> None:
    from bakeoff.backends.knobs import effective_dtypes

    llamacpp, vllm_cpu = load_backend("llamacpp"), load_backend("vllm-cpu")
    types = {"Q4_0": 14, "F32": 5, "Q6_K": 1}
    assert effective_dtypes(llamacpp, {"quantization": "q4_0"}, types) == {
        "weights": "Q4_0 x14, F32 x5, Q6_K x1",
        "kv_cache": "f16",
    }
    assert effective_dtypes(llamacpp, {"kv_cache_dtype": "q8_0"}, None)["kv_cache"] == "q8_0"
    assert effective_dtypes(vllm_cpu, {}, None) == {"weights": "bfloat16", "kv_cache": "bfloat16"}
    assert effective_dtypes(vllm_cpu, {"kv_cache_dtype": "fp8"}, None)["kv_cache"] == "fp8"
    assert effective_dtypes(vllm_cpu, {"quantization": "w4a16"}, None)["weights"] == "w4a16"
    served = {"BF16": 9, "INT4 g128 (packed)": 21}
    assert effective_dtypes(vllm_cpu, {"quantization": "w4a16"}, served)["weights"] == "BF16 x9, INT4 g128 (packed) x21"
