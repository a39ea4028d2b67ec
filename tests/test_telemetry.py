"""Server counters and cache control: parsing, run deltas, hit rates, resets, idle waits, headers."""

from __future__ import annotations

import pytest

from bakeoff.backends.spec import BACKENDS_DIR, load_backend
from bakeoff.observe.telemetry import (
    counter_delta,
    has_prefix_cache_counters,
    logical,
    parse_prometheus,
    prefix_cache_from_counters,
    reset_prefix_cache,
    scrape,
    speculative_from_counters,
    wait_idle,
)
from fake_sglang import FakeState, serve_fake

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


# --- run-level hit rates come from counters, never from a gauge -------------------------


def test_sglang_hit_rate_is_counters_differenced_not_the_last_batch_gauge() -> None:
    backend = load_backend("sglang")
    before = {"sglang:cached_tokens_total": 100.0, "sglang:prompt_tokens_total": 1000.0, "sglang:cache_hit_rate": 0.9}
    after = {"sglang:cached_tokens_total": 400.0, "sglang:prompt_tokens_total": 2000.0, "sglang:cache_hit_rate": 0.95}
    block = prefix_cache_from_counters(before, after, backend)
    assert block["server_hit_rate"] == pytest.approx(0.3)
    assert (block["server_hits"], block["server_queries"], block["server_hit_unit"]) == (300, 1000, "tokens")
    gauge_only = {"sglang:cache_hit_rate": 0.9}
    assert prefix_cache_from_counters(gauge_only, gauge_only, backend)["server_hit_rate"] is None


def test_sglangs_hit_counter_absent_until_the_first_hit_reads_zero_not_unknown() -> None:
    # 0.5.23 creates sglang:cached_tokens_total at the first cache hit: a first window without a
    # hit has no such sample in either scrape, a window with the first hit only in the second.
    backend = load_backend("sglang")
    cold = {"sglang:prompt_tokens_total": 0.0}
    no_hit = {"sglang:prompt_tokens_total": 500.0}
    first_hit = {"sglang:prompt_tokens_total": 1000.0, "sglang:cached_tokens_total": 120.0}
    assert prefix_cache_from_counters(cold, no_hit, backend)["server_hit_rate"] == 0.0
    block = prefix_cache_from_counters(no_hit, first_hit, backend)
    assert (block["server_hits"], block["server_queries"]) == (120.0, 500.0)
    # A failed scrape (empty) is still unknown, never zero.
    assert prefix_cache_from_counters({}, first_hit, backend)["server_hit_rate"] is None


def test_sglangs_evicted_tokens_absent_until_the_first_eviction_read_zero_and_vllm_counts_none() -> None:
    # 0.5.23 binds the counter's labels at its first increment: absent from a scrape that answered is 0.
    sglang = load_backend("sglang")
    quiet = {"sglang:prompt_tokens_total": 500.0}
    assert counter_delta(quiet, quiet, sglang, "evicted_tokens") == 0.0
    assert counter_delta(quiet, {**quiet, "sglang:evicted_tokens_total": 640.0}, sglang, "evicted_tokens") == 640.0
    assert counter_delta({}, {}, sglang, "evicted_tokens") is None  # a failed scrape: unknown, never 0
    # vLLM's kv_block_* histograms count every reuse of a block, cached or not: not mapped as evictions.
    for name in ("vllm", "vllm-cpu", "vllm-cpu-container"):
        assert "evicted_tokens" not in load_backend(name).metrics.names
        assert counter_delta(quiet, quiet, load_backend(name), "evicted_tokens") is None


@pytest.mark.parametrize("name", ["trtllm", "trtllm-engine"])
def test_trtllm_hit_rate_is_reused_over_reused_plus_missed_blocks(name: str) -> None:
    backend = load_backend(name)
    before = {
        "trtllm_kv_cache_reused_blocks_total": 10.0,
        "trtllm_kv_cache_missed_blocks_total": 90.0,
        "trtllm_kv_cache_hit_rate": 1.0,
    }
    after = {
        "trtllm_kv_cache_reused_blocks_total": 40.0,
        "trtllm_kv_cache_missed_blocks_total": 100.0,
        "trtllm_kv_cache_hit_rate": 1.0,
    }
    block = prefix_cache_from_counters(before, after, backend)
    assert block["server_hit_rate"] == pytest.approx(30 / 40)
    assert block["server_hit_unit"] == "blocks"
    assert prefix_cache_from_counters({}, {"trtllm_kv_cache_hit_rate": 1.0}, backend)["server_hit_rate"] is None


def test_every_backend_that_names_a_hit_rate_gauge_also_has_counters() -> None:
    for path in sorted(BACKENDS_DIR.glob("*.yaml")):
        backend = load_backend(path.stem)
        if "cache_hit_rate" in backend.metrics.names:
            assert has_prefix_cache_counters(backend), path.name


# --- cache resets are checked, retried once idle, and reported ---------------------------


def test_vllm_200_with_success_false_is_a_failed_reset_retried_once_idle() -> None:
    state = FakeState(reset_style="vllm", refuse_resets=1, running_polls=3)
    with serve_fake(state) as url:
        outcome = reset_prefix_cache(url, load_backend("vllm"), headers={"Authorization": "Bearer k"})
    assert outcome.ok is True and outcome.attempts == 2 and state.reset_calls == 2
    assert "success" in outcome.detail and "once idle" in outcome.detail
    assert state.running_polls == 0  # it waited until the server said nothing runs
    assert all(h.get("Authorization") == "Bearer k" for h in state.seen_headers)
    assert "Bearer k" not in outcome.detail


def test_a_reset_refused_twice_is_reported_as_failed() -> None:
    state = FakeState(refuse_resets=5)
    with serve_fake(state) as url:
        outcome = reset_prefix_cache(url, load_backend("sglang"))
    assert outcome.ok is False and outcome.attempts == 2 and state.reset_calls == 2
    assert "HTTP 400" in outcome.detail


def test_a_missing_reset_endpoint_is_not_retried() -> None:
    backend = load_backend("vllm").model_copy(deep=True)
    backend.cache_reset.path = "/no_such_endpoint"
    state = FakeState()
    with serve_fake(state) as url:
        outcome = reset_prefix_cache(url, backend)
    assert outcome.ok is False and outcome.attempts == 1 and "HTTP 404" in outcome.detail


def test_restart_backends_have_no_endpoint_to_call() -> None:
    outcome = reset_prefix_cache("http://127.0.0.1:9", load_backend("trtllm"))
    assert (outcome.kind, outcome.ok, outcome.attempts) == ("restart", None, 0)


def test_wait_idle_is_bounded_and_says_when_it_cannot_tell() -> None:
    state = FakeState(running_polls=10_000)
    with serve_fake(state) as url:
        assert wait_idle(url, load_backend("sglang"), timeout_s=0.3, interval_s=0.05) is False
        state.running_polls = 0
        assert wait_idle(url, load_backend("sglang"), timeout_s=0.3) is True
        no_gauge = load_backend("sglang").model_copy(deep=True)
        no_gauge.metrics.names.pop("running")
        assert wait_idle(url, no_gauge, timeout_s=0.3) is None


def test_scrape_sends_headers() -> None:
    state = FakeState()
    with serve_fake(state) as url:
        snap = scrape(url, load_backend("sglang"), headers={"Authorization": "Bearer k"})
    assert "sglang:prompt_tokens_total" in snap
    assert state.seen_headers[-1]["Authorization"] == "Bearer k"


SPEC_TEXT = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 400
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 100
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 100
"""


@pytest.mark.parametrize("backend_name", ["llamacpp", "vllm-cpu"])
def test_speculative_acceptance_from_the_servers_counters(backend_name: str) -> None:
    backend = load_backend(backend_name)
    before = parse_prometheus(SPEC_TEXT.replace("llamacpp:", "vllm:" if backend_name == "vllm-cpu" else "llamacpp:"))
    after = {name: value * 2 for name, value in before.items()}
    after[next(n for n in after if "accepted" in n)] += 200  # 300 more accepted of 400 more proposed
    block = speculative_from_counters(before, after, backend)
    assert block == {
        "draft_tokens": 400.0,
        "accepted_tokens": 300.0,
        "drafts": 100.0,
        "acceptance_rate": 0.75,
        "accepted_per_step": 3.0,
    }
    # Speculation off: the counters stand still, so there is nothing to report.
    assert speculative_from_counters(before, before, backend) is None
    assert speculative_from_counters({}, {}, backend) is None


def test_sglang_acceptance_from_its_verify_calls_and_token_counters() -> None:
    backend = load_backend("sglang")
    before = {"sglang:generation_tokens_total": 10.0, "sglang:num_requests_total": 1.0}
    # The verify-call counter appears with the first step (absent before, from a scrape that answered).
    after = {"sglang:generation_tokens_total": 60.0, "sglang:num_requests_total": 3.0}
    after["sglang:spec_verify_calls_total"] = 16.0
    # 50 tokens of 2 requests: 2 from their prefills, 16 the steps' own, so 32 accepted of 16 x 4 proposed.
    assert speculative_from_counters(before, after, backend, draft_len=4) == {
        "draft_tokens": 64.0,
        "accepted_tokens": 32.0,
        "drafts": 16.0,
        "acceptance_rate": 0.5,
        "accepted_per_step": 2.0,
    }
    assert speculative_from_counters({}, after, backend, draft_len=4) is None  # a failed scrape is not a zero
    # Without the server's num_speculative_tokens nothing says how many drafts were proposed.
    assert speculative_from_counters(before, after, backend) is None
