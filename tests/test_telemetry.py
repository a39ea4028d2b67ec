"""Server counters: Prometheus parsing, logical names, run deltas and hit rates."""

from __future__ import annotations

import pytest

from bakeoff.backends import load_backend
from bakeoff.telemetry import logical, parse_prometheus, prefix_cache_from_counters

TEXT = """# HELP vllm:prefix_cache_hits Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:weird{label="with space } brace"} 7
broken_line_without_value
nan_metric NaN
"""


def test_parse_sums_label_sets_and_skips_noise() -> None:
    snap = parse_prometheus(TEXT)
    assert snap["vllm:prefix_cache_hits_total"] == 400.0
    assert snap["vllm:prefix_cache_queries_total"] == 1000.0
    assert snap["vllm:weird"] == 7.0
    assert "nan_metric" not in snap and "broken_line_without_value" not in snap


def test_hit_rate_is_the_delta_over_the_run() -> None:
    backend = load_backend("vllm-cpu")
    before = parse_prometheus(TEXT)
    after = dict(before)
    after["vllm:prefix_cache_hits_total"] += 450
    after["vllm:prefix_cache_queries_total"] += 500
    block = prefix_cache_from_counters(before, after, backend)
    assert block["server_hit_rate"] == pytest.approx(0.9)
    assert block["server_hits"] == 450 and block["server_queries"] == 500
    assert logical(after, backend, "running") == 3.0


def test_no_lookups_means_zero_hits_and_missing_counters_mean_unknown() -> None:
    backend = load_backend("vllm-cpu")
    snap = parse_prometheus(TEXT)
    assert prefix_cache_from_counters(snap, snap, backend)["server_hit_rate"] == 0.0
    assert prefix_cache_from_counters({}, {}, backend)["server_hit_rate"] is None


def test_llamacpp_queries_are_uncached_plus_cached_prompt_tokens() -> None:
    backend = load_backend("llamacpp")
    before = {"llamacpp:prompt_tokens_total": 100.0, "llamacpp:prompt_tokens_cached_total": 0.0}
    after = {"llamacpp:prompt_tokens_total": 150.0, "llamacpp:prompt_tokens_cached_total": 450.0}
    block = prefix_cache_from_counters(before, after, backend)
    assert block["server_queries"] == 500 and block["server_hit_rate"] == pytest.approx(0.9)
