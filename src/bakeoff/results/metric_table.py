"""The one table of metric definitions: formula, words, unit, column label and direction.

Every metric bakeoff reports is one :class:`Metric` row in :data:`METRICS`. The row holds
its definition twice, in code (a per-request ``samples`` function for distributions, a
``read`` from :class:`~bakeoff.results.summary.RunSummary` for run-level figures) and in words for
the glossary, side by side so the two cannot drift. From this table come:

- the per-request distributions in ``summary.json`` (:func:`latency_block`; each needs a
  same-named field in :class:`~bakeoff.results.summary.Latency`, checked when this module loads),
- the report's results frame columns and headline columns (:func:`frame_columns`,
  :func:`headline_columns`),
- the glossary (:func:`glossary`).

The formulas themselves, the nearest-rank statistics and the percentile support rule are
:mod:`bakeoff.results.formulas`; this module holds the rows that name them.

Per-request formulas (peers disagree, so these are bakeoff's own):

- TTFT: request sent -> first chunk carrying generated tokens of any kind, reasoning or
  answer (role-only chunks excluded); for a model that does not reason, its first content
  chunk, as before reasoning phases were read.
- Reasoning models: time to first reasoning token (TTFR) and to first answer token (TTFA),
  ITL and TPOT within each phase, reasoning and answer tokens; over the requests that
  reasoned only (elsewhere TTFA equals TTFT and the rest do not exist).
- TTFB: request sent -> first SSE event of any kind (what some tools call TTFT).
- E2E: request sent -> end of stream.
- "Sent" is the scheduled send time where the run had a schedule (open loop, trace replay),
  so client-side queueing counts (:func:`~bakeoff.results.formulas.latency_origin_ns`); the send-time figures are
  kept beside them as ``ttft_from_send_ms`` and ``e2e_from_send_ms``.
- TPOT: (last content chunk - first content chunk) / (output tokens - tokens in the first
  content chunk), output tokens from the server's usage (:func:`~bakeoff.results.formulas.tpot_ms`).
- ITL: gaps between consecutive content chunks; per token: each gap / tokens in its chunk.
- Percentiles are nearest-rank: every one is a latency some request really had, and SLO
  verdicts compare those against their bounds.
"""

from __future__ import annotations

from collections.abc import Callable

from bakeoff.results.agent_metrics import AGENT_METRICS
from bakeoff.results.formulas import (
    e2e_from_send_ms,
    e2e_ms,
    itl_ms,
    itl_per_token_ms,
    per_gap,
    per_request,
    phase_gaps,
    phase_tpot,
    reasoned,
    stats,
    supported_text,
    tok_s_per_user,
    tpot_ms,
    ttfa_ms,
    ttfb_ms,
    ttfr_ms,
    ttft_from_send_ms,
    ttft_ms,
)
from bakeoff.results.metric_row import Metric, distribution, figure
from bakeoff.results.records import ANSWER, REASONING, RequestRecord
from bakeoff.results.summary import STAT_LABELS, Latency, RunSummary, StatName

# --- the table ----------------------------------------------------------------------------


def _effort(summary: RunSummary, field: str) -> float | None:
    value = getattr(summary.effort, field) if summary.effort is not None else None
    return None if value is None else float(value)


def _prefix(summary: RunSummary, field: str) -> float | None:
    value = getattr(summary.prefix_cache, field) if summary.prefix_cache is not None else None
    return None if value is None else float(value)


METRICS: tuple[Metric, ...] = (
    figure(
        "output_tok_s",
        "output tok/s",
        "tok/s",
        "output tokens that arrived inside the measured window / its length. Closed loop: the steady-state "
        "window (every slot busy; ramp and tail left out); otherwise first send → last end.",
        "higher",
        lambda s: s.throughput.output_tok_s,
        column="out tok/s",
        headline=True,
    ),
    figure(
        "offered_req_s",
        "offered req/s",
        "req/s",
        "open loop: the rate the arrival schedule asked for (requests / span of their scheduled times), "
        "shown beside req/s, the rate achieved.",
        None,
        lambda s: s.throughput.offered_req_s,
    ),
    figure(
        "total_tok_s",
        "total tok/s",
        "tok/s",
        "prompt + output tokens of successful requests / measured window.",
        "higher",
        lambda s: s.throughput.total_tok_s,
    ),
    figure(
        "req_s",
        "req/s",
        "req/s",
        "successful requests / measured window.",
        "higher",
        lambda s: s.throughput.req_s,
        headline=True,
    ),
    distribution(
        "ttft_ms",
        "TTFT",
        "request sent (open loop, trace: its scheduled time) → first chunk that carries generated tokens of "
        "any kind. Role-only or empty chunks do not count. On a reasoning model the first token is usually a "
        "reasoning (thinking) token, in the delta field the server's reasoning parser fills "
        "(`reasoning` / `reasoning_content`), so TTFT is the time to the first token of any kind: the answer's "
        "first token is TTFA. For a model that does not reason both are the first content chunk.",
        "TTFT {stat} ms",
        per_request(ttft_ms),
        headline=("p50", "p99"),
    ),
    distribution(
        "ttfr_ms",
        "TTFR",
        "reasoning models: request sent → first chunk of reasoning (thinking) tokens; over the requests that reasoned.",
        "TTFR {stat} ms",
        reasoned(per_request(ttfr_ms)),
        frame=("p50", "p99"),
        conditional=True,
    ),
    distribution(
        "ttfa_ms",
        "TTFA",
        "reasoning models: request sent → first chunk of answer (`content`) tokens, after the whole reasoning "
        "phase: what a user waiting for the answer sees; over the requests that reasoned (elsewhere it is TTFT).",
        "TTFA {stat} ms",
        reasoned(per_request(ttfa_ms)),
        headline=("p50", "p99"),
        conditional=True,
    ),
    distribution(
        "ttft_from_send_ms",
        "TTFT from send",
        "request actually sent → first content chunk: TTFT without the wait for a free slot; equal to TTFT "
        "where there is no schedule (closed loop).",
        "TTFT-from-send {stat} ms",
        per_request(ttft_from_send_ms),
        frame=("p50", "p99"),
    ),
    distribution(
        "ttfb_ms",
        "TTFB",
        "request sent → first stream event of any kind (what some tools report as TTFT).",
        "TTFB {stat} ms",
        per_request(ttfb_ms),
    ),
    distribution(
        "tpot_ms",
        "TPOT",
        "(last content chunk − first content chunk) / (output tokens − tokens in the first content chunk); "
        "output tokens from the server's `usage`; it ends at the last content chunk, not the usage chunk or "
        "`[DONE]`. vLLM bench's TPOT is (E2E − TTFT) / (output − 1), so it adds the stream's tail and counts a "
        "several-token first chunk as one; GuideLLM's TPOT spreads the whole request latency (TTFT included) "
        'over all output tokens; AIPerf calls this figure "ITL" (its per-chunk gap is bakeoff\'s ITL).',
        "TPOT {stat} ms",
        per_request(tpot_ms),
        headline=("p50", "p99"),
    ),
    distribution(
        "itl_ms",
        "ITL",
        "gap between consecutive content chunks.",
        "ITL {stat} ms",
        per_gap(itl_ms),
        headline=("p99",),
    ),
    distribution(
        "itl_reasoning_ms",
        "ITL reasoning",
        "reasoning models: gap between consecutive reasoning chunks (the switch to the answer belongs to neither "
        "phase).",
        "ITL-reasoning {stat} ms",
        reasoned(phase_gaps(REASONING)),
        frame=("p50", "p99"),
        conditional=True,
    ),
    distribution(
        "itl_answer_ms",
        "ITL answer",
        "reasoning models: gap between consecutive answer chunks.",
        "ITL-answer {stat} ms",
        reasoned(phase_gaps(ANSWER)),
        frame=("p50", "p99"),
        conditional=True,
    ),
    distribution(
        "tpot_reasoning_ms",
        "TPOT reasoning",
        "reasoning models: (last reasoning chunk − first reasoning chunk) / (reasoning tokens − those of the "
        "first reasoning chunk).",
        "TPOT-reasoning {stat} ms",
        reasoned(phase_tpot(REASONING)),
        frame=("p50", "p99"),
        conditional=True,
    ),
    distribution(
        "tpot_answer_ms",
        "TPOT answer",
        "reasoning models: (last answer chunk − first answer chunk) / (answer tokens − those of the first answer "
        "chunk).",
        "TPOT-answer {stat} ms",
        reasoned(phase_tpot(ANSWER)),
        frame=("p50", "p99"),
        conditional=True,
    ),
    distribution(
        "itl_per_token_ms",
        "ITL per token",
        "each ITL gap divided by the tokens in the chunk that ended it (several-token chunks).",
        "ITL/token {stat} ms",
        per_gap(itl_per_token_ms),
        frame=(),
    ),
    distribution(
        "e2e_ms",
        "E2E",
        "request sent (open loop, trace: its scheduled time) → end of the stream.",
        "E2E {stat} ms",
        per_request(e2e_ms),
        headline=("p99",),
    ),
    distribution(
        "e2e_from_send_ms",
        "E2E from send",
        "request actually sent → end of the stream: E2E without the wait for a free slot.",
        "E2E-from-send {stat} ms",
        per_request(e2e_from_send_ms),
        frame=("p50", "p99"),
    ),
    distribution(
        "tok_s_per_user",
        "tok/s per user",
        "1000 / TPOT ms: the decode speed one user sees.",
        "tok/s/user {stat}",
        tok_s_per_user,
        unit="tok/s",
        better="higher",
        frame=("p50",),
        headline=("p50",),
    ),
    figure(
        "reasoning_tokens",
        "reasoning tokens",
        "tok",
        "reasoning models: reasoning (thinking) tokens of successful requests: the server's own count "
        "(`usage.completion_tokens_details.reasoning_tokens`, SGLang's `usage.reasoning_tokens`) where it "
        "sends one, else the tokenizer on the reasoning text, else the reasoning chunks' share of the "
        "completion tokens; summary.json `tokens.reasoning_sources` says which.",
        None,
        lambda s: None if s.tokens.reasoning is None else float(s.tokens.reasoning),
    ),
    figure(
        "answer_tokens",
        "answer tokens",
        "tok",
        "reasoning models: completion tokens − reasoning tokens, of successful requests.",
        None,
        lambda s: None if s.tokens.reasoning is None else float(s.tokens.completion - s.tokens.reasoning),
    ),
    figure(
        "goodput_req_s",
        "goodput",
        "req/s",
        "requests completed in the window per second × the share of them meeting every SLO bound.",
        "higher",
        lambda s: s.slo.goodput_req_s if s.slo else None,
        column="goodput req/s",
        headline=True,
    ),
    figure(
        "slo_attainment",
        "SLO attainment",
        "share",
        "share of measured requests (failed ones included) meeting every SLO bound.",
        "higher",
        lambda s: s.slo.attainment if s.slo else None,
    ),
    figure(
        "usd_per_m_tok",
        "cost / M tok",
        "USD",
        "cost per hour / (output tok/s × 3600) × 10⁶.",
        "lower",
        lambda s: s.cost.usd_per_million_output_tokens if s.cost else None,
        column="$/M tok",
        headline=True,
    ),
    figure(
        "j_per_output_token",
        "J / output token",
        "J",
        "energy over the measured window / output tokens that arrived in it. Energy is the difference of a "
        "cumulative counter (NVML's nvmlDeviceGetTotalEnergyConsumption per GPU, summed; on CPU hosts RAPL's "
        "package energy_uj in /sys/class/powercap, wraparound undone), interpolated to the window's ends "
        "between readings about a second apart; never integrated power samples. Where neither counter can be "
        "read the run says 'not measured' and why (summary.json `energy.reason`).",
        "lower",
        lambda s: s.energy.j_per_output_token if s.energy else None,
        column="J/out tok",
        headline=True,
    ),
    figure(
        "output_tok_per_j",
        "output tok / J",
        "tok/J",
        "output tokens per joule: 1 / (J / output token).",
        "higher",
        lambda s: s.energy.output_tokens_per_j if s.energy else None,
    ),
    figure(
        "avg_power_w",
        "average power",
        "W",
        "energy over the measured window / its length, summed over the devices measured (per device in "
        "summary.json `energy.devices`): every GPU NVML sees, so idle GPUs beside a server on fewer count too.",
        None,
        lambda s: s.energy.average_w if s.energy else None,
    ),
    figure(
        "energy_usd_per_m_tok",
        "energy cost / M tok",
        "USD",
        "J / output token × 10⁶ / 3.6·10⁶ J per kWh × the campaign's `energy_usd_per_kwh`: the electricity "
        "of a million output tokens at the devices measured (no cooling or host overhead).",
        "lower",
        lambda s: s.cost.energy_usd_per_million_output_tokens if s.cost else None,
    ),
    figure(
        "designed_reuse",
        "designed reuse",
        "share",
        "share of prompt tokens repeating an earlier prefix, from the request plan.",
        None,
        lambda s: _prefix(s, "designed_reuse"),
    ),
    figure(
        "reusable",
        "reusable",
        "share",
        "the designed reuse the server's prefix cache can realise: each request's repeated prefix rounded "
        "down to whole cache blocks (vLLM-CPU 128 tokens, vLLM GPU 16, TensorRT-LLM 32, SGLang and llama.cpp any "
        "token run).",
        None,
        lambda s: _prefix(s, "reusable"),
    ),
    figure(
        "server_hit_rate",
        "server hit rate",
        "share",
        "prefix-cache hits / queries from the server's own counters over the run.",
        "higher",
        lambda s: _prefix(s, "server_hit_rate"),
    ),
    figure(
        "cached_tokens_ratio",
        "cached tokens ratio",
        "share",
        "cached prompt tokens the server reported in `usage` / prompt tokens of those requests.",
        "higher",
        lambda s: _prefix(s, "cached_tokens_ratio"),
    ),
    figure(
        "spec_acceptance_rate",
        "draft acceptance",
        "share",
        "speculative decoding: accepted / proposed draft tokens, from the server's counters over the run.",
        "higher",
        lambda s: s.speculative.acceptance_rate if s.speculative else None,
    ),
    figure(
        "spec_accepted_per_step",
        "accepted per step",
        "tokens",
        "speculative decoding: draft tokens accepted per verification step (each step also yields one "
        "token of its own), from the server's counters.",
        "higher",
        lambda s: s.speculative.accepted_per_step if s.speculative else None,
    ),
    figure(
        "engine_build_s",
        "engine build s",
        "s",
        "TensorRT-LLM's `trtllm-build` (engine flow) or llama.cpp's GGUF conversion (or quantization).",
        "lower",
        lambda s: _effort(s, "engine_build_s"),
    ),
    figure(
        "cold_start_s",
        "cold start s",
        "s",
        "launch → health check answers, on the first start.",
        "lower",
        lambda s: _effort(s, "cold_start_s"),
    ),
    figure(
        "warm_restart_s",
        "warm restart s",
        "s",
        "a second start, with the engine's caches (compiled kernels, page cache) filled.",
        "lower",
        lambda s: _effort(s, "warm_restart_s"),
    ),
    *AGENT_METRICS,
)

BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}
DISTRIBUTIONS: tuple[Metric, ...] = tuple(m for m in METRICS if m.samples is not None)

_STATISTICS_NOTE = (
    "P50…P99.9",
    "nearest-rank percentiles over successful, measured requests (closed loop: those inside the steady-state "
    "window), each with its n; failures are counted by kind. A percentile needs at least one sample beyond it "
    "(P99: n ≥ 100) to be more than the largest sample: below that it is shown as unsupported, not as a "
    "number. Across repeats each figure carries a 95% Student-t interval; servers are compared by the ratio of "
    "their figures (Welch's t on log values, paired by round where repeats interleave): a win is significant "
    "and at least min_effect, equivalent lies within ±min_effect, else undecided.",
)


def _check_table() -> None:
    """Every distribution has its Latency field and the reverse: a new metric cannot half-exist."""
    table = {m.key for m in DISTRIBUTIONS}
    fields = set(Latency.model_fields)
    if table != fields:
        raise RuntimeError(
            f"metric table and results.Latency disagree: table only {sorted(table - fields)}, "
            f"Latency only {sorted(fields - table)}; add the field or the table row"
        )
    if len(BY_KEY) != len(METRICS):
        raise RuntimeError("two metric table rows share a key")
    for metric in DISTRIBUTIONS:
        if not set(metric.headline_stats) <= set(metric.frame_stats):
            raise RuntimeError(f"{metric.key}: a headline statistic must also be a frame statistic")


_check_table()


def latency_block(ok: list[RequestRecord]) -> Latency:
    """Every distribution of the table over ``ok`` (successful, measured requests)."""
    return Latency(**{m.key: stats(m.samples(ok)) for m in DISTRIBUTIONS if m.samples is not None})


def frame_columns() -> list[tuple[str, Callable[[RunSummary], float | None]]]:
    """(column, reader) for every metric figure the results frame carries, in table order."""
    columns: list[tuple[str, Callable[[RunSummary], float | None]]] = []
    for metric in METRICS:
        if metric.read is not None:
            columns.append((metric.key, metric.read))
            continue
        for stat in metric.frame_stats:
            columns.append((f"{metric.key}_{stat}", _stat_reader(metric, stat)))
    return columns


def _stat_reader(metric: Metric, stat: StatName) -> Callable[[RunSummary], float | None]:
    return lambda summary: metric.value(summary, stat)


def headline_columns() -> dict[str, str]:
    """Frame column -> report label for the headline table, in table order."""
    labels: dict[str, str] = {}
    for metric in METRICS:
        if metric.read is not None:
            if metric.headline:
                labels[metric.key] = metric.column
            continue
        for stat in metric.headline_stats:
            labels[f"{metric.key}_{stat}"] = metric.column.format(stat=STAT_LABELS[stat])
    return labels


def unsupported_figures(summary: RunSummary) -> dict[str, str]:
    """Frame column -> what to show instead of a figure that is not a measurement (:func:`supported_text`)."""
    found: dict[str, str] = {}
    for metric in METRICS:
        if metric.read is not None:
            continue
        dist = metric.stat(summary)
        if metric.conditional and dist.n == 0 and dist.unsupported is None:
            continue  # not a figure of this run at all (it did not reason)
        for stat in metric.frame_stats:
            if not dist.supported(stat):
                found[f"{metric.key}_{stat}"] = supported_text(dist, stat)
    return found


def headline_readers() -> list[tuple[str, Callable[[RunSummary], float | None]]]:
    """(label, reader) for the headline figures, read straight from a summary."""
    readers = dict(frame_columns())
    return [(label, readers[column]) for column, label in headline_columns().items()]


def glossary() -> str:
    """The report's glossary as a markdown table, one row per metric."""
    rows = [f"| {m.name} | {m.unit} | {m.better or '-'} | {m.definition} |" for m in METRICS]
    rows.append(f"| {_STATISTICS_NOTE[0]} | | | {_STATISTICS_NOTE[1]} |")
    return "\n".join(["", "| metric | unit | better | definition |", "|---|---|---|---|", *rows, ""])
