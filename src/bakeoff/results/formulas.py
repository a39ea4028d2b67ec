"""Per-request formulas, nearest-rank statistics and the sample each percentile needs.

The formulas the metric table (:mod:`bakeoff.results.metric_table`) puts in its rows, and the words
for them are there, beside each row; here is the arithmetic: per-request figures from a
:class:`~bakeoff.results.records.RequestRecord`, the samples of each distribution over a run's
successful requests, nearest-rank percentiles, and the support rule (a percentile is shown only
where the sample has enough requests for it, else the highest one it supports).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise

import numpy as np

from bakeoff.results.records import ANSWER, REASONING, RequestRecord
from bakeoff.results.summary import PERCENTILES, STAT_LABELS, Stat, StatName

NS_PER_MS = 1e6

# --- per-request formulas ------------------------------------------------------------------


def latency_origin_ns(r: RequestRecord) -> int:
    """Where a request's latency clock starts: its scheduled send time when it had one.

    Open-loop and trace runs schedule every request; one sent late (a concurrency cap, a
    client falling behind) has waited since its scheduled time, and that wait belongs in
    its TTFT and E2E, or the queueing vanishes from them (coordinated omission). The
    send-time view stays recoverable: ``queue_delay_ms`` is send - scheduled.
    """
    return r.scheduled_ns or r.start_ns


def ttft_ms(r: RequestRecord) -> float | None:
    return (r.first_token_ns - latency_origin_ns(r)) / NS_PER_MS if r.first_token_ns else None


def ttft_from_send_ms(r: RequestRecord) -> float | None:
    """TTFT from the moment the request was actually sent (the figure that hides client queueing)."""
    return (r.first_token_ns - r.start_ns) / NS_PER_MS if r.first_token_ns else None


def e2e_from_send_ms(r: RequestRecord) -> float:
    return (r.end_ns - r.start_ns) / NS_PER_MS


def ttfb_ms(r: RequestRecord) -> float | None:
    return (r.first_event_ns - latency_origin_ns(r)) / NS_PER_MS if r.first_event_ns else None


def e2e_ms(r: RequestRecord) -> float:
    return (r.end_ns - latency_origin_ns(r)) / NS_PER_MS


def tpot_ms(r: RequestRecord) -> float | None:
    """(last content chunk - first content chunk) / (output tokens - tokens in the first chunk).

    It ends at the last content chunk, not at the usage chunk or ``[DONE]`` that follow it,
    and divides by the tokens generated after the first chunk, which on SGLang and
    TensorRT-LLM can carry several.
    """
    if not r.chunk_ns or not r.first_token_ns:
        return None
    first_chunk = r.chunk_tokens[0] if len(r.chunk_tokens) == len(r.chunk_ns) else 1
    after_first = r.completion_tokens - first_chunk
    if after_first <= 0:
        return None
    return (r.chunk_ns[-1] - r.first_token_ns) / NS_PER_MS / after_first


def _first_ms(r: RequestRecord, phase: int) -> float | None:
    times = r.phase_ns(phase)
    return (times[0] - latency_origin_ns(r)) / NS_PER_MS if times else None


def ttfr_ms(r: RequestRecord) -> float | None:
    """Time to the first reasoning chunk; None when the request did not reason."""
    return _first_ms(r, REASONING)


def ttfa_ms(r: RequestRecord) -> float | None:
    """Time to the first answer chunk (equal to TTFT for a request that did not reason)."""
    return _first_ms(r, ANSWER)


def phase_itl_ms(r: RequestRecord, phase: int) -> list[float]:
    """Gaps between consecutive chunks of one phase (the switch between phases belongs to neither)."""
    return [(b - a) / NS_PER_MS for a, b in pairwise(r.phase_ns(phase))]


def phase_tpot_ms(r: RequestRecord, phase: int) -> float | None:
    """TPOT within one phase: (its last chunk - its first) / (its tokens - those of its first chunk)."""
    times, tokens = r.phase_ns(phase), r.phase_tokens(phase)
    if len(times) < 2 or sum(tokens) - tokens[0] <= 0:
        return None
    return (times[-1] - times[0]) / NS_PER_MS / (sum(tokens) - tokens[0])


def coalesced_gaps(r: RequestRecord) -> int:
    """Gaps between content chunks that arrived in the same read (equal timestamps)."""
    return sum(1 for a, b in pairwise(r.chunk_ns) if a == b)


def itl_ms(r: RequestRecord) -> list[float]:
    ns = r.chunk_ns
    return [(b - a) / NS_PER_MS for a, b in pairwise(ns)]


def itl_per_token_ms(r: RequestRecord) -> list[float]:
    """Each gap divided by the tokens the later chunk carried (several-token chunks)."""
    gaps = itl_ms(r)
    tokens = r.chunk_tokens[1:] if len(r.chunk_tokens) == len(r.chunk_ns) else [1] * len(gaps)
    return [g / t for g, t in zip(gaps, tokens, strict=True) if t > 0]


def nearest_rank(values: Iterable[float], percentile: float) -> float | None:
    """The nearest-rank percentile: the smallest sample with at least ``percentile`` % at or below it."""
    arr = np.fromiter(values, dtype=np.float64)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, percentile, method="inverted_cdf"))


def stats(values: Iterable[float]) -> Stat:
    """n, mean and the standard percentiles (nearest-rank); all None when there are no values."""
    arr = np.fromiter(values, dtype=np.float64)
    if arr.size == 0:
        return Stat()
    pct = np.percentile(arr, list(PERCENTILES.values()), method="inverted_cdf")
    return Stat(
        n=int(arr.size),
        mean=float(arr.mean()),
        **{name: float(v) for name, v in zip(PERCENTILES, pct, strict=True)},
    )


# --- samples of each distribution over a run's successful requests -------------------------

Samples = Callable[[list[RequestRecord]], Iterable[float]]


def per_request(formula: Callable[[RequestRecord], float | None]) -> Samples:
    def samples(ok: list[RequestRecord]) -> Iterator[float]:
        return (v for v in map(formula, ok) if v is not None)

    return samples


def per_gap(formula: Callable[[RequestRecord], list[float]]) -> Samples:
    def samples(ok: list[RequestRecord]) -> Iterator[float]:
        return (g for r in ok for g in formula(r))

    return samples


def tok_s_per_user(ok: list[RequestRecord]) -> Iterator[float]:
    return (1000.0 / t for t in map(tpot_ms, ok) if t is not None and t > 0)


def reasoned(samples: Samples) -> Samples:
    """Samples over the requests that reasoned only: elsewhere the phase figures do not exist."""

    def only(ok: list[RequestRecord]) -> Iterable[float]:
        return samples([r for r in ok if r.reasons])

    return only


def phase_gaps(phase: int) -> Samples:
    return per_gap(lambda r: phase_itl_ms(r, phase))


def phase_tpot(phase: int) -> Samples:
    return per_request(lambda r: phase_tpot_ms(r, phase))


def highest_supported(dist: Stat) -> StatName | None:
    """The highest percentile ``dist``'s sample supports (P90 at n=24), or None when it supports none."""
    found: StatName | None = None
    for name in PERCENTILES:
        if dist.supported(name) and dist.value(name) is not None:
            found = name
    return found


def needed_samples(name: StatName) -> int:
    """The fewest samples that support percentile ``name`` (P99: 100)."""
    return max(1, round(100.0 / (100.0 - PERCENTILES[name]))) if name in PERCENTILES else 1


def supported_text(dist: Stat, stat: StatName, digits: int = 2) -> str:
    """What a table shows in place of a percentile ``dist``'s sample does not support: the highest one it does.

    ``P90 41.20 (n=24; P99 needs ≥100)``: the one support rule, said the same in the report's
    tables and bench's terminal; ``unsupported (n=1)`` when no percentile is supported, and
    ``unsupported`` when the distribution is not a measurement at all (coalesced chunks).
    """
    if dist.unsupported is not None:
        return "unsupported"
    best = highest_supported(dist)
    if best is None or PERCENTILES.get(best, 0.0) >= PERCENTILES.get(stat, 0.0):
        return f"unsupported (n={dist.n})"
    return (
        f"{STAT_LABELS[best]} {dist.value(best):,.{digits}f} "
        f"(n={dist.n}; {STAT_LABELS[stat]} needs ≥{needed_samples(stat)})"
    )


def shown(dist: Stat, stat: StatName) -> float | str | None:
    """A table cell for ``stat`` of ``dist``: the number where the sample supports it, else :func:`supported_text`.

    None where there is no sample at all (a class no request fell in).
    """
    if dist.n == 0 and dist.unsupported is None:
        return None
    return dist.value(stat) if dist.supported(stat) else supported_text(dist, stat)
