"""Each GPU server pinned to its own GPUs: the assignment, and NVML reading those GPUs only.

The Ray side (two cells on a fake 8-GPU cluster landing on different GPUs) is in test_ray.py,
which owns the module's Ray cluster.
"""

from __future__ import annotations

import sys
import types

import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.errors import SpecError
from bakeoff.host.gpus import nvml_probe
from bakeoff.observe.energy import energy_meter
from bakeoff.serving.gpu_pinning import assign_gpus, gpu_count


class FakeNvmlError(Exception):
    pass


def eight_gpus() -> types.ModuleType:
    """Eight GPUs; GPU i has drawn (i + 1) kJ so far and uses (i + 1) GiB."""
    module = types.ModuleType("fake_pynvml_eight")
    module.NVMLError = FakeNvmlError  # type: ignore[attr-defined]
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: 8  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    module.nvmlDeviceGetTotalEnergyConsumption = lambda h: (h + 1) * 1_000_000  # type: ignore[attr-defined]
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=10 * h)  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) << 30)  # type: ignore[attr-defined]
    module.nvmlDeviceGetPowerUsage = lambda h: 100_000  # type: ignore[attr-defined]
    return module


def test_a_cell_takes_the_gpus_ray_made_visible_and_refuses_too_few_for_its_tensor_parallelism() -> None:
    ray_share = {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert assign_gpus(2, ray_share).devices == ("4", "5")
    assert assign_gpus(2, {}).devices == ("0", "1")  # a serial run: one server at a time
    with pytest.raises(SpecError, match=r"tensor_parallel_size 3 needs 3 GPU\(s\), but CUDA_VISIBLE_DEVICES=4,5"):
        assign_gpus(3, ray_share)
    vllm = load_backend("vllm")
    assert gpu_count(vllm, {"tensor_parallel_size": 4}) == 4 and gpu_count(vllm, {}) == 1


def test_energy_and_telemetry_read_only_the_gpus_the_server_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fake_pynvml_eight", eight_gpus())
    meter, note = energy_meter("gpu", nvml_module="fake_pynvml_eight", gpus=[3, 6])
    assert "gpu3" in note and "gpu0" not in note
    assert meter is not None
    assert [c.device for c in meter.counters] == ["gpu3 NVIDIA H100 80GB HBM3", "gpu6 NVIDIA H100 80GB HBM3"]
    assert [c.read() for c in meter.counters] == [4000.0, 7000.0]  # the other six GPUs' joules are not there
    probe, note = nvml_probe("fake_pynvml_eight", indices=[3, 6])
    assert probe is not None and "gpu3" in note and "gpu0" not in note
    reading = probe.read()
    assert reading["gpu_mem_used_bytes"] == float((4 + 7) << 30) and reading["gpu_util_pct"] == 45.0
    # Not told which: every GPU, as before pinning existed.
    everything, _ = energy_meter("gpu", nvml_module="fake_pynvml_eight")
    assert everything is not None and len(everything.counters) == 8
    # A GPU NVML does not list is said, not metered as something else.
    missing, reason = energy_meter("gpu", nvml_module="fake_pynvml_eight", gpus=[9])
    assert missing is None and "GPU 9 not among the 8 NVML sees" in reason
