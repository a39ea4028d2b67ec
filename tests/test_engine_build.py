"""Tests of bakeoff.serving.engine_build: the cache key, the rendered container steps, the cache.

Steps run through a fake runner that records each command and, for ``trtllm-build``,
writes an engine config where the real build would, so caching and failure handling are
tested on CPU. ``docker/trtllm/build-engine.sh`` is run with a fake container runtime
and must compute the same key and issue the same steps. The one real build needs an
NVIDIA GPU and the TensorRT-LLM image, and is skipped without them.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bakeoff.backends.spec import BACKENDS_DIR, KnobValue, load_backend
from bakeoff.errors import LaunchError, SpecError
from bakeoff.serving.engine_build import (
    EngineBuild,
    build_engine,
    default_cache_dir,
    engine_cache_key,
    engine_key_manifest,
    engine_step_args,
)
from bakeoff.serving.gpu_pinning import GpuAssignment

SCRIPT = BACKENDS_DIR.parent / "docker" / "trtllm" / "build-engine.sh"
ENGINE = load_backend("trtllm-engine")
IMAGE = "${NGC_REGISTRY}/nvidia/tensorrt-llm/release:1.3.0rc14"


def _gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0


def _model(root: Path, seed: int = 0) -> Path:
    """A stand-in model folder: config, tokenizer, and 3 MiB of 'weights'."""
    folder = root / f"model-{seed}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (folder / "tokenizer.json").write_text('{"model": "bpe"}')
    (folder / "model.safetensors").write_bytes(bytes((i * 7 + seed) % 251 for i in range(3 << 20)))
    return folder


class FakeRunner:
    """Records commands; on ``trtllm-build`` writes the engine config into the work mount."""

    def __init__(self, fail_at: str | None = None, build_engine: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.fail_at = fail_at
        self.build_engine = build_engine

    def __call__(self, argv: list[str], log_path: Path) -> int:
        self.calls.append(argv)
        with log_path.open("a") as log:
            log.write(f"ran {argv[argv.index('--entrypoint') + 1]}\n")
        entry = argv[argv.index("--entrypoint") + 1]
        if entry == self.fail_at:
            return 3
        if entry == "trtllm-build" and self.build_engine:
            work = next(v.split(":")[0] for v in argv if v.endswith(":/work"))
            (Path(work) / "engine").mkdir(parents=True, exist_ok=True)
            (Path(work) / "engine" / "config.json").write_text("{}")
        return 0

    def steps(self) -> list[list[str]]:
        """The in-container commands: entrypoint + what follows the image."""
        out = []
        for argv in self.calls:
            entry = argv.index("--entrypoint")
            out.append([argv[entry + 1], *argv[entry + 3 :]])
        return out


# --- the cache key ---------------------------------------------------------------------


def test_key_is_stable_and_hex(tmp_path: Path) -> None:
    model = _model(tmp_path)
    key = engine_cache_key(model, ENGINE, {})
    assert key == engine_cache_key(model, ENGINE, {})
    assert len(key) == 16 and int(key, 16) >= 0


def test_key_follows_baked_knobs_only(tmp_path: Path) -> None:
    model = _model(tmp_path)
    base = engine_cache_key(model, ENGINE, {})
    # Runtime knobs restart the server on the same engine.
    runtime: tuple[tuple[str, KnobValue], ...] = (
        ("gpu_memory_utilization", 0.5),
        ("chunked_prefill", True),
        ("prefix_caching", False),
    )
    for knob, value in runtime:
        assert engine_cache_key(model, ENGINE, {knob: value}) == base
    # An explicit default builds the same engine as leaving it unset.
    assert engine_cache_key(model, ENGINE, {"max_num_seqs": 2048, "quantization": "none"}) == base
    seen = {base}
    baked: tuple[tuple[str, KnobValue], ...] = (
        ("max_num_seqs", 64),
        ("max_num_batched_tokens", 4096),
        ("max_model_len", 4096),
        ("tensor_parallel_size", 2),
        ("quantization", "int8_wo"),
    )
    for knob, value in baked:
        key = engine_cache_key(model, ENGINE, {knob: value})
        assert key not in seen, knob
        seen.add(key)


def test_key_follows_the_model_and_the_image(tmp_path: Path) -> None:
    one, two = _model(tmp_path, 0), _model(tmp_path, 1)
    assert engine_cache_key(one, ENGINE, {}) != engine_cache_key(two, ENGINE, {})
    before = engine_cache_key(one, ENGINE, {})
    (one / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "x": 1}))
    assert engine_cache_key(one, ENGINE, {}) != before
    other = ENGINE.model_copy(deep=True)
    assert other.engine_build is not None
    other.engine_build.image = "${NGC_REGISTRY}/nvidia/tensorrt-llm/release:1.2.0"
    assert engine_cache_key(one, other, {}) != engine_cache_key(one, ENGINE, {})


def test_manifest_samples_weights_and_hashes_small_files(tmp_path: Path) -> None:
    manifest = engine_key_manifest(_model(tmp_path), ENGINE, {"max_num_seqs": 8})
    lines = manifest.splitlines()
    assert lines[:2] == ["bakeoff-engine-key v2", f"image {IMAGE}"]
    assert lines[2].startswith("file config.json ")
    assert lines[3].startswith(f"sample model.safetensors {3 << 20} ")
    assert "knob max_num_seqs=8" in lines and "knob max_model_len=default" in lines


def test_key_refuses_a_folder_without_config_and_a_backend_without_build(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"no config\.json"):
        engine_cache_key(tmp_path, ENGINE, {})
    with pytest.raises(SpecError, match="no engine build"):
        engine_cache_key(_model(tmp_path), load_backend("trtllm"), {})


def test_default_cache_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", "/x/cache")
    assert default_cache_dir() == Path("/x/cache/engines")
    monkeypatch.delenv("BAKEOFF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/y")
    assert default_cache_dir() == Path("/y/bakeoff/engines")


# --- container arguments ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("runtime", "gpu"),
    [("docker", ["--gpus", "device=3"]), ("podman", ["--device", "nvidia.com/gpu=3"])],
)
def test_step_args(runtime: str, gpu: list[str], tmp_path: Path) -> None:
    # The build runs on the cell's own GPU (here GPU 3), never on all of them.
    args = engine_step_args(
        ENGINE,
        ["trtllm-build", "--x", "1"],
        runtime=runtime,
        model_dir=tmp_path / "m",
        work_dir=tmp_path / "w",
        gpus=GpuAssignment(("3",), "test"),
    )
    assert args[:2] == ["run", "--rm"]
    assert f"{(tmp_path / 'm').resolve()}:/model:ro" in args
    assert f"{(tmp_path / 'w').resolve()}:/work" in args
    assert "--ipc=host" in args
    assert args.count("--ulimit") == 2 and "memlock=-1" in args and "stack=67108864" in args
    i = args.index(gpu[0])
    assert args[i : i + 2] == gpu
    assert args[-5:] == ["--entrypoint", "trtllm-build", IMAGE, "--x", "1"]


# --- building and caching --------------------------------------------------------------


def test_build_runs_every_step_then_caches(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    knobs: dict[str, KnobValue] = {"max_num_seqs": 16, "quantization": "int8_wo"}
    runner = FakeRunner()
    built = build_engine(model, ENGINE, knobs, cache_dir=cache, run=runner, runtime="docker")
    key = engine_cache_key(model, ENGINE, knobs)
    assert built == EngineBuild(path=cache / key / "engine", seconds=built.seconds, cached=False, key=key)
    assert built.seconds >= 0
    steps = runner.steps()
    assert [s[0] for s in steps] == ["python3", "trtllm-build", "sh", "rm"]
    assert steps[0][-3:] == ["--use_weight_only", "--weight_only_precision", "int8"]
    assert steps[1][-2:] == ["--max_batch_size", "16"]
    assert all(call[0] == "docker" for call in runner.calls)
    record = json.loads((cache / key / "build.json").read_text())
    assert record["key"] == key and record["image"] == IMAGE and record["steps"] == steps

    again = FakeRunner()
    cached = build_engine(model, ENGINE, knobs, cache_dir=cache, run=again, runtime="docker")
    assert cached.cached and cached.path == built.path and again.calls == []
    assert cached.seconds == pytest.approx(record["seconds"])
    # A runtime knob reuses the engine; a baked one builds another.
    assert build_engine(model, ENGINE, {**knobs, "gpu_memory_utilization": 0.5}, cache_dir=cache, run=again).cached
    other = build_engine(model, ENGINE, {"max_num_seqs": 32}, cache_dir=cache, run=again, runtime="docker")
    assert not other.cached and other.key != key


def test_failed_step_raises_with_the_log_and_is_not_cached(tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    with pytest.raises(LaunchError, match=r"step 2/4 \(trtllm-build, exit status 3\)"):
        build_engine(
            model,
            ENGINE,
            {},
            cache_dir=cache,
            run=FakeRunner(fail_at="trtllm-build"),
            runtime="podman",
        )
    key = engine_cache_key(model, ENGINE, {})
    assert not (cache / key / "build.json").exists()
    assert "ran trtllm-build" in (cache / key / "build.log").read_text()
    # The next attempt starts by clearing what the broken one left.
    (cache / key / "checkpoint").mkdir()
    runner = FakeRunner()
    assert not build_engine(model, ENGINE, {}, cache_dir=cache, run=runner, runtime="podman").cached
    assert runner.steps()[0] == ["rm", "-rf", "/work/engine", "/work/checkpoint"]
    assert runner.calls[0][0] == "podman"


def test_a_build_that_leaves_no_engine_fails(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="left no engine"):
        build_engine(
            _model(tmp_path),
            ENGINE,
            {},
            cache_dir=tmp_path / "c",
            run=FakeRunner(build_engine=False),
            runtime="docker",
        )


def test_build_refuses_bad_knobs_before_running_anything(tmp_path: Path) -> None:
    model, runner = _model(tmp_path), FakeRunner()
    with pytest.raises(SpecError):
        build_engine(model, ENGINE, {"speculative": "ngram"}, cache_dir=tmp_path / "c", run=runner)
    with pytest.raises(SpecError, match="no engine build"):
        build_engine(model, load_backend("vllm"), {}, cache_dir=tmp_path / "c", run=runner)
    assert runner.calls == []


# --- docker/trtllm/build-engine.sh agrees with the module ------------------------------

_needs_bash = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in ("bash", "sha256sum", "find", "stat")),
    reason="build-engine.sh needs bash and GNU coreutils/findutils",
)

_ENV = {
    "max_num_seqs": "MAX_BATCH_SIZE",
    "max_num_batched_tokens": "MAX_NUM_TOKENS",
    "max_model_len": "MAX_SEQ_LEN",
    "tensor_parallel_size": "TP_SIZE",
    "quantization": "QUANTIZATION",
}
_CASES: list[dict[str, KnobValue]] = [
    {},
    {"max_num_seqs": 64},
    {"max_num_seqs": 2048, "max_num_batched_tokens": 4096, "max_model_len": 4096},
    {"tensor_parallel_size": 2, "quantization": "int4_wo"},
]


def _script_env(knobs: dict[str, KnobValue], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV.values()}
    env.update({_ENV[k]: str(v) for k, v in knobs.items()})
    # The same image string the module hashes (NGC_REGISTRY may be unset here).
    engine_build = load_backend("trtllm-engine").engine_build
    assert engine_build is not None
    env["IMAGE"] = engine_build.image
    env.update(extra)
    return env


@_needs_bash
@pytest.mark.parametrize("knobs", _CASES)
def test_script_computes_the_same_key(knobs: dict[str, KnobValue], tmp_path: Path) -> None:
    model = _model(tmp_path)
    (model / "weights.bin").write_bytes(b"w" * (17 << 20))  # sampled, above the small-file size
    (tmp_path / "link-target.json").write_text("{}")
    (model / "linked.json").symlink_to(tmp_path / "link-target.json")
    out = subprocess.run(
        ["bash", str(SCRIPT), "--print-key", str(model)],
        capture_output=True,
        text=True,
        check=True,
        env=_script_env(knobs),
    )
    assert out.stdout.strip() == engine_cache_key(model, ENGINE, knobs)


_FAKE_RUNTIME = """#!/usr/bin/env bash
# Records each call, one per line (shell-quoted), and plays trtllm-build's output.
printf '%q ' "$@" >> "$FAKE_LOG"; printf '\\n' >> "$FAKE_LOG"
work=""; entry=""; prev=""
for a in "$@"; do
  case "$prev" in
    -v) case "$a" in *:/work) work="${a%:/work}" ;; esac ;;
    --entrypoint) entry="$a" ;;
  esac
  prev="$a"
done
if [ "$entry" = trtllm-build ]; then
  mkdir -p "$work/engine" && echo '{}' > "$work/engine/config.json"
fi
"""


@_needs_bash
@pytest.mark.parametrize("knobs", _CASES)
def test_script_runs_the_same_steps_and_shares_the_cache(knobs: dict[str, KnobValue], tmp_path: Path) -> None:
    model, cache = _model(tmp_path), tmp_path / "cache"
    fake = tmp_path / "fake-docker"
    fake.write_text(_FAKE_RUNTIME)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    out = subprocess.run(
        ["bash", str(SCRIPT), str(model), str(cache)],
        capture_output=True,
        text=True,
        check=True,
        env=_script_env(knobs, RUNTIME=str(fake), FAKE_LOG=str(log)),
    )
    key = engine_cache_key(model, ENGINE, knobs)
    assert out.stdout.strip() == str((cache / key / "engine").resolve())
    script_calls = [shlex.split(line) for line in log.read_text().splitlines()]

    runner = FakeRunner()
    build_engine(model, ENGINE, knobs, cache_dir=tmp_path / "py-cache", run=runner, runtime="docker")
    py_calls = [call[1:] for call in runner.calls]  # drop the runtime executable
    for call in py_calls:  # the module's work mount is its own cache folder
        call[call.index(next(v for v in call if v.endswith(":/work")))] = f"{(cache / key).resolve()}:/work"
    assert script_calls == py_calls

    # The module reuses the engine the script built.
    again = FakeRunner()
    reused = build_engine(model, ENGINE, knobs, cache_dir=cache, run=again, runtime="docker")
    assert reused.cached and again.calls == [] and reused.key == key


@_needs_bash
def test_script_refuses_bad_knobs(tmp_path: Path) -> None:
    model = _model(tmp_path)
    for env in ({"MAX_BATCH_SIZE": "lots"}, {"QUANTIZATION": "fp8"}):
        proc = subprocess.run(
            ["bash", str(SCRIPT), "--print-key", str(model)],
            capture_output=True,
            text=True,
            check=False,
            env=_script_env({}, **env),
        )
        assert proc.returncode == 2 and proc.stderr


# --- a real build (GPU and image needed) -----------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi -L)")
def test_real_engine_build_on_gpu(tmp_path: Path) -> None:
    from bakeoff.serving.container_runtime import find_runtime
    from bakeoff.serving.images import inspect_image

    runtime = find_runtime()
    if not inspect_image(runtime, IMAGE, missing_ok=True).present:
        pytest.skip(f"{IMAGE} is not present for {runtime}")
    model_dir = os.environ.get("BAKEOFF_TEST_LLAMA_DIR")
    if not model_dir:
        pytest.skip("set BAKEOFF_TEST_LLAMA_DIR to a small Llama checkpoint folder")
    built = build_engine(Path(model_dir), ENGINE, {"max_num_seqs": 8}, cache_dir=tmp_path, runtime=runtime)
    assert (built.path / "config.json").is_file() and (built.path / "tokenizer").is_dir()
    assert build_engine(Path(model_dir), ENGINE, {"max_num_seqs": 8}, cache_dir=tmp_path).cached
