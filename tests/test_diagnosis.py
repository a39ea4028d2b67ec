"""The diagnosis on planted series: each bound is recognised from its own evidence, and cites it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import why_planted as planted
from bakeoff.analysis.diagnosis import Level, classify


@pytest.mark.parametrize(
    ("levels", "bound"),
    [
        (planted.memory_bound, "memory"),
        (planted.batching_bound, "batching"),
        (planted.compute_bound, "compute"),
        (planted.scheduling_bound, "scheduling"),
        (planted.bandwidth_bound, "bandwidth"),
    ],
)
def test_each_planted_series_gets_its_bound(levels: Callable[[], list[Level]], bound: str) -> None:
    found = classify("s", "w", levels())
    assert found.bound == bound, found.markdown()
    assert found.evidence, "a verdict must cite the series behind it"


def test_memory_verdict_cites_kv_usage_preemptions_and_the_capped_queue() -> None:
    found = classify("vllm", "sweep", planted.memory_bound())
    text = " ".join(found.evidence)
    assert "KV-cache usage peaked at 98%" in text
    assert "12 preemptions" in text
    assert "running stayed at most 6 of 16" in text
    assert found.level == 16


def test_preemptions_alone_are_memory_evidence_even_with_kv_below_full() -> None:
    levels = planted.bandwidth_bound()
    top = levels[-1].series.copy()
    top["preemptions"] = [0.0] * 20 + [3.0] * 10
    levels[-1] = Level(16, 800.0, 40.0, 60.0, 20.0, top, 2)
    found = classify("s", "w", levels)
    assert found.bound == "memory" and found.evidence == ["3 preemptions in the window"]


def test_a_queue_with_a_full_kv_cache_is_not_called_batching() -> None:
    levels = planted.batching_bound()
    top = levels[-1].series.copy()
    top["kv_cache_usage"] = 0.95
    levels[-1] = Level(16, 380.0, 800.0, 1500.0, 10.5, top, 2)
    assert classify("s", "w", levels).bound == "memory"


def test_a_busy_engine_with_a_queue_is_not_batching_bound() -> None:
    levels = planted.batching_bound()
    top = levels[-1].series.copy()
    top["cpu_cores"] = 1.9  # both cores busy: admitting more would not help
    levels[-1] = Level(16, 120.0, 800.0, 1500.0, 10.5, top, 2)
    assert classify("s", "w", levels).bound != "batching"


def test_without_series_or_a_second_level_the_verdict_is_unknown() -> None:
    assert classify("s", "w", []).bound == "unknown"
    assert classify("s", "w", [Level(4, 100.0, 20.0, 30.0, 10.0)]).bound == "unknown"
