"""The soak part of the comparison report: each server's windows, its trends, and the cure's pair.

A soak (:class:`bakeoff.workloads.kinds.Soak`) answers what hours of one mixed load do to a
server, so its figures are series over windows (:mod:`bakeoff.analysis.soak`): throughput,
P99 TTFT and the memory neither the weights nor the KV pool account for. Each trend is
stated with its interval and verdict (:mod:`bakeoff.analysis.drift`). Two servers of one
backend that differ only in ``max_model_len`` are the cure's comparison (the seed's cap at the
workload's need + 20%): their series are shown side by side, window by window.
Kept apart from :mod:`bakeoff.report.tables`; ``compare.ipynb`` calls this module directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.analysis.soak import P99_TTFT, UNACCOUNTED, SoakResult, SoakWindow, soak_result
from bakeoff.report.plots import server_palette
from bakeoff.results.layout import load_cells

MIB = 2**20
CAP_KNOB = "max_model_len"


@dataclass
class SoakRun:
    server: str
    workload: str
    backend: str
    knobs: dict[str, Any]
    result: SoakResult


def soak_runs(campaign_dir: Path) -> list[SoakRun]:
    """Every soak run of the campaign (first repeat of each server and soak workload)."""
    found: dict[tuple[str, str], SoakRun] = {}
    for cell in sorted(load_cells(campaign_dir), key=lambda c: c.repeat):
        for run in cell.summaries:
            result = soak_result(cell.dir / "runs" / run)
            if result is not None and (cell.label, cell.workload) not in found:
                found[(cell.label, cell.workload)] = SoakRun(
                    cell.label, cell.workload, cell.backend, cell.knobs, result
                )
    return list(found.values())


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


def window_table(runs: list[SoakRun]) -> pd.DataFrame:
    """One row per server and window: throughput, P50/P99 with n, failures, preemptions, memory."""
    rows = []
    for run in runs:
        for w in run.result.windows:
            rows.append(
                {
                    "server": run.server,
                    "window": w.index + 1,
                    "from s": w.start_s,
                    "settling": w.index < run.result.settle_windows,
                    "sent": w.sent,
                    "output tok/s": w.output_tok_s,
                    "req/s": w.req_s,
                    "TTFT P50 ms": w.ttft_p50_ms,
                    "TTFT P99 ms": w.ttft_p99_ms,
                    "TTFT n": w.ttft_n,
                    "TPOT P50 ms": w.tpot_p50_ms,
                    "TPOT P99 ms": w.tpot_p99_ms,
                    "TPOT n": w.tpot_n,
                    "failed": ", ".join(f"{k} {v}" for k, v in sorted(w.failures.items())) or "0",
                    "preemptions": w.preemptions,
                    "engine memory MiB": _mib(w.memory_bytes),
                    "KV pool used": w.kv_usage,
                    "unaccounted MiB": _mib(w.unaccounted_bytes),
                }
            )
    return pd.DataFrame(rows).round(3)


def trend_table(runs: list[SoakRun]) -> pd.DataFrame:
    """Each server's trends: the change over the soak with its interval, the margin, and the verdict."""
    rows = []
    for run in runs:
        for t in run.result.trends:
            rows.append(
                {
                    "server": run.server,
                    "series": f"{t.metric} ({t.unit})",
                    "windows judged": t.n,
                    "change over soak": t.change,
                    f"{t.level:.0%} interval": "-" if t.low is None else f"[{t.low:+.3g}, {t.high:+.3g}]",
                    "margin ±": t.margin,
                    "verdict": t.verdict,
                }
            )
    return pd.DataFrame(rows).round(3)


def memory_table(runs: list[SoakRun]) -> pd.DataFrame:
    """What each server's memory was accounted with: weights, KV pool, and how each was sized."""
    rows = []
    for run in runs:
        acc = run.result.account
        rows.append(
            {
                "server": run.server,
                "engine memory from": "-"
                if acc is None
                else {"rss": "process-tree RSS", "nvml": "NVML used"}.get(acc.source, "not measured"),
                "weights MiB": None if acc is None else _mib(acc.weights_bytes),
                "KV pool MiB": None if acc is None else _mib(acc.kv_pool_bytes),
                "KV pool tokens": None if acc is None else acc.kv_pool_tokens,
                "KV pool sized from": "no memory.json" if acc is None else acc.kv_pool_from,
                "notes": "" if acc is None else "; ".join(acc.notes),
            }
        )
    return pd.DataFrame(rows).round(1)


def cure_pairs(runs: list[SoakRun]) -> list[tuple[SoakRun, SoakRun]]:
    """(uncapped, capped): servers of one backend and workload whose knobs differ only in ``max_model_len``."""
    pairs = []
    for capped in runs:
        cap = capped.knobs.get(CAP_KNOB)
        if cap is None:
            continue
        for other in runs:
            rest = {k: v for k, v in other.knobs.items() if k != CAP_KNOB}
            same = rest == {k: v for k, v in capped.knobs.items() if k != CAP_KNOB}
            other_cap = other.knobs.get(CAP_KNOB)
            wider = other_cap is None or (isinstance(other_cap, int) and isinstance(cap, int) and other_cap > cap)
            kin = other is not capped and other.backend == capped.backend and other.workload == capped.workload
            if kin and same and wider:
                pairs.append((other, capped))
    return pairs


def pair_table(uncapped: SoakRun, capped: SoakRun) -> pd.DataFrame:
    """The two series side by side, window by window: throughput, P99 TTFT and unaccounted memory."""
    rows = []
    for a, b in zip(uncapped.result.windows, capped.result.windows, strict=False):
        rows.append(
            {
                "window": a.index + 1,
                f"tok/s {uncapped.server}": a.output_tok_s,
                f"tok/s {capped.server}": b.output_tok_s,
                f"P99 TTFT ms {uncapped.server}": a.ttft_p99_ms,
                f"P99 TTFT ms {capped.server}": b.ttft_p99_ms,
                f"unaccounted MiB {uncapped.server}": _mib(a.unaccounted_bytes),
                f"unaccounted MiB {capped.server}": _mib(b.unaccounted_bytes),
            }
        )
    return pd.DataFrame(rows).round(2)


def pair_verdicts(uncapped: SoakRun, capped: SoakRun) -> str:
    """One line per server of the pair: its cap and its P99 and memory verdicts."""
    lines = []
    for run in (uncapped, capped):
        cap = run.knobs.get(CAP_KNOB)
        said = [t.line() for t in run.result.trends if t.metric in (P99_TTFT, UNACCOUNTED)]
        lines.append(f"- **{run.server}** (`{CAP_KNOB}` {cap if cap is not None else 'unset'}): " + "; ".join(said))
    return "\n".join(lines)


def soak_figure(runs: list[SoakRun]) -> Any:
    """Throughput, P99 TTFT and unaccounted memory by window mid-time, a line per server (capped dashed)."""
    import matplotlib.pyplot as plt  # deferred: plotting libraries load in seconds; tables need none

    palette = server_palette(r.server for r in runs)
    panels: tuple[tuple[str, Callable[[SoakWindow], float | None]], ...] = (
        ("output tok/s", lambda w: w.output_tok_s),
        ("P99 TTFT (ms)", lambda w: w.ttft_p99_ms),
        ("unaccounted memory (MiB)", lambda w: _mib(w.unaccounted_bytes)),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.4))
    for ax, (title, value) in zip(axes, panels, strict=True):
        for run in runs:
            xs = [w.mid_s for w in run.result.windows]
            ys = [value(w) for w in run.result.windows]
            style = "--" if run.knobs.get(CAP_KNOB) is not None else "-"
            ax.plot(xs, [float("nan") if y is None else y for y in ys], style, marker="o", ms=3,
                    color=palette[run.server], label=run.server)  # fmt: skip
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("soak time (s, window middle)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


NOTE = (
    "Each window's latency is of the requests sent in it (P99 of a few dozen requests is close to their maximum: "
    "read n). Engine memory is the process tree's RSS on CPU, NVML memory used on the server's GPUs; "
    "unaccounted = engine memory - weights - KV pool (as the server sized it). A trend is the least-squares "
    "change over the windows after the settling ones, with its 95% interval: drifting only when the whole "
    "interval lies above the margin, flat when it lies within it, undecided otherwise."
)
