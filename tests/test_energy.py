"""Energy per token from cumulative counters: planted NVML readings, a fake powercap folder, and the reasons.

The counters are planted through the same NVML module seam the telemetry tests use (a
fake ``pynvml`` in ``sys.modules``) and a temporary ``/sys/class/powercap`` look-alike, so
every figure has a known answer; the real machine's answer ("not measured", and why) is
checked through a real run against the reference server.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.measure.client import ClientSettings
from bakeoff.measure.metrics import energy_cost_per_million_tokens
from bakeoff.observe import energy as energy_module
from bakeoff.observe.energy import EnergyMeter, energy_meter, nvml_counters, rapl_counters
from bakeoff.report.tables import energy_table
from bakeoff.results import metric_table
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest, RunPlan
from plan_workloads import CLOSED

S = 1_000_000_000


class FakeNvmlError(Exception):
    pass


def fake_nvml(readings_mj: list[list[int]], energy: bool = True) -> types.ModuleType:
    """Two GPUs whose energy counters step through ``readings_mj[gpu]`` one read at a time."""
    module = types.ModuleType("fake_pynvml_energy")
    steps = [iter(r) for r in readings_mj]

    def total_energy(handle: int) -> int:
        if not energy:
            raise FakeNvmlError("Not Supported")
        return next(steps[handle])

    module.NVMLError = FakeNvmlError  # type: ignore[attr-defined]
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(readings_mj)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]
    module.nvmlDeviceGetTotalEnergyConsumption = total_energy  # type: ignore[attr-defined]
    return module


def ticking(*seconds: float) -> Iterator[int]:
    return iter(int(t * S) for t in seconds)


def test_nvml_counters_give_energy_per_gpu_over_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPU 0 draws 300 W, GPU 1 450 W; the first value of each is the support check at start.
    gpu0 = [0, 1_000_000, 1_300_000, 1_600_000, 1_900_000]
    gpu1 = [0, 2_000_000, 2_450_000, 2_900_000, 3_350_000]
    monkeypatch.setitem(sys.modules, "fake_pynvml_energy", fake_nvml([gpu0, gpu1]))
    counters, why = nvml_counters("fake_pynvml_energy")
    assert [c.device for c in counters] == ["gpu0 NVIDIA H200", "gpu1 NVIDIA H200"] and "NVML" in why
    clock = ticking(10.0, 11.0, 12.0, 13.0)
    meter = EnergyMeter("nvml", counters, clock=lambda: next(clock))
    assert [meter.read()["energy_j"] for _ in range(4)] == [0.0, 750.0, 1500.0, 2250.0]
    # Window 10.5 s -> 12.5 s: interpolated inside the readings, 2 s at 750 W.
    result = meter.window(int(10.5 * S), int(12.5 * S), output_tokens=3000)
    assert result.source == "nvml" and result.readings == 4
    assert [d.joules for d in result.devices] == pytest.approx([600.0, 900.0])
    assert [d.average_w for d in result.devices] == pytest.approx([300.0, 450.0])
    assert result.joules == pytest.approx(1500.0) and result.window_s == pytest.approx(2.0)
    assert (result.start_s, result.end_s) == pytest.approx((0.5, 2.5))
    assert result.j_per_output_token == pytest.approx(0.5) and result.output_tokens_per_j == pytest.approx(2.0)
    assert result.average_w == pytest.approx(750.0)
    assert energy_cost_per_million_tokens(result.j_per_output_token, 0.12) == pytest.approx(0.5 * 1e6 / 3.6e6 * 0.12)


def test_a_window_past_the_readings_is_clamped_to_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fake_pynvml_energy", fake_nvml([[0, 0, 100_000, 200_000]]))
    counters, _ = nvml_counters("fake_pynvml_energy")
    clock = ticking(1.0, 2.0, 3.0)
    meter = EnergyMeter("nvml", counters, clock=lambda: next(clock))
    for _ in range(3):
        meter.read()
    result = meter.window(0, 10 * S, output_tokens=100)
    assert result.window_s == pytest.approx(2.0) and result.joules == pytest.approx(200.0)


def test_a_gpu_without_an_energy_counter_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fake_pynvml_energy", fake_nvml([[0]], energy=False))
    meter, why = energy_meter("gpu", nvml_module="fake_pynvml_energy")
    assert meter is None and "no energy counter" in why and "Volta" in why
    meter, why = energy_meter("gpu", nvml_module="no_such_nvml_module")
    assert meter is None and why.startswith("GPU energy not measured: nvidia-ml-py is not installed")


def powercap(root: Path, zones: dict[str, tuple[str, int, int]]) -> Path:
    """A powercap folder: zone -> (name, energy_uj, max_energy_range_uj)."""
    for zone, (name, energy, wrap) in zones.items():
        folder = root / zone
        folder.mkdir(parents=True)
        (folder / "name").write_text(name + "\n")
        (folder / "energy_uj").write_text(f"{energy}\n")
        (folder / "max_energy_range_uj").write_text(f"{wrap}\n")
    return root


def test_rapl_reads_package_zones_and_undoes_wraparound(tmp_path: Path) -> None:
    wrap = 262_143_328_850
    root = powercap(
        tmp_path,
        {
            "intel-rapl:0": ("package-0", wrap - 50_000_000, wrap),
            "intel-rapl:0:0": ("core", 5, wrap),  # a part of package 0: counting it would count twice
            "intel-rapl:1": ("package-1", 0, wrap),
        },
    )
    counters, why = rapl_counters(root)
    assert [c.device for c in counters] == ["cpu package-0", "cpu package-1"] and "RAPL" in why
    clock = ticking(0.0, 1.0)
    meter = EnergyMeter("rapl", counters, clock=lambda: next(clock))
    meter.read()
    # Package 0 wraps past its range: 50 J to the top, then 70 J more. Package 1: 20 J.
    (root / "intel-rapl:0" / "energy_uj").write_text("70000000\n")
    (root / "intel-rapl:1" / "energy_uj").write_text("20000000\n")
    meter.read()
    result = meter.window(0, S, output_tokens=14)
    assert [d.joules for d in result.devices] == pytest.approx([120.0, 20.0])
    assert result.j_per_output_token == pytest.approx(10.0)


def test_rapl_unreadable_or_absent_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meter, why = energy_meter("cpu", powercap=tmp_path / "none")
    assert meter is None and why.startswith("CPU energy not measured: no RAPL package zone")
    root = powercap(tmp_path / "cap", {"intel-rapl:0": ("package-0", 1, 10)})
    real_read = Path.read_text

    def refuse(path: Path, *args: object, **kwargs: object) -> str:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real_read(path)

    monkeypatch.setattr(Path, "read_text", refuse)
    meter, why = energy_meter("cpu", powercap=root)
    assert meter is None and "energy_uj is not readable" in why


def test_a_run_on_this_host_says_energy_was_not_measured_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CPU backend here: RAPL is looked for where the test says (an empty folder: as on this machine).
    monkeypatch.setattr(energy_module, "POWERCAP", tmp_path / "powercap")
    requests = [PlannedRequest(i, "completions", 8, prompt=f"hello {i}") for i in range(4)]
    plan = RunPlan("c2", "closed", CLOSED, concurrency=2, requests=requests)
    with serve_reference(ttft_ms=5, itl_ms=5) as url:
        target = RunTarget(ClientSettings(url, "bakeoff-ref"), load_backend("vllm-cpu"), show_progress=False)
        summary = execute_plan(plan, target, tmp_path / "run")
    assert summary.energy is not None and summary.energy.joules is None
    assert summary.energy.reason is not None and "no RAPL package zone" in summary.energy.reason
    assert metric_table.BY_KEY["j_per_output_token"].value(summary) is None


def test_a_run_with_a_readable_counter_covers_the_throughput_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 1_000, 10**12)})
    monkeypatch.setattr(energy_module, "POWERCAP", root)
    requests = [PlannedRequest(i, "completions", 8, prompt=f"hello {i}") for i in range(6)]
    plan = RunPlan("c2", "closed", CLOSED, concurrency=2, requests=requests)
    with serve_reference(ttft_ms=5, itl_ms=5) as url:
        target = RunTarget(
            ClientSettings(url, "bakeoff-ref"), load_backend("vllm-cpu"), show_progress=False, telemetry_interval_s=0.05
        )
        summary = execute_plan(plan, target, tmp_path / "run")
    energy = summary.energy
    assert energy is not None and energy.source == "rapl" and energy.readings >= 2
    # The counter did not move (a file), so 0 J; the window read is the one throughput is measured over.
    assert energy.joules == 0.0 and energy.j_per_output_token == 0.0 and energy.output_tokens_per_j is None
    assert energy.window_s == pytest.approx(summary.throughput.window_s, rel=1e-6)
    assert energy.output_tokens == pytest.approx(summary.throughput.output_tok_s * summary.throughput.window_s)


def test_the_report_shows_not_measured_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(energy_module, "POWERCAP", tmp_path / "nothing")
    cell = tmp_path / "campaign" / "cells" / "ref-x-c2"
    requests = [PlannedRequest(i, "completions", 4, prompt=f"hi {i}") for i in range(2)]
    with serve_reference(ttft_ms=1, itl_ms=1) as url:
        target = RunTarget(ClientSettings(url, "bakeoff-ref"), load_backend("vllm-cpu"), show_progress=False)
        execute_plan(RunPlan("c2", "closed", CLOSED, concurrency=2, requests=requests), target, cell / "runs" / "c2")
    (cell / "cell.json").write_text('{"server": {"label": "ref"}, "workload": "x", "backend": "vllm-cpu"}')
    table = energy_table(tmp_path / "campaign")
    assert not table.empty
    assert table["energy"].str.startswith("not measured: CPU energy not measured: no RAPL").all()
