"""Telemetry over time: the Prometheus parser's types, the sampler beside a real load, process and GPU probes."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.host.gpus import nvml_probe
from bakeoff.measure.client import ClientSettings
from bakeoff.observe.hoststats import ProcessProbe
from bakeoff.observe.telemetry import parse_prometheus
from bakeoff.observe.telemetry_series import SERIES_FILE, Sampler, ServerProbe, read_series, with_rates, write_series
from bakeoff.results.store import read_json
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest, RunPlan
from plan_workloads import CLOSED
from polling import poll_until

TWO_ENGINES = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.8
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 5.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 3.5
"""


def test_share_gauges_average_over_engines_while_counts_and_counters_sum() -> None:
    snap = parse_prometheus(TWO_ENGINES)
    assert snap["vllm:kv_cache_usage_perc"] == pytest.approx(0.7)  # not 1.4: two engines at 80 % and 60 %
    assert snap["vllm:num_requests_running"] == 8.0
    assert snap["vllm:num_preemptions_total"] == 3.0
    assert snap["vllm:e2e_request_latency_seconds_count"] == 5.0


def test_a_filtered_parse_keeps_only_the_named_metrics() -> None:
    snap = parse_prometheus(TWO_ENGINES, only=["vllm:num_preemptions_total", "vllm:kv_cache_usage_perc"])
    assert set(snap) == {"vllm:num_preemptions_total", "vllm:kv_cache_usage_perc"}
    assert snap["vllm:num_preemptions_total"] == 3.0


def test_with_rates_turns_counters_into_rates_over_a_trailing_window() -> None:
    frame = pd.DataFrame(
        {
            "t_s": [0.0, 1.0, 2.0],
            "generation_tokens": [100.0, 300.0, 700.0],
            "preemptions": [0.0, 0.0, 3.0],
            "prefix_cache_hits": [0.0, 50.0, 50.0],
            "prefix_cache_queries": [0.0, 100.0, 100.0],
            "rss_bytes": [2.0**30, 2.0**31, 2.0**31],
        }
    )
    rated = with_rates(frame)
    # Over the trailing 3 s, from the first sample: (300-100)/1, (700-100)/2.
    assert rated["generation_tokens_per_s"].tolist()[1:] == [200.0, 300.0]
    assert rated["preemptions_per_s"].tolist()[1:] == [0.0, 1.5]
    assert rated["prefix_hit_rate"].iloc[1] == 0.5 and pd.isna(rated["prefix_hit_rate"].iloc[2])  # no lookups
    assert rated["rss_gib"].tolist() == [1.0, 2.0, 2.0]


def test_a_counter_bumped_between_two_close_scrapes_is_no_spike() -> None:
    # 260 tok/s, the engine bumping its counter by 520 every 2 s; two scrapes 0.2 s apart straddle
    # the bump at t=4: one interval's difference reads 2,600 tok/s; the trailing window stays near 260.
    t = pd.Series([0.0, 1.0, 2.0, 3.0, 3.9, 4.1, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    tokens = 520.0 * (t // 2)
    naive = tokens.diff() / t.diff()
    assert naive.max() == pytest.approx(2600.0)
    rated = with_rates(pd.DataFrame({"t_s": t, "generation_tokens": tokens}))["generation_tokens_per_s"]
    assert rated.iloc[3:].max() < 1.5 * 260 and rated.iloc[3:].min() > 0.5 * 260


def test_sampler_keeps_its_grid_and_survives_a_failing_probe() -> None:
    class Broken:
        def read(self) -> dict[str, float | None]:
            raise RuntimeError("scrape exploded")

    class Counting:
        n = 0.0

        def read(self) -> dict[str, float | None]:
            self.n += 1
            return {"running": self.n}

    counting = Counting()
    sampler = Sampler([Broken(), counting], interval_s=0.05)
    sampler.start()
    poll_until(lambda: counting.n >= 6, 10, "six samples")
    rows = sampler.stop()
    # Every sample made a row although the first probe raised each time, the closing sample last.
    assert len(rows) >= 7 and [r["running"] for r in rows] == [float(i) for i in range(1, len(rows) + 1)]
    times = [r["t_s"] or 0.0 for r in rows]
    assert times == sorted(times) and all(r["sample_ms"] is not None for r in rows)
    # On the grid: the k-th sample of the loop is never taken before k intervals (one-sided: a busy
    # machine only makes it later). The opening sample is at 0, the closing one whenever stop came.
    assert times[0] < 0.05
    assert all(t >= k * 0.05 - 0.001 for k, t in enumerate(times[1:-1], start=1)), times


def test_a_run_against_a_vllm_wire_server_saves_its_series(tmp_path: Path) -> None:
    requests = [PlannedRequest(i, "completions", 40, prompt=f"hello {i}") for i in range(16)]
    plan = RunPlan("c8", "closed", CLOSED, concurrency=8, requests=requests)
    with serve_reference(profile="vllm", ttft_ms=20, itl_ms=25) as url:
        settings = ClientSettings(url, "bakeoff-ref")
        target = RunTarget(settings, load_backend("vllm"), show_progress=False, telemetry_interval_s=0.2)
        summary = execute_plan(plan, target, tmp_path)
    assert summary.telemetry_series == {"server": SERIES_FILE}
    series = read_series(tmp_path / SERIES_FILE)
    # Two waves of 40 tokens at 25 ms: about 2 s, sampled every 0.2 s.
    assert len(series) >= 6
    assert series["running"].max() >= 4  # the load was seen from the server's side
    assert series["generation_tokens"].iloc[-1] - series["generation_tokens"].iloc[0] >= 16 * 40 * 0.5
    assert series["kv_cache_usage"].notna().all()
    info = read_json(tmp_path / "run.json")
    assert info["telemetry"]["samples"] == len(series)
    assert any("not a local process" in note for note in info["telemetry"]["left_out"])


def test_server_probe_reads_only_what_the_backend_maps() -> None:
    backend = load_backend("vllm")
    # One mapped name the server does not export: it reads as unknown, never as 0.
    names = {**backend.metrics.names, "preemptions": "vllm:not_exported_total"}
    backend = backend.model_copy(update={"metrics": backend.metrics.model_copy(update={"names": names})})
    with serve_reference(profile="vllm") as url:
        reading = ServerProbe(url, backend).read()
    assert reading["running"] == 0.0 and reading["waiting"] == 0.0 and reading["kv_cache_usage"] == 0.0
    assert reading["generation_tokens"] == 0.0
    assert reading["preemptions"] is None


def test_process_probe_follows_the_engines_children(tmp_path: Path) -> None:
    # A parent that only waits, and a child that spins: the work is in the child, as in vLLM.
    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        child = poll_until(lambda: next(iter(psutil.Process(parent.pid).children()), None), 10, "the spinning child")
        # A planted clock: the probe's window is one second whatever the wall clock did, so cpu_cores
        # is the CPU seconds the process tree used since the probe's baseline.
        ticks = iter([0.0, 1.0])
        probe = ProcessProbe(parent.pid, clock=lambda: next(ticks))
        since = sum(child.cpu_times()[:2])
        poll_until(lambda: sum(child.cpu_times()[:2]) - since >= 0.2, 30, "0.2 s of the child's CPU")
        reading = probe.read()
    finally:
        parent.kill()
        for leftover in psutil.Process().children(recursive=True):
            leftover.kill()
        parent.wait()
    # The waiting parent uses next to no CPU: the 0.2 s are the child's, which the probe must count.
    assert reading["cpu_cores"] is not None and reading["cpu_cores"] >= 0.2
    assert reading["rss_bytes"] is not None and reading["rss_bytes"] > 5 * 2**20  # two interpreters


def test_process_probe_of_a_gone_process_reads_missing_values() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert ProcessProbe(child.pid).read() == {"cpu_cores": None, "rss_bytes": None}


def fake_nvml(count: int = 2) -> types.ModuleType:
    """A stand-in for nvidia-ml-py: two GPUs at 50 % and 100 %, 10 and 20 GiB, 300 and 450 W."""
    module = types.ModuleType("fake_pynvml")

    class NVMLError(Exception):
        pass

    state: dict[str, Any] = {"shutdown": False}
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.state = state  # type: ignore[attr-defined]
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: state.update(shutdown=True)  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=[50, 100][h])  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=[10, 20][h] * 2**30)  # type: ignore[attr-defined]
    module.nvmlDeviceGetPowerUsage = lambda h: [300_000, 450_000][h]  # type: ignore[attr-defined]
    return module


def test_nvml_probe_reads_every_gpu_through_a_fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_nvml()
    monkeypatch.setitem(sys.modules, "fake_pynvml", module)
    probe, why = nvml_probe("fake_pynvml")
    assert probe is not None and "H100" in why
    assert probe.read() == {"gpu_util_pct": 75.0, "gpu_mem_used_bytes": 30 * 2**30, "gpu_power_w": 750.0}
    probe.close()
    assert module.state["shutdown"]  # type: ignore[attr-defined]


def test_nvml_probe_without_the_package_or_a_gpu_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    probe, why = nvml_probe("no_such_nvml_module")
    assert probe is None and "nvidia-ml-py" in why
    monkeypatch.setitem(sys.modules, "fake_pynvml", fake_nvml(count=0))
    probe, why = nvml_probe("fake_pynvml")
    assert probe is None and "no GPU" in why


def _nvidia_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return bool(pynvml.nvmlDeviceGetCount())
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _nvidia_gpu(), reason="needs an NVIDIA GPU and nvidia-ml-py (CPU counterpart: the fake NVML)")
def test_nvml_probe_reads_a_real_gpu() -> None:
    probe, why = nvml_probe()
    assert probe is not None, why
    reading = probe.read()
    probe.close()
    assert reading["gpu_mem_used_bytes"] is not None and reading["gpu_mem_used_bytes"] > 0
    assert reading["gpu_util_pct"] is not None and 0 <= reading["gpu_util_pct"] <= 100


def test_series_round_trips_with_missing_values(tmp_path: Path) -> None:
    rows: list[dict[str, float | None]] = [{"t_s": 0.0, "running": 1.0}, {"t_s": 1.0, "running": None, "waiting": 2.0}]
    write_series(tmp_path / SERIES_FILE, rows)
    frame = read_series(tmp_path / SERIES_FILE)
    assert frame["running"].iloc[0] == 1.0 and pd.isna(frame["running"].iloc[1])
    assert pd.isna(frame["waiting"].iloc[0]) and frame["waiting"].iloc[1] == 2.0
