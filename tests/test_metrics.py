"""Metric formulas on synthetic records whose answers are known by construction."""

from __future__ import annotations

from typing import Any

import pytest

from bakeoff.measure.metrics import (
    cost_per_million_tokens,
    e2e_ms,
    itl_ms,
    itl_per_token_ms,
    meets_slo,
    nearest_rank,
    stats,
    summarize,
    tpot_ms,
    ttfb_ms,
    ttft_ms,
    window_s,
)
from bakeoff.measure.slo import Slo
from bakeoff.results.records import ErrorKind, RequestRecord, UsageSource
from bakeoff.results.summary import ShortCompletions

MS = 1_000_000
BASE = 10_000 * MS  # a perf_counter origin far from zero: zero means "never happened"


def rec(
    start: float = 0.0,
    *,
    chunks: tuple[float, ...] = (100.0, 120.0, 140.0, 160.0),
    end: float | None = None,
    first_event: float | None = None,
    tokens: int | None = None,
    chunk_tokens: list[int] | None = None,
    prompt: int = 0,
    warmup: bool = False,
    group: str = "",
    turn: int = -1,
    error: ErrorKind | None = None,
    scheduled: float | None = None,
    usage_source: UsageSource = "server",
) -> RequestRecord:
    """A record sent at ``start`` ms; ``chunks`` are content-chunk arrivals relative to it."""
    at = [BASE + int((start + c) * MS) for c in chunks]
    return RequestRecord(
        request_id=0,
        warmup=warmup,
        group=group,
        turn=turn,
        scheduled_ns=BASE + int(scheduled * MS) if scheduled is not None else 0,
        start_ns=BASE + int(start * MS),
        first_event_ns=BASE + int((start + (first_event if first_event is not None else chunks[0])) * MS)
        if chunks
        else 0,
        first_token_ns=at[0] if at else 0,
        end_ns=BASE + int((start + (end if end is not None else (chunks[-1] if chunks else 0) + 10)) * MS),
        chunk_ns=at,
        chunk_tokens=chunk_tokens if chunk_tokens is not None else [1] * len(at),
        prompt_tokens=prompt,
        completion_tokens=tokens if tokens is not None else len(at),
        usage_source=usage_source,
        error_kind=error,
    )


# --- per-request formulas --------------------------------------------------------------


def test_ttft_ttfb_e2e() -> None:
    r = rec(first_event=5.0, end=170.0)
    assert ttft_ms(r) == pytest.approx(100.0)
    assert ttfb_ms(r) == pytest.approx(5.0)  # a role-only chunk came first
    assert e2e_ms(r) == pytest.approx(170.0)


def test_no_content_means_no_ttft() -> None:
    r = rec(chunks=(), tokens=0, error="stream_cut")
    assert ttft_ms(r) is None and ttfb_ms(r) is None and tpot_ms(r) is None


def test_tpot_uses_usage_tokens_not_chunks() -> None:
    # 4 chunks but 7 tokens (several per chunk): (last chunk 160 - first 100) / (7 - 1);
    # the stream's end (usage chunk, [DONE]) at 170 is not decode time.
    r = rec(end=170.0, tokens=7, chunk_tokens=[1, 2, 2, 2])
    assert tpot_ms(r) == pytest.approx(60.0 / 6)


def test_tpot_leaves_out_the_tokens_of_the_first_chunk() -> None:
    # The first chunk carries 3 tokens (SGLang, TensorRT-LLM): 4 tokens were decoded after it.
    r = rec(end=400.0, tokens=7, chunk_tokens=[3, 2, 1, 1])
    assert tpot_ms(r) == pytest.approx(60.0 / 4)
    assert tpot_ms(rec(chunks=(100.0,), tokens=3, chunk_tokens=[3])) is None  # nothing after the first chunk


def test_tpot_undefined_below_two_tokens() -> None:
    assert tpot_ms(rec(chunks=(100.0,), tokens=1)) is None


def test_itl_per_chunk_and_per_token() -> None:
    r = rec(chunks=(100.0, 120.0, 140.0, 160.0), chunk_tokens=[1, 2, 4, 1], tokens=8)
    assert itl_ms(r) == pytest.approx([20.0, 20.0, 20.0])
    # Each gap is divided by the tokens of the chunk that ended it.
    assert itl_per_token_ms(r) == pytest.approx([10.0, 5.0, 20.0])


def test_itl_per_token_without_token_shares_counts_one_per_chunk() -> None:
    r = rec(chunk_tokens=[])
    assert itl_per_token_ms(r) == pytest.approx([20.0, 20.0, 20.0])


def test_itl_single_chunk_has_no_gaps() -> None:
    assert itl_ms(rec(chunks=(50.0,))) == []


# --- statistics -----------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    # Every percentile is a sample some request really had: no interpolation between two.
    out = stats(float(v) for v in range(1, 101))
    assert out.mean == pytest.approx(50.5)
    assert (out.p50, out.p90, out.p95, out.p99, out.p99_9) == (50.0, 90.0, 95.0, 99.0, 100.0)
    assert out.n == 100
    assert nearest_rank([3.0, 1.0, 2.0, 10.0], 75) == 3.0
    assert nearest_rank([], 50) is None


def test_stats_of_nothing() -> None:
    out = stats([])
    assert out.n == 0 and out.mean is None and out.p99 is None


def test_stats_single_value() -> None:
    out = stats([7.0])
    assert out.p50 == out.p99_9 == out.mean == 7.0


# --- run summary ----------------------------------------------------------------------


def run_records() -> list[RequestRecord]:
    return [
        rec(0.0, end=1000.0, tokens=10, prompt=5),
        rec(500.0, end=1500.0, tokens=30, prompt=15),  # ends at 2000 ms
        rec(-5000.0, end=100.0, tokens=99, prompt=99, warmup=True),  # before the window
        rec(100.0, chunks=(), tokens=0, error="http", end=50.0),
        rec(200.0, chunks=(100.0,), tokens=0, error="stall", end=300.0),
        rec(300.0, chunks=(), tokens=0, error="stall", end=10.0),
    ]


def test_warmup_is_excluded_everywhere() -> None:
    summary = summarize(run_records())
    assert summary.requests.warmup == 1
    assert summary.tokens.completion == 40
    assert summary.throughput.window_s == pytest.approx(2.0)


def test_failures_counted_by_kind_and_kept_out_of_latency() -> None:
    summary = summarize(run_records())
    assert summary.requests.ok == 2
    assert summary.requests.failed == 3
    assert summary.requests.failed_by_kind == {"http": 1, "stall": 2}
    assert summary.latency.ttft_ms.n == 2


def test_throughput_over_the_measured_window() -> None:
    # First measured send at 0 ms, last end at 2000 ms: 40 output tokens, 20 prompt tokens.
    throughput = summarize(run_records()).throughput
    assert throughput.output_tok_s == pytest.approx(20.0)
    assert throughput.total_tok_s == pytest.approx(30.0)
    assert throughput.req_s == pytest.approx(1.0)
    assert window_s([]) == 0.0


def test_latency_block_values() -> None:
    summary = summarize([rec(0.0, end=170.0, first_event=5.0, tokens=4)])
    assert summary.latency.ttft_ms.p50 == pytest.approx(100.0)
    assert summary.latency.ttfb_ms.p50 == pytest.approx(5.0)
    assert summary.latency.e2e_ms.p50 == pytest.approx(170.0)
    assert summary.latency.tpot_ms.p50 == pytest.approx(60.0 / 3)
    assert summary.latency.itl_ms.n == 3
    assert summary.latency.tok_s_per_user.p50 == pytest.approx(1000.0 / (60.0 / 3))
    assert summary.tokens.chunks_per_output_token == pytest.approx(1.0)


def test_usage_sources_are_reported() -> None:
    summary = summarize([rec(), rec(usage_source="tokenizer"), rec(usage_source="tokenizer")])
    assert summary.tokens.usage_sources == {"server": 1, "tokenizer": 2}


def test_queue_delay_for_open_loop_records() -> None:
    summary = summarize([rec(12.0, scheduled=10.0), rec(30.0, scheduled=30.0)])
    assert summary.queue_delay_ms is not None and summary.queue_delay_ms.mean == pytest.approx(1.0)
    assert summarize([rec()]).queue_delay_ms is None


def test_slo_goodput() -> None:
    slo = Slo(ttft_ms=150.0, tpot_ms=30.0)
    good = rec(0.0, end=170.0, tokens=4)  # TTFT 100, TPOT 20
    slow_start = rec(0.0, chunks=(200.0, 210.0), end=220.0, tokens=2)  # TTFT 200
    slow_decode = rec(0.0, chunks=(100.0, 150.0), end=150.0, tokens=2)  # TPOT 50
    failed = rec(0.0, end=1000.0, error="stream_cut")  # fast, but failed requests never count
    records = [good, slow_start, slow_decode, failed]
    assert [meets_slo(r, slo) for r in records] == [True, False, False, False]
    block = summarize(records, slo).slo
    assert block is not None and block.met == 1
    assert block.attainment == pytest.approx(0.25)
    assert block.goodput_req_s == pytest.approx(1.0)  # 1 request over a 1 s window
    assert block.ttft_ms == 150.0


def test_no_slo_block_without_bounds() -> None:
    assert summarize([rec()]).slo is None
    assert summarize([rec()], Slo()).slo is None


def test_by_group_for_workload_classes() -> None:
    records = [
        rec(0.0, group="short"),
        rec(0.0, chunks=(300.0, 320.0), group="long"),
        rec(0.0, chunks=(500.0, 520.0), group="s0", turn=0),  # sessions are not groups
    ]
    by_group = summarize(records).by_group
    assert set(by_group) == {"short", "long"}
    assert by_group["long"].ttft_ms.p50 == pytest.approx(300.0)
    assert by_group["short"].ttft_ms.p50 == pytest.approx(100.0)


def test_ttft_by_turn_is_the_median_per_turn() -> None:
    records = [
        rec(0.0, chunks=(100.0, 110.0), group="s0", turn=0),
        rec(0.0, chunks=(300.0, 310.0), group="s1", turn=0),
        rec(0.0, chunks=(50.0, 60.0), group="s0", turn=1),
        rec(0.0, chunks=(), group="s1", turn=1, error="stall"),
    ]
    # Nearest rank: the median of two is the lower one.
    assert summarize(records).ttft_ms_by_turn == {0: pytest.approx(100.0), 1: pytest.approx(50.0)}


def test_cost_per_million_tokens() -> None:
    # $3.60/h at 1000 tok/s = 3.6 M tokens per hour -> $1 per million.
    assert cost_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)
    assert cost_per_million_tokens(None, 1000.0) is None
    assert cost_per_million_tokens(3.6, 0.0) is None


# --- short completions ------------------------------------------------------------------


def planned_rec(planned: int, got: int, **kwargs: Any) -> RequestRecord:
    r = rec(tokens=got, **kwargs)
    r.max_tokens = planned
    return r


def test_exact_completions_carry_no_warning() -> None:
    block = summarize([planned_rec(4, 4), planned_rec(4, 4)]).short_completions
    assert block == ShortCompletions(checked=2, count=0, share=0.0, tokens_missing=0, tokens_planned=8, warning=None)


def test_short_completions_are_counted_and_flagged() -> None:
    records = [planned_rec(16, 16), planned_rec(16, 3), planned_rec(16, 0), planned_rec(16, 16)]
    block = summarize(records).short_completions
    assert (block.checked, block.count, block.share) == (4, 2, 0.5)
    assert (block.tokens_missing, block.tokens_planned) == (29, 64)
    assert block.warning is not None and "2 of 4 requests ended before their planned max_tokens" in block.warning
    assert "min_tokens" in block.warning


def test_short_completion_checks_skip_warmup_failures_and_unplanned_records() -> None:
    records = [
        planned_rec(16, 2, warmup=True),  # warm-up: not part of the run
        planned_rec(16, 2, error="stall"),  # failed: counted among failures instead
        planned_rec(0, 2),  # no plan recorded (a run from before max_tokens was kept)
        planned_rec(16, 15, usage_source="tokenizer"),  # re-tokenized text may be off by a token
    ]
    block = summarize(records).short_completions
    assert block.checked == 0 and block.count == 0 and block.warning is None
