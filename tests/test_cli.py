"""The command line: exit codes and messages a user acts on, without starting any server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def bakeoff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bakeoff", *args], capture_output=True, text=True, timeout=120)


def test_backends_list_names_every_spec() -> None:
    done = bakeoff("backends", "list")
    assert done.returncode == 0
    for name in ("vllm", "sglang", "trtllm", "trtllm-engine", "vllm-cpu", "vllm-cpu-container", "llamacpp"):
        assert name in done.stdout


def test_backends_show_prints_the_exact_container_command() -> None:
    done = bakeoff("backends", "show", "trtllm", "--knob", "max_num_seqs=64", "--knob", "chunked_prefill=true")
    assert done.returncode == 0, done.stderr
    assert "run -d" in done.stdout and "--ipc=host" in done.stdout
    assert "max_batch_size: 64" in done.stdout and "enable_chunked_prefill: true" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["backends", "show", "sglang", "--knob", "colour=1"], "backend 'sglang', knob 'colour'"),
        (["backends", "show", "llamacpp", "--knob", "tensor_parallel_size=2"], "knob 'tensor_parallel_size'"),
        (["backends", "show", "vllm", "--knob", "max_num_seqs"], "write it as name=value"),
        (["campaign", "validate", "nowhere.yaml"], "campaign file not found: nowhere.yaml"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(args: list[str], message: str) -> None:
    done = bakeoff(*args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("flag", "value"), [("--concurrency", "0"), ("--input-len", "-5"), ("--output-len", "x"), ("--num-requests", "0")]
)
def test_bench_refuses_bad_numbers_naming_the_flag(flag: str, value: str, tmp_path: Path) -> None:
    args = {"--concurrency": "1", "--num-requests": "1", "--input-len": "8", "--output-len": "8"}
    args[flag] = value
    flat = [item for pair in args.items() for item in pair]
    done = bakeoff("bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--out", str(tmp_path), *flat)
    assert done.returncode == 2
    assert flag in done.stderr


def test_model_quantize_of_a_model_not_made_names_the_command_that_makes_it(tmp_path: Path) -> None:
    env = {**os.environ, "BAKEOFF_MODELS_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "bakeoff", "model", "quantize", "--preset", "trained", "--scheme", "w4a8"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "run `bakeoff model make --preset trained`" in done.stderr and "Traceback" not in done.stderr
