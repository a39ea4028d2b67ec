"""The Pareto front on a planted set of points, and the decode roofline's arithmetic and bandwidth sources."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bakeoff.analysis import pareto
from bakeoff.analysis.roofline import (
    CACHE_FILE,
    ENV,
    ModelShape,
    bandwidth,
    gpu_preset,
    measured_cpu_bandwidth,
    model_shape,
)
from bakeoff.errors import SpecError


def frame(rows: list[tuple[str, int, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "workload": "w",
                "server": s,
                "run": f"c{c}",
                "concurrency": c,
                "rate": None,
                "output_tok_s": tput,
                "tok_s_per_user_p50": inter,
            }
            for s, c, tput, inter in rows
        ]
    )


def test_the_planted_front_is_found_across_servers() -> None:
    # a: fast per user at low load; b: the throughput end; the rest are dominated.
    pts = pareto.points(
        frame(
            [
                ("a", 1, 100.0, 100.0),  # front (most interactive)
                ("a", 4, 300.0, 75.0),  # front
                ("a", 16, 350.0, 20.0),  # dominated by b@8 (400, 40)
                ("b", 1, 90.0, 90.0),  # dominated by a@1
                ("b", 8, 400.0, 40.0),  # front
                ("b", 32, 600.0, 18.0),  # front (most throughput)
            ]
        ),
        {"a": 1, "b": 1},
    )
    best = pareto.front(pts)
    assert list(zip(best["server"], best["level"], strict=True)) == [("b", 32), ("b", 8), ("a", 4), ("a", 1)]


def test_throughput_is_per_gpu_when_a_server_shards_the_model() -> None:
    pts = pareto.points(frame([("tp2", 8, 800.0, 40.0), ("tp1", 8, 500.0, 40.0)]), {"tp2": 2, "tp1": 1})
    assert dict(zip(pts["server"], pts[pareto.Y], strict=True)) == {"tp2": 400.0, "tp1": 500.0}
    assert list(pareto.front(pts)["server"]) == ["tp1"]
    assert pareto.units({"tensor_parallel_size": 4}, gpu=True) == 4 and pareto.units({"threads": 2}, gpu=False) == 1


def test_decode_floor_is_bytes_read_over_bandwidth() -> None:
    shape = ModelShape(weight_bytes=150_000_000, kv_bytes_per_token=20_000)
    # 150 MB + 4 x 1000 tokens x 20 kB = 230 MB at 46 GB/s -> 5 ms.
    assert shape.floor_ms(46.0, batch=4, context_tokens=1000) == pytest.approx(5.0)


def test_model_shape_reads_the_checkpoint_less_its_embedding_table(small_model: Path) -> None:
    shape = model_shape(small_model)
    config = json.loads((small_model / "config.json").read_text())
    assert shape is not None
    file_bytes = sum(f.stat().st_size for f in small_model.glob("*.safetensors"))
    assert shape.weight_bytes == file_bytes - config["vocab_size"] * config["hidden_size"] * 2
    # 2 (K, V) x 12 layers x 4 KV heads x 64 dims x 2 bytes (bf16)
    assert shape.kv_bytes_per_token == 2 * 12 * 4 * 64 * 2


def test_gpu_presets_follow_the_nvml_names() -> None:
    assert gpu_preset("NVIDIA H200") == ("H200 (HBM3e)", 4800.0)
    assert gpu_preset("NVIDIA H100 80GB HBM3") == ("H100 SXM", 3350.0)
    assert gpu_preset("NVIDIA H100 PCIe") == ("H100 PCIe", 2000.0)
    assert gpu_preset("NVIDIA A100-SXM4-80GB") == ("A100 SXM 80GB", 2039.0)
    assert gpu_preset("NVIDIA A100-SXM4-40GB") == ("A100 40GB", 1555.0)
    assert gpu_preset("Tesla T4") is None


def test_bandwidth_sources_in_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert bandwidth("gpu", override=1000.0) is not None
    assert bandwidth("gpu", override=1000.0).source == "campaign memory_bandwidth_gbs"  # type: ignore[union-attr]
    found = bandwidth("gpu", gpu_names=["NVIDIA H200"])
    assert found is not None and found.gbs == 4800.0
    assert bandwidth("gpu", gpu_names=["Tesla T4"]) is None  # no guess for an unknown GPU
    monkeypatch.setenv(ENV, "123.5")
    found = bandwidth("gpu", gpu_names=["NVIDIA H200"])
    assert found is not None and (found.gbs, found.source) == (123.5, f"${ENV}")
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(SpecError, match=ENV):
        bandwidth("cpu", cache_dir=tmp_path)


def test_cpu_bandwidth_is_measured_once_then_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    first = measured_cpu_bandwidth(tmp_path)
    assert 0.5 < first.gbs < 2000 and "measured now" in first.source
    calls = []
    monkeypatch.setattr("bakeoff.analysis.roofline.copy_bandwidth_gbs", lambda *a, **k: calls.append(1) or 1.0)
    again = measured_cpu_bandwidth(tmp_path)
    assert again.gbs == first.gbs and "cached" in again.source and not calls
    # An entry the one-thread copy left (no method) is measured again, with all cores.
    cache = tmp_path / CACHE_FILE
    old = {key: {"gbs": 8.5, "measured_at": "2026-12-01"} for key in json.loads(cache.read_text())}
    cache.write_text(json.dumps(old))
    assert measured_cpu_bandwidth(tmp_path).gbs == 1.0 and calls == [1]


def test_repeats_of_a_level_are_one_point_at_their_mean_as_in_the_verdict() -> None:
    rows = [("a", 4, 300.0, 70.0), ("a", 4, 330.0, 80.0), ("a", 4, 390.0, 60.0), ("b", 4, 100.0, 10.0)]
    pts = pareto.points(frame(rows), {})
    assert len(pts) == 2
    a = pts[pts["server"] == "a"].iloc[0]
    assert (a[pareto.X], a[pareto.Y]) == (70.0, 340.0)


def test_points_equivalent_within_the_margin_are_equals_on_the_front() -> None:
    # Two identical servers 1-2% apart on each axis: both on the front; a third 20% behind is not.
    pts = pareto.points(frame([("a", 4, 300.0, 70.0), ("b", 4, 303.0, 71.0), ("c", 4, 240.0, 56.0)]), {})
    assert set(pareto.front(pts)["server"]) == {"a", "b"}
    assert set(pareto.front(pts, margin=0.0)["server"]) == {"b"}  # without the margin noise decides
