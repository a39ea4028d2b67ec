"""Run summaries from raw request records, exactly as the metric table defines them.

The per-request formulas (TTFT, TTFB, E2E, TPOT, ITL) and the distributions built from
them live in :mod:`bakeoff.results.formulas`, named with their glossary text in
:mod:`bakeoff.results.metric_table`; this module turns a
run's records into a :class:`~bakeoff.results.summary.RunSummary`:

- The measured window (:mod:`bakeoff.measure.window`): a closed loop's steady state (ramp and tail
  left out, recorded in ``window``), otherwise first send -> last end. Latencies cover the
  requests inside it; output tok/s counts the tokens whose chunks arrived inside, req/s the
  requests that ended inside; goodput = req/s x the share of them meeting every SLO bound.
- Coalesced chunks (several content chunks in one read: equal timestamps) are counted per
  run; past :data:`COALESCED_LIMIT` the figures built from chunk gaps (ITL, TPOT, tok/s per
  user) are marked unsupported, with the reason, instead of being reported as measured.
- Short completions: requests that ended, without error, before the ``max_tokens`` the
  plan asked for (counted from the server's usage). ``ignore_eos`` does not cover every
  end-of-sequence id on every server and model, so a run can come out shorter than
  planned; such a run carries a warning, since its throughput is not the planned load's.
Failed requests are counted by kind and excluded from latency statistics, never dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from bakeoff.measure.slo import Slo
from bakeoff.measure.window import Bounds, steady_bounds, whole_run
from bakeoff.results.formulas import (
    NS_PER_MS,
    coalesced_gaps,
    e2e_ms,
    itl_ms,
    itl_per_token_ms,
    nearest_rank,
    stats,
    tpot_ms,
    ttfa_ms,
    ttfb_ms,
    ttft_ms,
)
from bakeoff.results.metric_table import latency_block
from bakeoff.results.records import RequestRecord
from bakeoff.results.summary import (
    Chunking,
    Latency,
    Requests,
    RunSummary,
    ShortCompletions,
    SloResult,
    SteadyWindow,
    Throughput,
    Tokens,
)

# Past this share of chunk gaps arriving in one read, gap-based figures time the reads, not the server.
COALESCED_LIMIT = 0.25
_GAP_METRICS = ("itl_ms", "itl_per_token_ms", "tpot_ms", "tok_s_per_user")

__all__ = [
    "NS_PER_MS",
    "cost_per_million_tokens",
    "e2e_ms",
    "energy_cost_per_million_tokens",
    "itl_ms",
    "itl_per_token_ms",
    "latency_block",
    "meets_slo",
    "nearest_rank",
    "short_completions",
    "stats",
    "summarize",
    "tpot_ms",
    "ttfa_ms",
    "ttfb_ms",
    "ttft_ms",
    "window_bounds",
    "window_s",
]


def meets_slo(r: RequestRecord, slo: Slo) -> bool:
    if not r.ok:
        return False
    checks = (
        (slo.ttft_ms, ttft_ms(r)),
        (slo.ttfa_ms, ttfa_ms(r)),
        (slo.tpot_ms, tpot_ms(r)),
        (slo.e2e_ms, e2e_ms(r)),
    )
    return all(bound is None or (value is not None and value <= bound) for bound, value in checks)


def window_s(records: list[RequestRecord]) -> float:
    """Length of the window the run is measured over (steady state for a closed loop)."""
    bounds = window_bounds(records)
    return bounds.seconds if bounds is not None else 0.0


def window_bounds(records: list[RequestRecord]) -> Bounds | None:
    """The measured window (perf_counter ns), what energy is read over too; None without measured requests."""
    measured = [r for r in records if not r.warmup]
    return _bounds(measured)[0] if measured else None


@dataclass(frozen=True)
class WindowTargets:
    """What the plan asked of a closed-loop level, recorded beside the window it got."""

    min_requests: int = 0
    min_duration_s: float = 0.0


def _bounds(measured: list[RequestRecord]) -> tuple[Bounds, list[RequestRecord]]:
    """The window and the requests inside it; the whole run when no steady state was reached."""
    steady = steady_bounds(measured)
    if steady is not None:
        inside = [r for r in measured if steady.inside(r)]
        if inside:
            return steady, inside
    return whole_run(measured), measured


def summarize(records: list[RequestRecord], slo: Slo | None = None, targets: WindowTargets | None = None) -> RunSummary:
    """The measured part of ``summary.json`` for one run; warm-up records are left out.

    The caller adds what records cannot tell (workload, cache reset, effort, provenance).
    """
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    reasoned = [r for r in ok if r.reasoning_tokens is not None]
    bounds, inside = _bounds(measured)
    timed = [r for r in inside if r.ok]  # latencies: successful requests inside the window
    seconds = bounds.seconds if measured else 0.0
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    window_out = sum(_tokens_inside(r, bounds) for r in ok)
    window_in = sum(r.prompt_tokens for r in ok if bounds.start_ns <= r.first_token_ns <= bounds.end_ns)
    completed = [r for r in ok if bounds.ended_inside(r)]
    scheduled = [r for r in measured if r.scheduled_ns]
    groups = sorted({r.group for r in timed if r.group and r.turn < 0})
    turns = sorted({r.turn for r in timed if r.turn >= 0})
    chunking = chunking_block(timed)
    return RunSummary(
        requests=Requests(
            ok=len(ok),
            failed=len(failed),
            warmup=len(records) - len(measured),
            failed_by_kind=dict(Counter(str(r.error_kind) for r in failed)),
        ),
        latency=_mark_coalesced(latency_block(timed), chunking),
        throughput=Throughput(
            output_tok_s=window_out / seconds if seconds else 0.0,
            total_tok_s=(window_out + window_in) / seconds if seconds else 0.0,
            req_s=len(completed) / seconds if seconds else 0.0,
            window_s=seconds,
            offered_req_s=offered_rate(scheduled),
        ),
        tokens=Tokens(
            prompt=in_tokens,
            completion=out_tokens,
            usage_sources=dict(Counter(r.usage_source for r in ok)),
            chunks_per_output_token=(sum(len(r.chunk_ns) for r in ok) / out_tokens if out_tokens else None),
            reasoning=sum(r.reasoning_tokens or 0 for r in reasoned) if reasoned else None,
            reasoning_sources=dict(Counter(str(r.reasoning_source) for r in reasoned)),
        ),
        short_completions=short_completions(ok),
        queue_delay_ms=stats((r.start_ns - r.scheduled_ns) / NS_PER_MS for r in scheduled) if scheduled else None,
        window=_window_block(measured, bounds, inside, targets),
        chunking=chunking,
        slo=_slo_result(inside, slo, sum(1 for r in measured if bounds.ended_inside(r)) / seconds if seconds else 0.0),
        by_group={g: latency_block([r for r in timed if r.group == g]) for g in groups},
        ttft_ms_by_turn={t: stats(v for r in timed if r.turn == t if (v := ttft_ms(r)) is not None).p50 for t in turns},
    )


def _tokens_inside(r: RequestRecord, bounds: Bounds) -> float:
    """Output tokens of ``r`` whose chunks arrived inside the window (by the chunks' token shares)."""
    shares = r.chunk_tokens if len(r.chunk_tokens) == len(r.chunk_ns) else [1] * len(r.chunk_ns)
    total = sum(shares)
    if not total:
        return float(r.completion_tokens) if bounds.ended_inside(r) else 0.0
    inside = sum(t for at, t in zip(r.chunk_ns, shares, strict=True) if bounds.start_ns <= at <= bounds.end_ns)
    return r.completion_tokens * inside / total


def offered_rate(scheduled: list[RequestRecord]) -> float | None:
    """Requests / span of their scheduled send times: the rate an open loop's schedule asked for."""
    if len(scheduled) < 2:
        return None
    times = sorted(r.scheduled_ns for r in scheduled)
    span = (times[-1] - times[0]) / 1e9
    return (len(times) - 1) / span if span > 0 else None


def _window_block(
    measured: list[RequestRecord], bounds: Bounds, inside: list[RequestRecord], targets: WindowTargets | None
) -> SteadyWindow | None:
    if bounds.concurrency == 0:
        return None
    origin = min(r.start_ns for r in measured)
    firsts: dict[int, int] = {}
    for r in measured:
        if r.slot >= 0:
            firsts[r.slot] = min(firsts.get(r.slot, r.start_ns), r.start_ns)
    want = targets or WindowTargets()
    seconds = bounds.seconds
    met = len(inside) >= want.min_requests and seconds >= want.min_duration_s
    warning = None
    if not met:
        warning = (
            f"the steady-state window held {len(inside)} requests over {seconds:.1f} s, short of "
            f"min_requests {want.min_requests} / min_duration_s {want.min_duration_s:g}: the level ran out of "
            "planned requests (or reached duration_s) first; raise requests_per_slot or lower the minimums"
        )
    return SteadyWindow(
        concurrency=bounds.concurrency,
        ramp_s=(max(firsts.values()) - min(firsts.values())) / 1e9 if firsts else 0.0,
        start_s=(bounds.start_ns - origin) / 1e9,
        end_s=(bounds.end_ns - origin) / 1e9,
        requests_inside=len(inside),
        excluded_ramp=sum(1 for r in measured if r.start_ns < bounds.start_ns),
        excluded_tail=sum(1 for r in measured if r.start_ns >= bounds.start_ns and r.end_ns > bounds.end_ns),
        min_requests=want.min_requests,
        min_duration_s=want.min_duration_s,
        minimum_met=met,
        warning=warning,
    )


def chunking_block(ok: list[RequestRecord]) -> Chunking:
    """Share of chunk gaps that were no gap at all (chunks read together), per run and per request."""
    per_request = [(coalesced_gaps(r), max(len(r.chunk_ns) - 1, 0)) for r in ok]
    gaps = sum(g for _, g in per_request)
    coalesced = sum(c for c, _ in per_request)
    share = coalesced / gaps if gaps else 0.0
    warning = None
    if share > COALESCED_LIMIT:
        warning = (
            f"{share:.0%} of content chunks arrived in the same read as the chunk before them (equal "
            "timestamps): the server or a proxy buffered the stream, so chunk gaps time the client's reads. "
            "ITL, TPOT and tok/s per user are unsupported for this run; TTFT, E2E and throughput stand."
        )
    return Chunking(
        gaps=gaps,
        coalesced_gaps=coalesced,
        share=share,
        requests=len(ok),
        requests_coalesced=sum(1 for c, g in per_request if g and c * 2 >= g),
        warning=warning,
    )


def _mark_coalesced(latency: Latency, chunking: Chunking) -> Latency:
    if chunking.warning is None:
        return latency
    reason = f"chunks coalesced: {chunking.coalesced_gaps} of {chunking.gaps} gaps were 0 (one read)"
    marked = {key: latency.get(key).model_copy(update={"unsupported": reason}) for key in _GAP_METRICS}
    return latency.model_copy(update=marked)


def _slo_result(inside: list[RequestRecord], slo: Slo | None, completed_req_s: float) -> SloResult | None:
    """Attainment over the requests inside the window (failed ones included); goodput = completions/s x it."""
    if slo is None or all(v is None for v in slo.model_dump().values()):
        return None
    good = sum(meets_slo(r, slo) for r in inside)
    attainment = good / len(inside) if inside else 0.0
    return SloResult(**slo.model_dump(), met=good, attainment=attainment, goodput_req_s=completed_req_s * attainment)


def short_completions(ok: list[RequestRecord]) -> ShortCompletions:
    """How many completed requests fell short of their planned output, with a warning if any.

    Only requests with a planned length and a server token count are checked (``checked``).
    """
    checked = [r for r in ok if r.max_tokens > 0 and r.usage_source == "server"]
    short = [r for r in checked if r.short]
    planned = sum(r.max_tokens for r in checked)
    missing = sum(r.max_tokens - r.completion_tokens for r in short)
    warning = None
    if short:
        warning = (
            f"{len(short)} of {len(checked)} requests ended before their planned max_tokens "
            f"({missing} of {planned} planned output tokens not generated): an end-of-sequence id "
            "that ignore_eos does not cover stopped them. Send min_tokens (request.min_tokens: true "
            "in the backend YAML) if the server accepts it, or compare these runs as shorter ones."
        )
    return ShortCompletions(
        checked=len(checked),
        count=len(short),
        share=len(short) / len(checked) if checked else 0.0,
        tokens_missing=missing,
        tokens_planned=planned,
        warning=warning,
    )


def cost_per_million_tokens(cost_per_hour_usd: float | None, output_tok_s: float) -> float | None:
    """Dollars per million output tokens at the measured throughput."""
    if cost_per_hour_usd is None or output_tok_s <= 0:
        return None
    return cost_per_hour_usd / (output_tok_s * 3600.0) * 1e6


def energy_cost_per_million_tokens(j_per_output_token: float | None, usd_per_kwh: float | None) -> float | None:
    """Dollars of electricity per million output tokens: J/token x 10^6 / 3.6 MJ per kWh x the price."""
    if j_per_output_token is None or usd_per_kwh is None:
        return None
    return j_per_output_token * 1e6 / 3.6e6 * usd_per_kwh
