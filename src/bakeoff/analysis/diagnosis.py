"""Why a server behaved as it did: each server and workload classified, citing the series behind it.

Every verdict rests on the telemetry series of :mod:`bakeoff.observe.telemetry_series` and the
sweep's own figures, and names them, so a reader can check it against the plots:

memory      KV-cache usage near full (>= 90 %), preemptions, or requests waiting while the
            number running stays capped below the offered concurrency — the KV cache is
            the limit (more KV share, shorter contexts, fewer sequences, quantized KV).
batching    the engine is under-used (KV usage low, CPU/GPU busy share low) while requests
            queue and the number running stays capped — a batching cap (``max_num_seqs``,
            llama.cpp's slots) is the limit.
compute     throughput stopped growing with concurrency while the engine is saturated
            (GPU utilisation or CPU cores near full) — more of the same hardware, or
            quantization, is what helps.
scheduling  fast alone, queueing appears with concurrency: TTFT grows several-fold from
            the lowest level while TPOT stays nearly flat — admission and prefill
            scheduling (token budget, chunked prefill) decide the wait.
bandwidth   none of those: throughput still grows with concurrency, and alone (concurrency 1)
            decode runs near the memory-bandwidth floor (the roofline's efficiency at least
            ``NEAR_FLOOR``) — decode is bound by memory bandwidth and batching pays (the
            healthy state).
overhead    throughput still grows with concurrency, but alone a decode step takes well over
            the bandwidth floor (efficiency under ``NEAR_FLOOR``): per-step overhead
            (scheduling, kernel launches, the interpreter), not memory bandwidth, sets the pace.

Precedence follows that order: the first that holds at the busiest level is the verdict.
Whether decode is bandwidth-bound has one source of truth, the roofline fraction
(:func:`bakeoff.analysis.roofline.efficiencies`), cited in the evidence of every label it
bears on; without one the label says it could not be checked. Thresholds are module
constants, named, so the report can quote them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bakeoff.measure.load_modes import load_level
from bakeoff.observe.telemetry_series import SERIES_KEY, read_series, with_rates
from bakeoff.results.layout import CellResult
from bakeoff.results.store import RUN_INFO, read_json_or_empty

Bound = Literal["memory", "batching", "compute", "scheduling", "bandwidth", "overhead", "unknown"]

KV_FULL = 0.9  # KV-cache usage at or above this share is "near full"
KV_LOW = 0.7  # below this the KV cache is not what limits the batch
BUSY_HIGH = 0.85  # engine busy share (GPU utilisation, CPU cores / cores) that counts as saturated
BUSY_LOW = 0.6
WAITING = 1.0  # mean requests waiting at or above this: a queue formed
TTFT_GROWTH = 3.0  # TTFT P50 growth from the lowest level that counts as queueing
TPOT_FLAT = 1.5  # TPOT P50 growth under this counts as flat
SCALING = 0.5  # throughput gain below this share of the concurrency gain: stopped scaling
NEAR_FLOOR = 0.6  # decode efficiency (floor / TPOT at concurrency 1) from which decode is bandwidth-bound


@dataclass(frozen=True)
class Level:
    """One load level of a sweep: its headline figures and its telemetry series (wide, rates added)."""

    concurrency: float
    output_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    series: Any = None  # pandas frame from telemetry_series.with_rates, or None
    cpus: int | None = None  # cores of the machine the engine ran on


@dataclass(frozen=True)
class Signals:
    """What the series said at the level a diagnosis cites: what advice must follow from.

    None where the server exports no such series (llama.cpp has no KV-usage gauge).
    """

    kv_peak: float | None = None  # highest KV-cache usage share
    preemptions: float | None = None  # preemptions during the window
    waiting_mean: float | None = None
    waiting_growth: float | None = None  # mean waiting over the last third minus the first third
    running_max: float | None = None

    @property
    def kv_pressure(self) -> bool:
        """The KV pool was near full or requests were preempted: only then does KV quantization follow."""
        return (self.kv_peak is not None and self.kv_peak >= KV_FULL) or bool(self.preemptions)

    def queued(self) -> bool:
        return self.waiting_mean is not None and self.waiting_mean >= WAITING

    def text(self) -> str:
        parts = []
        if self.kv_peak is not None:
            parts.append(f"KV-cache usage peaked at {self.kv_peak:.1%}")
        if self.preemptions is not None:
            parts.append(f"{self.preemptions:.0f} preemptions")
        if self.waiting_mean is not None:
            parts.append(f"{self.waiting_mean:.1f} requests waiting on average")
        if self.running_max is not None:
            parts.append(f"at most {self.running_max:.0f} running")
        return ", ".join(parts)


def signals(level: Level) -> Signals:
    kv, pre = _col(level.series, "kv_cache_usage"), _col(level.series, "preemptions")
    waiting, running = _col(level.series, "waiting"), _col(level.series, "running")
    growth = None
    if waiting is not None:
        third = max(len(waiting) // 3, 1)
        growth = float(waiting.iloc[-third:].mean() - waiting.iloc[:third].mean())
    return Signals(
        kv_peak=float(kv.max()) if kv is not None else None,
        preemptions=float(pre.iloc[-1] - pre.iloc[0]) if pre is not None else None,
        waiting_mean=float(waiting.mean()) if waiting is not None else None,
        waiting_growth=growth,
        running_max=float(running.max()) if running is not None else None,
    )


@dataclass
class Diagnosis:
    server: str
    workload: str
    bound: Bound
    headline: str
    evidence: list[str] = field(default_factory=list)
    level: float | None = None  # the load level the evidence is from
    signals: Signals = field(default_factory=Signals)  # the series at that level
    lowest: float | None = None  # the lightest load level measured (where latency knobs are judged)
    cpus: int | None = None  # cores of the machine the engine ran on, as its runs recorded

    def markdown(self) -> str:
        cited = "; ".join(self.evidence)
        return f"**{self.server} / {self.workload}: {self.bound}-bound** — {self.headline}" + (
            f" Evidence: {cited}." if cited else ""
        )


def _col(series: Any, name: str) -> Any:
    if series is None or name not in series or not series[name].notna().any():
        return None
    return series[name].dropna()


def _busy(level: Level) -> tuple[float | None, str]:
    """The engine's busy share and how it was read (GPU utilisation, else CPU cores / cores)."""
    gpu = _col(level.series, "gpu_util_pct")
    if gpu is not None:
        return float(gpu.mean()) / 100.0, f"GPU utilisation averaged {gpu.mean():.0f} %"
    cpu = _col(level.series, "cpu_cores")
    if cpu is not None and level.cpus:
        share = float(cpu.mean()) / level.cpus
        return share, f"the engine kept {cpu.mean():.1f} of {level.cpus} cores busy"
    return None, ""


def _memory(level: Level) -> list[str]:
    found: list[str] = []
    kv = _col(level.series, "kv_cache_usage")
    if kv is not None and kv.max() >= KV_FULL:
        at = float(level.series.loc[kv.idxmax(), "t_s"])
        found.append(f"KV-cache usage peaked at {kv.max():.0%} (t = {at:.0f} s)")
    pre = _col(level.series, "preemptions")
    if pre is not None and pre.iloc[-1] - pre.iloc[0] > 0:
        found.append(f"{pre.iloc[-1] - pre.iloc[0]:.0f} preemptions in the window")
    capped = _capped_queue(level)
    if found and capped:
        found.append(capped)
    return found


def _capped_queue(level: Level) -> str | None:
    """Requests waited while the number running stayed below the offered concurrency."""
    waiting, running = _col(level.series, "waiting"), _col(level.series, "running")
    if waiting is None or running is None or waiting.mean() < WAITING:
        return None
    if running.max() >= level.concurrency:
        return None
    third = max(len(waiting) // 3, 1)
    return (
        f"requests waiting went from {waiting.iloc[:third].mean():.1f} to {waiting.iloc[-third:].mean():.1f} "
        f"(mean {waiting.mean():.1f}) while running stayed at most {running.max():.0f} of {level.concurrency:g} offered"
    )


def _batching(level: Level) -> list[str]:
    capped = _capped_queue(level)
    if capped is None:
        return []
    kv = _col(level.series, "kv_cache_usage")
    if kv is not None and kv.max() >= KV_LOW:
        return []
    busy, how = _busy(level)
    if busy is not None and busy >= BUSY_LOW:
        return []
    found = [capped]
    if kv is not None:
        found.append(f"KV-cache usage stayed at or under {kv.max():.0%}")
    if how:
        found.append(how)
    return found


def _scaling(low: Level, high: Level) -> tuple[float, float] | None:
    """(throughput gain, concurrency gain) from the lowest level to the busiest."""
    if not low.output_tok_s or high.output_tok_s is None or high.concurrency <= low.concurrency:
        return None
    return high.output_tok_s / low.output_tok_s, high.concurrency / low.concurrency


def _compute(low: Level, high: Level) -> list[str]:
    scaling = _scaling(low, high)
    busy, how = _busy(high)
    if scaling is None or busy is None:
        return []
    gain, scale = scaling
    if gain >= SCALING * scale or busy < BUSY_HIGH:
        return []
    return [f"throughput grew {gain:.1f}x for {scale:g}x concurrency", how]


def _scheduling(low: Level, high: Level) -> list[str]:
    if not (low.ttft_p50_ms and high.ttft_p50_ms and low.tpot_p50_ms and high.tpot_p50_ms):
        return []
    ttft, tpot = high.ttft_p50_ms / low.ttft_p50_ms, high.tpot_p50_ms / low.tpot_p50_ms
    if ttft < TTFT_GROWTH or tpot >= TPOT_FLAT:
        return []
    found = [
        f"TTFT P50 went from {low.ttft_p50_ms:.0f} ms alone to {high.ttft_p50_ms:.0f} ms at concurrency "
        f"{high.concurrency:g} ({ttft:.1f}x) while TPOT P50 changed {tpot:.2f}x"
    ]
    waiting = _col(high.series, "waiting")
    if waiting is not None:
        found.append(f"the server reported {waiting.mean():.1f} requests waiting on average")
    if high.ttft_p99_ms:
        found.append(f"TTFT P99 is {high.ttft_p99_ms / high.ttft_p50_ms:.1f}x P50")
    return found


_HEADLINES: dict[Bound, str] = {
    "memory": "the KV cache is full: requests are preempted or held back for memory.",
    "batching": "the engine has room but admits few requests at once: a batching cap holds the queue.",
    "compute": "the engine is saturated; more concurrency buys latency, not throughput.",
    "scheduling": "each request is fast alone, but requests queue for admission as concurrency grows.",
    "bandwidth": "throughput still grows with concurrency: decode is memory-bandwidth-bound and batching pays.",
    "overhead": "throughput still grows with concurrency, but a lone decode step is far slower than memory "
    "bandwidth allows: per-step overhead sets the pace, and batching amortises it.",
    "unknown": "too little to go on (one level, or no telemetry).",
}


def _roofline(efficiency: float | None) -> str:
    if efficiency is None:
        return "no roofline (model shape or memory bandwidth unknown): bandwidth-bound not checked"
    if efficiency > 1.0:  # faster than the floor: the bandwidth figure or the TPOT is off, not the engine
        return "alone (concurrency 1) decode beat the memory-bandwidth floor, which cannot be: see the roofline"
    return f"alone (concurrency 1) decode ran at {efficiency:.0%} of the memory-bandwidth floor"


def _unknown(levels: Sequence[Level]) -> str:
    """Why nothing is concluded: the specific gap in the evidence."""
    if len({lv.concurrency for lv in levels}) < 2:
        return "too little to go on: one load level measured, and a bound is read from how load changes things."
    return (
        "too little to go on: throughput stopped scaling with load, but no telemetry says what was saturated "
        "(no engine busy share, KV usage or queue series)."
    )


def classify(server: str, workload: str, levels: Sequence[Level], efficiency: float | None = None) -> Diagnosis:
    """The verdict for one server on one workload, from its levels (any order).

    ``efficiency``: the roofline's decode efficiency at concurrency 1 (floor / TPOT P50), the one
    source for whether decode is bandwidth-bound; None where it could not be computed.
    """
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    if not ordered:
        return Diagnosis(server, workload, "unknown", _HEADLINES["unknown"])
    # Figures from each level's mean over its repeats (the numbers Findings and the verdict show).
    means = _level_means(ordered)
    found = _classify(server, workload, ordered, means, efficiency)
    found.lowest, found.cpus = means[0].concurrency, next((lv.cpus for lv in ordered if lv.cpus), None)
    return found


def _classify(
    server: str, workload: str, ordered: Sequence[Level], means: Sequence[Level], efficiency: float | None
) -> Diagnosis:
    low, high = means[0], means[-1]
    # The busiest level with memory evidence (any repeat's): preemptions may show before the top level.
    for level in reversed(ordered):
        evidence = _memory(level)
        if evidence:
            return Diagnosis(
                server, workload, "memory", _HEADLINES["memory"], evidence, level.concurrency, signals(level)
            )
    checks: tuple[tuple[Bound, list[str]], ...] = (
        ("batching", _batching(high)),
        ("compute", _compute(low, high)),
        ("scheduling", _scheduling(low, high)),
    )
    seen = signals(high)
    for bound, evidence in checks:
        if evidence:
            if bound == "compute" and efficiency is not None:
                # Saturated under load, whatever decode did alone: the roofline says which it was there.
                evidence = [*evidence, _roofline(efficiency)]
            return Diagnosis(server, workload, bound, _HEADLINES[bound], evidence, high.concurrency, seen)
    scaling = _scaling(low, high)
    if scaling is not None and scaling[0] >= SCALING * scaling[1]:
        gain, scale = scaling
        cited = [f"throughput grew {gain:.1f}x for {scale:g}x concurrency", _roofline(efficiency)]
        scaled: Bound = "overhead" if efficiency is not None and efficiency < NEAR_FLOOR else "bandwidth"
        return Diagnosis(server, workload, scaled, _HEADLINES[scaled], cited, high.concurrency, seen)
    return Diagnosis(server, workload, "unknown", _unknown(ordered), [], high.concurrency, seen)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _level_means(ordered: Sequence[Level]) -> list[Level]:
    """One Level per concurrency: the mean of its repeats' figures, the series of its first repeat with one."""
    out: list[Level] = []
    for concurrency in sorted({lv.concurrency for lv in ordered}):
        group = [lv for lv in ordered if lv.concurrency == concurrency]
        series = next((lv.series for lv in group if lv.series is not None), None)
        out.append(
            Level(
                concurrency,
                _mean([lv.output_tok_s for lv in group]),
                _mean([lv.ttft_p50_ms for lv in group]),
                _mean([lv.ttft_p99_ms for lv in group]),
                _mean([lv.tpot_p50_ms for lv in group]),
                series,
                group[0].cpus,
            )
        )
    return out


def levels_of_cell(cell: CellResult) -> list[Level]:
    """A cell's closed-loop levels with their series (``cell``: a CellResult of load_cells)."""
    levels = []
    for run, summary in cell.summaries.items():
        wl = summary.workload
        level = load_level(wl.mode, wl.concurrency, wl.rate)
        if level is None or level[0] != "concurrency":
            continue
        run_dir = cell.dir / "runs" / run
        name = summary.telemetry_series.get(SERIES_KEY)
        series = with_rates(read_series(run_dir / name)) if name and (run_dir / name).is_file() else None
        info = read_json_or_empty(run_dir / RUN_INFO)
        latency = summary.latency
        levels.append(
            Level(
                concurrency=level[1],
                output_tok_s=summary.throughput.output_tok_s,
                ttft_p50_ms=latency.ttft_ms.p50,
                ttft_p99_ms=latency.ttft_ms.p99,
                tpot_p50_ms=latency.tpot_ms.p50,
                series=series,
                cpus=(info.get("machine") or {}).get("cpus"),
            )
        )
    return levels


def diagnose_cells(
    cells: Sequence[CellResult], efficiency: Mapping[tuple[str, str], float] | None = None
) -> list[Diagnosis]:
    """One diagnosis per measured (not rehearsed) server and workload, its repeats' levels together.

    ``efficiency``: (server, workload) -> the roofline's decode efficiency
    (:func:`bakeoff.analysis.roofline.efficiencies`), cited by the labels it decides.
    """
    efficiency = efficiency or {}
    pairs: dict[tuple[str, str], list[Level]] = {}
    for cell in cells:
        if any(s.rehearsal for s in cell.summaries.values()):
            continue  # a stand-in's telemetry says nothing about the framework
        pairs.setdefault((cell.label, cell.workload), []).extend(levels_of_cell(cell))
    return [
        classify(server, workload, levels, efficiency.get((server, workload)))
        for (server, workload), levels in pairs.items()
        if levels
    ]
