"""``summary.json`` as one typed, versioned model: :class:`RunSummary` and its blocks.

This module is the only definition of what a run's summary holds. :mod:`bakeoff.measure.metrics`
builds one from request records, the runner and the campaign add what they know (the
workload, the cache reset, effort, cost), :mod:`bakeoff.results.store` validates it when it is
written and when it is read, and every reader (report, SLO search, CLI) uses its
attributes. Unknown fields are refused, so a misspelt or unplanned field fails loudly
where it is written instead of going missing in a report.

``schema_version`` says which layout a file has. Folders written before the schema
existed (no ``schema_version``: layout 1) are upgraded on read by :func:`migrate`, one
step per version, so a report still renders from them. A file from a newer bakeoff than
this one is refused with a message saying so.

One file is one run, that is one repeat of a cell: intervals across repeats are not in
it but computed where repeats are read together (:mod:`bakeoff.analysis.confidence` for reports,
:mod:`bakeoff.history.index` for the history store). Other parts add ``telemetry_series`` (time
series files beside the run) and :class:`Provenance` (framework version, image digest,
machine, git revision).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION: Final = 5

StatName = Literal["mean", "p50", "p90", "p95", "p99", "p99_9"]
# Percentile statistics and the percentile each stands for.
PERCENTILES: dict[StatName, float] = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99_9": 99.9}
STAT_LABELS: dict[StatName, str] = {
    "mean": "mean",
    "p50": "P50",
    "p90": "P90",
    "p95": "P95",
    "p99": "P99",
    "p99_9": "P99.9",
}


class Block(BaseModel):
    """Base of every summary block: unknown fields are an error, not silently kept."""

    model_config = ConfigDict(extra="forbid")


class Stat(Block):
    """One metric's distribution over a run: n, mean and percentiles (None when n is 0)."""

    n: int = Field(default=0, ge=0)
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_9: float | None = None
    unsupported: str | None = Field(
        default=None, description="why these figures are not measurements (e.g. chunks coalesced in one read)"
    )

    def value(self, name: StatName) -> float | None:
        return float(getattr(self, name)) if getattr(self, name) is not None else None

    def supported(self, name: StatName) -> bool:
        """Whether the statistic is a measurement n samples can support.

        A distribution marked ``unsupported`` supports nothing. Otherwise at least one
        sample must lie beyond a percentile: P99 of 32 requests is the largest sample
        stretched, not a 99th percentile: it needs 100 samples, P99.9 needs 1000, P50 needs 2.
        """
        if self.unsupported is not None:
            return False
        return percentile_supported(name, self.n)


def percentile_supported(name: StatName, n: int) -> bool:
    """Whether ``n`` samples support statistic ``name`` (see :meth:`Stat.supported`)."""
    if name == "mean":
        return n >= 1
    return n * (100.0 - PERCENTILES[name]) / 100.0 >= 1.0 - 1e-9


class Latency(Block):
    """Per-request distributions of successful, measured requests (see the metric table)."""

    ttft_ms: Stat = Field(default_factory=Stat)
    ttfr_ms: Stat = Field(default_factory=Stat)
    ttfa_ms: Stat = Field(default_factory=Stat)
    ttft_from_send_ms: Stat = Field(default_factory=Stat)
    ttfb_ms: Stat = Field(default_factory=Stat)
    tpot_ms: Stat = Field(default_factory=Stat)
    itl_ms: Stat = Field(default_factory=Stat)
    itl_reasoning_ms: Stat = Field(default_factory=Stat)
    itl_answer_ms: Stat = Field(default_factory=Stat)
    tpot_reasoning_ms: Stat = Field(default_factory=Stat)
    tpot_answer_ms: Stat = Field(default_factory=Stat)
    itl_per_token_ms: Stat = Field(default_factory=Stat)
    e2e_ms: Stat = Field(default_factory=Stat)
    e2e_from_send_ms: Stat = Field(default_factory=Stat)
    tok_s_per_user: Stat = Field(default_factory=Stat)

    def get(self, key: str) -> Stat:
        if key not in type(self).model_fields:
            raise KeyError(f"no latency metric {key!r}; known: {', '.join(type(self).model_fields)}")
        stat: Stat = getattr(self, key)
        return stat


class Requests(Block):
    ok: int = Field(ge=0)
    failed: int = Field(ge=0)
    warmup: int = Field(default=0, ge=0)
    failed_by_kind: dict[str, int] = Field(default_factory=dict)


class Throughput(Block):
    """Over the measured window: the steady-state window of a closed loop, else first send -> last end.

    ``offered_req_s``: open loop, the rate the schedule asked for (requests / scheduled span),
    shown beside ``req_s``, the rate achieved.
    """

    output_tok_s: float
    total_tok_s: float
    req_s: float
    window_s: float
    offered_req_s: float | None = None


class Tokens(Block):
    prompt: int
    completion: int
    usage_sources: dict[str, int] = Field(default_factory=dict)
    chunks_per_output_token: float | None = None
    reasoning: int | None = Field(default=None, description="reasoning tokens of the completion; None: none seen")
    reasoning_sources: dict[str, int] = Field(
        default_factory=dict, description="requests whose reasoning count came from server / tokenizer / chunks"
    )


class SteadyWindow(Block):
    """A closed loop's measured window: all slots busy, the ramp and the tail left out.

    Times are seconds from the first measured send. ``minimum_met`` is False when the level
    ended (plan exhausted, ``duration_s`` reached) before ``min_requests`` and ``min_duration_s``.
    """

    concurrency: int = Field(ge=1)
    ramp_s: float = Field(ge=0, description="the first N starts were spread over this long")
    start_s: float = Field(description="the N-th start: every slot busy from here")
    end_s: float = Field(description="the first end not followed by a new start: the tail begins")
    requests_inside: int = Field(ge=0, description="started and ended inside the window: their latencies count")
    excluded_ramp: int = Field(ge=0, description="started before the window (during the ramp)")
    excluded_tail: int = Field(ge=0, description="ended after the window (during the tail)")
    min_requests: int = 0
    min_duration_s: float = 0.0
    minimum_met: bool = True
    warning: str | None = None


class Chunking(Block):
    """How content chunks reached the client: gaps of zero mean chunks shared one read.

    A coalesced gap is one whose chunk arrived in the same read as the previous chunk (equal
    timestamps); ITL and TPOT built from such gaps time the client's reads, not the server.
    """

    gaps: int = 0
    coalesced_gaps: int = 0
    share: float = 0.0
    requests: int = 0
    requests_coalesced: int = Field(default=0, description="requests with at least half their gaps coalesced")
    warning: str | None = None


class ShortCompletions(Block):
    """Completed requests that ended before their planned ``max_tokens`` (server counts only)."""

    checked: int = 0
    count: int = 0
    share: float = 0.0
    tokens_missing: int = 0
    tokens_planned: int = 0
    warning: str | None = None


class SloResult(Block):
    """The SLO the run was judged by, and how the run did against it."""

    preset: str | None = None
    ttft_ms: float | None = None
    ttfa_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    met: int = Field(ge=0, description="requests meeting every bound")
    attainment: float
    goodput_req_s: float
    p99_met: bool | None = Field(default=None, description="P99 of every bounded metric within its bound")


class WorkloadInfo(Block):
    """Which run of which workload this was; ``spec`` is the workload as the campaign gave it."""

    run: str = ""
    mode: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    repeat: int = Field(default=1, ge=1, description="which repeat of the cell this run is (1-based)")
    spec: dict[str, Any] = Field(default_factory=dict)


class CacheResetResult(Block):
    """Whether the prefix cache was emptied before the run (True / False / None not tried)."""

    kind: str
    ok: bool | None
    attempts: int = 0
    detail: str = ""


class PrefixCache(Block):
    """Designed prefix reuse beside what the server's counters and usage say was realised."""

    designed_reuse: float | None = None
    cache_granularity: int | None = Field(default=None, description="the server's prefix-cache block, tokens")
    reusable: float | None = Field(
        default=None, description="the designed reuse whole blocks of that size can realise (1: any token run)"
    )
    cached_tokens_ratio: float | None = None
    server_hit_rate: float | None = None
    server_hits: float | None = None
    server_queries: float | None = None
    server_hit_unit: str | None = None
    reuse_realised: bool | None = None
    cache_emptied_before_run: bool | None = None


class CriticalPath(Block):
    """Where a task's completion time went, along its critical path (mean seconds per task).

    From the task's last answer back to its first call, each step to the dependency that
    answered last: server time split at the first token (prefill: sent -> first token, queueing
    on the server included; decode: first token -> end), and the gaps between a dependency's
    answer and the next call (tool latency, think time, client). The parts add up to the task time.
    """

    prefill_s: float
    decode_s: float
    wait_s: float
    calls: float = Field(description="calls on the critical path, mean per task")


class DepthReuse(Block):
    """Prompt tokens, cached tokens and designed reuse of one tree depth's calls."""

    calls: int
    prompt_tokens: int
    cached_tokens: int | None = Field(default=None, description="None: the server reported no cached tokens")
    hit_rate: float | None = None
    designed_reuse: float | None = Field(default=None, description="from the plan, before the server's granularity")
    reusable: float | None = Field(default=None, description="the designed reuse whole cache blocks can realise")
    ttft_ms: Stat = Field(default_factory=Stat)


class AgentTasks(Block):
    """Agent task trees over the run: task completion, its critical path, reuse and TTFT by depth, role, branch."""

    tasks: int = Field(ge=0, description="tasks whose every call answered")
    failed_tasks: int = Field(default=0, ge=0)
    calls: int = Field(ge=0)
    task_s: Stat = Field(default_factory=Stat, description="first call sent -> last answer, completed tasks")
    critical_path: CriticalPath | None = None
    window_s: float = Field(default=0.0, description="first call sent -> last answer of the run")
    tasks_per_min: float = 0.0
    task_slo_s: float | None = None
    within_slo: int | None = Field(default=None, description="completed tasks within task_slo_s")
    task_goodput_per_min: float | None = Field(default=None, description="tasks within the task SLO per minute")
    by_depth: dict[int, DepthReuse] = Field(default_factory=dict)
    ttft_ms_by_role: dict[str, Stat] = Field(default_factory=dict)
    ttft_ms_by_branch: dict[int, Stat] = Field(
        default_factory=dict, description="TTFT by a call's place among its planner's children (trunk calls: none)"
    )
    preemptions: float | None = Field(default=None, description="KV preemptions over the run; None: not exposed")
    evicted_tokens: float | None = Field(
        default=None, description="prefix-cache tokens evicted over the run (SGLang counts them); None: not counted"
    )


class Speculative(Block):
    """Speculative decoding over the run, from the server's own counters (differenced)."""

    draft_tokens: float
    accepted_tokens: float
    drafts: float | None = None
    acceptance_rate: float | None = Field(default=None, description="accepted / proposed draft tokens")
    accepted_per_step: float | None = Field(default=None, description="accepted tokens per verification step")


class CacheRestart(Block):
    before_run: str
    stop_s: float
    start_s: float


class PyTorchBuild(Block):
    """TensorRT-LLM's PyTorch-flow build inside its cold start, per phase, from the server log
    (:mod:`bakeoff.serving.trtllm_log`): what the engine flow's ``trtllm-build`` does ahead of time."""

    load_s: float = Field(description="LLM API start to the first autotuning: MPI workers, weights, KV cache")
    autotune_s: float = Field(description="kernel autotuning, every round summed")
    cuda_graph_s: float = Field(description="CUDA-graph capture, every round summed")
    total_s: float = Field(description="the first marker to the end of the last phase")
    rounds: int = Field(description="autotune + capture rounds (2 when the KV cache was sized by a profiling pass)")
    cuda_graph_batch_sizes: int | None = None
    serving_seen: bool = Field(description="the log reached 'Uvicorn running on'")


class Effort(Block):
    """Engineering effort of the cell the run belongs to (the same for every run of a cell)."""

    cold_start_s: float | None = None
    warm_restart_s: float | None = None
    # warm_repeats: the cell whose start this cell measured on (None: a start of its own).
    warm_start_of: str | None = None
    image_build_s: float | None = None
    engine_build_s: float | None = None
    # What engine_build_s timed: "trtllm-build" (the engine flow), "GGUF conversion" (llama.cpp).
    engine_build_step: str | None = None
    # The engine flow: True when the engine came from the cache (engine_build_s is then the original build's).
    engine_build_cached: bool | None = None
    # The PyTorch flow's build (load, autotune, CUDA graphs), read from its log; part of cold_start_s.
    pytorch_build: PyTorchBuild | None = None
    cache_restart_s: float | None = None
    cache_restarts: list[CacheRestart] = Field(default_factory=list)
    flags_changed: int | None = None
    non_default_knobs: dict[str, Any] = Field(default_factory=dict)
    config_lines: int | None = None
    knob_change_needs: dict[str, str] = Field(default_factory=dict)
    launch_warnings: list[str] = Field(default_factory=list)
    failed_start_attempts: list[str] = Field(default_factory=list)


class Cost(Block):
    usd_per_hour: float | None = None
    usd_per_million_output_tokens: float | None = None
    energy_usd_per_kwh: float | None = Field(default=None, description="the campaign's energy price")
    energy_usd_per_million_output_tokens: float | None = Field(
        default=None, description="measured J per output token x 10^6 / 3.6 MJ per kWh x the energy price"
    )


class DeviceEnergy(Block):
    """One device's energy over the measured window, from its cumulative counter."""

    device: str = Field(description="e.g. 'gpu0 NVIDIA H200' or 'cpu package-0'")
    joules: float = Field(ge=0)
    average_w: float | None = None


class Energy(Block):
    """Energy over the run's measured window, from cumulative counters (never integrated power samples).

    ``source``: ``nvml`` (nvmlDeviceGetTotalEnergyConsumption, per GPU) or ``rapl``
    (``/sys/class/powercap`` package zones); None with ``reason`` when nothing could be read.
    ``start_s``/``end_s``: the window the counters were read over, seconds from the first
    reading (the counters are interpolated to the measured window's ends between readings).
    """

    source: Literal["nvml", "rapl"] | None = None
    reason: str | None = Field(default=None, description="why energy was not measured")
    devices: list[DeviceEnergy] = Field(default_factory=list)
    joules: float | None = None
    window_s: float | None = None
    start_s: float | None = None
    end_s: float | None = None
    readings: int = 0
    output_tokens: float | None = Field(default=None, description="output tokens that arrived in the window")
    j_per_output_token: float | None = None
    output_tokens_per_j: float | None = None
    average_w: float | None = None


class Provenance(Block):
    """What produced the numbers, for history and for reports built across time."""

    bakeoff_version: str | None = None
    git_revision: str | None = None
    framework_version: str | None = None
    server_kind: str | None = None
    image: str | None = None
    image_digest: str | None = None
    machine: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    # Where the run was measured on a Ray cluster (campaign run --ray); None for local runs.
    node_id: str | None = None
    gpu_type: str | None = None
    gpu_driver: str | None = None


class ClientLoad(Block):
    """The load generator's own load: how many processes drove the run, and how busy they were."""

    processes: int = Field(description="client processes that sent the measured requests")
    decided_by: Literal["fixed", "auto"] = "auto"
    cpu_util: list[float] = Field(default_factory=list, description="CPU time / wall time of each process")
    headroom: float | None = Field(default=None, description="1 - the busiest process's CPU share")
    estimate: dict[str, float | None] = Field(
        default_factory=dict, description="auto: warm-up chunk demand and CPU per chunk the choice came from"
    )


class HostLoad(Block):
    """The host's CPU while the run was measured (:func:`bakeoff.observe.hoststats.host_load`)."""

    cpus: int = Field(description="CPUs the harness may run on")
    loadavg_1m: float | None = None
    busy_cores: float | None = Field(default=None, description="cores busy on the whole host over the window")
    engine_cores: float | None = Field(default=None, description="a local engine's mean CPU (cores busy)")
    client_cores: float | None = Field(default=None, description="the load generator's CPU (cores busy)")
    other_cores: float | None = Field(default=None, description="busy - engine - client: other processes")
    busy: bool = Field(default=False, description="other processes took enough CPU to disturb the run")
    note: str | None = None


class ServerDied(Block):
    """A server that died mid-run: the evidence that ended the run there (:mod:`bakeoff.serving.death_watch`)."""

    how: str = Field(description="process exited, container stopped, port closed, or connects kept failing")
    detected_after_s: float
    exit_code: int | None = None
    stream_cuts: int = 0
    connect_failures: int = 0
    requests_finished: int = 0
    requests_not_sent: int = 0
    log_tail: str = ""


class RunSummary(Block):
    """The results of one run: ``summary.json``."""

    schema_version: Literal[5] = SCHEMA_VERSION
    requests: Requests
    latency: Latency
    throughput: Throughput
    tokens: Tokens
    short_completions: ShortCompletions = Field(default_factory=ShortCompletions)
    queue_delay_ms: Stat | None = Field(default=None, description="open loop: actual send - scheduled send")
    window: SteadyWindow | None = Field(default=None, description="closed loop: the steady-state window measured")
    chunking: Chunking = Field(default_factory=Chunking)
    slo: SloResult | None = None
    by_group: dict[str, Latency] = Field(default_factory=dict)
    ttft_ms_by_turn: dict[int, float | None] = Field(default_factory=dict, description="TTFT P50 by turn")
    workload: WorkloadInfo = Field(default_factory=WorkloadInfo)
    interrupted: bool = False
    server_died: ServerDied | None = Field(default=None, description="set when the server died mid-run")
    rehearsal: bool = Field(default=False, description="a reference-server stand-in, never a measurement")
    cache_reset: CacheResetResult | None = None
    prefix_cache: PrefixCache | None = None
    speculative: Speculative | None = Field(default=None, description="set when the server proposed draft tokens")
    agent_tasks: AgentTasks | None = Field(default=None, description="agentic workloads: task trees over the run")
    trace: dict[str, Any] | None = Field(
        default=None, description="trace replays: source file and digest, requests, rows left out or clipped, rate"
    )
    effort: Effort | None = None
    cost: Cost | None = None
    energy: Energy | None = Field(default=None, description="energy over the measured window, or why not measured")
    provenance: Provenance = Field(default_factory=Provenance)
    client: ClientLoad | None = Field(default=None, description="load-generator processes and their CPU headroom")
    host: HostLoad | None = Field(default=None, description="the host's CPU while measured: a busy host is flagged")
    telemetry_series: dict[str, str] = Field(
        default_factory=dict, description="series name -> file beside summary.json"
    )


# --- older layouts ----------------------------------------------------------------------

_V1_LATENCY = ("ttft_ms", "ttfb_ms", "tpot_ms", "itl_ms", "itl_per_token_ms", "e2e_ms", "tok_s_per_user")
_V1_WORKLOAD_KEYS = ("run", "mode", "concurrency", "rate")


def _v1_stat(raw: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in raw.items() if k not in ("count", "p99.9")}
    out["n"] = raw.get("count", 0)
    out["p99_9"] = raw.get("p99.9")
    return out


def _v1_latency(raw: dict[str, Any]) -> dict[str, Any]:
    return {key: _v1_stat(raw[key]) for key in _V1_LATENCY if key in raw}


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """Layout 1 (before schema_version): latency stats at the top level, ``count``, ``p99.9``."""
    out = {k: v for k, v in raw.items() if k not in _V1_LATENCY}
    out["latency"] = _v1_latency(raw)
    if raw.get("queue_delay_ms") is not None:
        out["queue_delay_ms"] = _v1_stat(raw["queue_delay_ms"])
    if raw.get("by_group"):
        out["by_group"] = {group: _v1_latency(block) for group, block in raw["by_group"].items()}
    workload = raw.get("workload") or {}
    out["workload"] = {k: workload[k] for k in _V1_WORKLOAD_KEYS if k in workload}
    out["workload"]["spec"] = {k: v for k, v in workload.items() if k not in _V1_WORKLOAD_KEYS}
    out["schema_version"] = 2
    return out


def _v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """Layout 2 lacked the steady window, chunking, send-time latencies and offered rate: all optional."""
    return {**raw, "schema_version": 3}


def _without_intervals(block: Any) -> Any:
    return {k: v for k, v in block.items() if k != "intervals"} if isinstance(block, dict) else block


def _v3_to_v4(raw: dict[str, Any]) -> dict[str, Any]:
    """Layout 3 had per-run ``intervals`` fields that were never filled (a run is one repeat)."""
    out = {**raw, "schema_version": 4}
    for key in ("throughput", "slo", "queue_delay_ms"):
        if key in out:
            out[key] = _without_intervals(out[key])
    if isinstance(out.get("latency"), dict):
        out["latency"] = {name: _without_intervals(stat) for name, stat in out["latency"].items()}
    if isinstance(out.get("by_group"), dict):
        out["by_group"] = {
            group: {name: _without_intervals(stat) for name, stat in latency.items()}
            for group, latency in out["by_group"].items()
        }
    return out


def _v4_to_v5(raw: dict[str, Any]) -> dict[str, Any]:
    """Layout 4 lacked reasoning-phase figures and energy: all optional, so nothing to convert."""
    return {**raw, "schema_version": 5}


# From version N to N + 1.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
}


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring a summary.json body of any known layout to the current one.

    Raises ValueError for a layout newer than this bakeoff knows.
    """
    version = raw.get("schema_version", 1)
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"schema_version must be a positive integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"written by a newer bakeoff (schema_version {version}; this one reads up to {SCHEMA_VERSION}): "
            "upgrade bakeoff to read it"
        )
    while version < SCHEMA_VERSION:
        raw = _MIGRATIONS[version](raw)
        version += 1
    return raw
