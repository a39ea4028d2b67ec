"""Tables, plots and diagnosis the notebooks show; the notebooks only call these.

Reads a campaign folder (``cells/*/cell.json``, ``cells/*/runs/*/summary.json``) into a
tidy pandas frame, one row per run, and draws the comparison figures with seaborn.
Nothing here starts servers or touches the network: the HTML report is self-contained.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import yaml

from bakeoff.analysis import verdict
from bakeoff.analysis.diagnosis import TPOT_FLAT
from bakeoff.errors import SpecError
from bakeoff.report.measured_apart import measured_apart_note
from bakeoff.report.plots import server_palette
from bakeoff.results import metric_table
from bakeoff.results.layout import (
    QUALITY_FILE,
    QUALITY_RATES,
    QUALITY_SCORES,
    REHEARSAL_BANNER,
    REHEARSAL_TAG,
    CellResult,
    is_rehearsal,
    load_cells,
    rehearsal_marker,
)
from bakeoff.results.metric_table import highest_supported, shown
from bakeoff.results.store import CELL_INFO, RUN_INFO, read_json, read_json_or_empty
from bakeoff.results.summary import PERCENTILES, STAT_LABELS, RunSummary, Stat, StatName
from bakeoff.serving.backends import load_backend

# From the metric table, like the headline columns: a metric is added there, once.
GLOSSARY = metric_table.glossary()

MEMORY_KNOB_NOTE = (
    "`gpu_memory_utilization` means different things: vLLM takes that share of total GPU memory; "
    "SGLang's `--mem-fraction-static` is a share of total memory for weights + KV cache; "
    "TensorRT-LLM's `free_gpu_memory_fraction` is a share of what is free *after* the weights load."
)

# vllm/config/scheduler.py: max_num_batched_tokens caps every token a step schedules, decode
# included; SGLang's --chunked-prefill-size caps one prefill chunk, and decode runs beside it.
BATCHED_TOKENS_NOTE = (
    "`max_num_batched_tokens` means different things: vLLM's budget counts every token of a step, "
    "the running requests' decode tokens included; SGLang's `--chunked-prefill-size` caps the prefill "
    "chunk alone (decode tokens come on top); TensorRT-LLM's `max_num_tokens` counts a step's tokens like vLLM."
)


REHEARSAL_SUFFIX = f" {REHEARSAL_TAG}"


def heading(title: str, campaign_dir: Path, level: int = 2) -> str:
    """A section heading; in a rehearsal every heading says so."""
    mark = " — REHEARSAL, not a measurement" if is_rehearsal(campaign_dir) else ""
    return f"{'#' * level} {title}{mark}"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def summary_table(summaries: dict[str, RunSummary]) -> str:
    """A plain-text table of the headline figures, one row per run (for the terminal).

    Columns are the metric table's headline figures; one no run has (no SLO, no cost) is left out.
    A percentile the run's sample cannot support shows the highest one it does (``P90 41.20 (n=24;
    P99 needs ≥100)``, :func:`bakeoff.results.metric_table.supported_text`), as in the report;
    :func:`run_warnings` says what each run's numbers can and cannot be read as.
    """
    readers = metric_table.headline_readers()
    columns = list(metric_table.headline_columns())
    values = {name: [read(s) for _, read in readers] for name, s in summaries.items()}
    marks = {name: metric_table.unsupported_figures(s) for name, s in summaries.items()}
    shown = [i for i in range(len(readers)) if any(v[i] is not None for v in values.values())]
    header = ["run", "ok", "failed", *(readers[i][0] for i in shown)]
    rows = [header]
    for name, s in summaries.items():
        implied = implied_req_s(s)
        if implied is not None:  # two rates that disagree are shown side by side, not one as if steady
            marks[name]["req_s"] = f"{s.throughput.req_s:.2f} (tok/s: {implied:.2f})"
        cells = [marks[name].get(columns[i]) or _fmt(values[name][i], 2) for i in shown]
        rows.append([name, _fmt(s.requests.ok), _fmt(s.requests.failed), *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    tail = [f"failures in {n}: {s.requests.failed_by_kind}" for n, s in summaries.items() if s.requests.failed]
    return "\n".join([*lines, *tail])


def run_warnings(name: str, summary: RunSummary, more_requests: str = "requests_per_slot") -> list[str]:
    """What a run's figures can be read as: its window, the percentiles its sample supports, its rates.

    ``more_requests`` names the setting that gives a level more requests where the caller has
    another (``bakeoff bench``: ``--num-requests``). ``name`` prefixes each line (none when empty).
    """
    out: list[str] = []
    name = f"{name}: " if name else ""
    window = summary.window
    if window is not None and window.warning:
        hint = window.warning
        if more_requests != "requests_per_slot":
            # The minimums are a campaign's settings; where the caller has no flag for them, only its own flag.
            hint = hint.replace("raise requests_per_slot or lower the minimums", f"raise {more_requests}")
        out.append(f"{name}{hint.replace('requests_per_slot', more_requests)}")
    for text in (summary.chunking.warning, summary.short_completions.warning):
        if text:
            out.append(f"{name}{text}")
    for metric in metric_table.DISTRIBUTIONS:
        dist = metric.stat(summary)
        missing = [STAT_LABELS[s] for s in metric.headline_stats if s in PERCENTILES and not dist.supported(s)]
        if not missing or dist.unsupported is not None or dist.n == 0:
            continue
        best = highest_supported(dist)
        shown = (
            f"the highest it supports is {STAT_LABELS[best]} = {dist.value(best):,.2f}"
            if best
            else "it supports no percentile"
        )
        out.append(
            f"{name}{metric.name} {', '.join(missing)} unsupported by n={dist.n} samples ({shown}); "
            f"raise {more_requests} for more"
        )
    implied = implied_req_s(summary)
    if implied is not None:
        tput, window = summary.throughput, summary.window
        inside = window.requests_inside if window is not None else summary.requests.ok
        per_request = summary.tokens.completion / summary.requests.ok
        # req/s counts requests that *ended* inside the window; tok/s every token inside it. With few
        # requests in the window the count is coarse, and the two disagree.
        out.append(
            f"{name}req/s {tput.req_s:.2f} counts the requests that ended inside a {tput.window_s:.1f} s "
            f"window ({inside} measured there); output tok/s {tput.output_tok_s:,.1f} at "
            f"{per_request:.0f} tokens a request is {implied:.2f} req/s: too few requests for either to be "
            f"steady; raise {more_requests}"
        )
    return out


def implied_req_s(summary: RunSummary) -> float | None:
    """The req/s a run's output tok/s implies, where it disagrees with its req/s by over 25 % (else None)."""
    tput = summary.throughput
    done = summary.requests.ok
    per_request = summary.tokens.completion / done if done else 0.0
    if not (tput.req_s and per_request and tput.output_tok_s):
        return None
    implied = tput.output_tok_s / per_request
    return implied if abs(implied / tput.req_s - 1) > 0.25 else None


def _row(cell: CellResult, summary: RunSummary) -> dict[str, Any]:
    wl = summary.workload
    pc = summary.prefix_cache
    return {
        "server": cell.label,
        "backend": cell.backend,
        "workload": cell.workload,
        "run": wl.run,
        "repeat": wl.repeat,
        "mode": wl.mode,
        "concurrency": wl.concurrency,
        "rate": wl.rate,
        "ok": summary.requests.ok,
        "failed": summary.requests.failed,
        "failed_by_kind": summary.requests.failed_by_kind,
        **{column: read(summary) for column, read in metric_table.frame_columns()},
        "reuse_realised": pc.reuse_realised if pc else None,
        "cache_emptied_before_run": pc.cache_emptied_before_run if pc else None,
        "server_hit_unit": pc.server_hit_unit if pc else None,
        "interrupted": summary.interrupted,
        "rehearsal": summary.rehearsal,
        "short_completions": summary.short_completions.count,
        "short_warning": summary.short_completions.warning,
        "cache_reset_ok": summary.cache_reset.ok if summary.cache_reset else None,
        "coalesced_share": summary.chunking.share,
        "chunking_warning": summary.chunking.warning,
        "window_warning": summary.window.warning if summary.window else None,
        "unsupported_figures": metric_table.unsupported_figures(summary),
    }


def results_frame(campaign_dir: Path) -> pd.DataFrame:
    """One row per run of every cell, with the headline metrics as columns."""
    rows = [_row(cell, s) for cell in load_cells(campaign_dir) for s in cell.summaries.values()]
    if not rows:
        return pd.DataFrame(columns=["server", "backend", "workload", "run", "mode", "concurrency", "rate", "failed"])
    frame = pd.DataFrame(rows)
    # A rehearsal's stand-ins carry the mark in every table and legend that names them.
    frame.loc[frame["rehearsal"], "server"] = frame.loc[frame["rehearsal"], "server"] + REHEARSAL_SUFFIX
    frame = frame.sort_values(["workload", "server", "concurrency", "rate"], na_position="last")
    return frame.reset_index(drop=True)


# Columns that count things: shown as whole numbers even where a missing value made the column float
# (an open-loop row has no concurrency), so concurrency 1 reads "1", not "1.00".
WHOLE_NUMBER_COLUMNS = ("concurrency", "repeat", "ok", "failed", "failed starts", "flags changed", "config lines")


def styled(table: pd.DataFrame) -> Any:
    """A table for the report: no index column, two decimals, '-' for missing values, counts as whole numbers."""
    style = table.style.hide(axis="index").format(precision=2, na_rep="-", thousands=",")
    whole: list[Hashable] = [
        c for c in WHOLE_NUMBER_COLUMNS if c in table.columns and pd.api.types.is_numeric_dtype(table[c])
    ]
    return style.format("{:,.0f}", subset=whole, na_rep="-") if whole else style


# A warm restart is flagged only when clearly slower: start times vary by a second or so run to
# run (llama.cpp's 1.05 s against 1.03 s is no finding), a cache that did not help shows as more.
SLOWER_RESTART = 1.25
SLOWER_RESTART_S = 5.0


def start_note(cold_s: float | None, warm_s: float | None) -> str:
    """Flags a warm restart clearly slower than the cold start: the caches a restart should reuse did not help."""
    if cold_s is None or warm_s is None or pd.isna(cold_s) or pd.isna(warm_s):
        return "-"
    if warm_s < cold_s * SLOWER_RESTART or warm_s - cold_s < SLOWER_RESTART_S:
        return "-"
    return (
        f"warm restart ({warm_s:.0f} s) slower than the cold start ({cold_s:.0f} s): the caches a restart "
        "reuses did not help, or the machine was busy; read the restart's server.log"
    )


def headline_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The table a reader decides from: throughput, latency tails, goodput, cost, failures."""
    if frame.empty:
        return frame
    cols = {"server": "server", "workload": "workload", "run": "run", "ok": "ok", "failed": "failed"}
    cols.update(metric_table.headline_columns())
    table = frame[list(cols)].round(2).astype(object)
    if "unsupported_figures" in frame:
        # A percentile the sample cannot support is shown as such, never as a number.
        for index, marks in frame["unsupported_figures"].items():
            for column, why in (marks or {}).items():
                if column in table.columns:
                    table.at[index, column] = why
    return table.rename(columns=cols).dropna(axis=1, how="all")


def build_seconds(effort: dict[str, Any]) -> float | None:
    """Seconds of the server's build step: the engine flow's trtllm-build (or GGUF conversion), else
    the PyTorch flow's load + autotune + CUDA graphs read from its log (inside its cold start)."""
    pytorch = effort.get("pytorch_build")
    if effort.get("engine_build_s") is None and isinstance(pytorch, dict):
        return float(pytorch["total_s"])
    value = effort.get("engine_build_s")
    return float(value) if value is not None else None


def build_step(effort: dict[str, Any]) -> str:
    """What the "engine build s" column holds for this server, so a PyTorch flow's start-up build
    is never read as an ahead-of-time engine build, and a cached engine not as a fresh one."""
    pytorch = effort.get("pytorch_build")
    if effort.get("engine_build_s") is None and isinstance(pytorch, dict):
        rounds = f", {pytorch['rounds']} rounds" if pytorch.get("rounds", 1) > 1 else ""
        return (
            f"PyTorch flow, inside cold start (server log{rounds}): load {pytorch['load_s']:.0f} s + "
            f"autotune {pytorch['autotune_s']:.0f} s + CUDA graphs {pytorch['cuda_graph_s']:.0f} s"
        )
    if effort.get("engine_build_s") is None:
        return str(effort.get("engine_build_step") or "-")
    step = effort.get("engine_build_step") or "build"
    if effort.get("engine_build_cached"):
        return f"{step}: cached, the original build's seconds (nothing built this run)"
    return f"{step}, this run"


def effort_table(campaign_dir: Path) -> pd.DataFrame:
    """Engineering effort per server: build and start times, flags changed, failed starts."""
    rows = []
    seen = set()
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    cells = load_cells(campaign_dir)
    # With repeats, the warm restart is repeat 2's start (bakeoff.campaign.execute.run_cell).
    warm = {c.label: w for c in cells if (w := c.effort.get("warm_restart_s")) is not None}
    for cell in cells:
        label = cell.label + suffix
        if label in seen:
            continue
        seen.add(label)
        effort = cell.effort
        needs = effort.get("knob_change_needs", {})
        warm_s = effort.get("warm_restart_s", warm.get(cell.label))
        rows.append(
            {
                "server": label,
                "backend": cell.backend,
                "image build s": effort.get("image_build_s"),
                "engine build s": build_seconds(effort),
                "build step": build_step(effort),
                "cold start s": effort.get("cold_start_s"),
                "warm restart s": warm_s,
                "cache-emptying restarts s": effort.get("cache_restart_s") or None,
                "flags changed": effort.get("flags_changed"),
                "config lines": effort.get("config_lines"),
                "knobs needing rebuild": ", ".join(k for k, v in needs.items() if v == "rebuild") or "-",
                "knobs needing restart": ", ".join(k for k, v in needs.items() if v == "restart") or "-",
                "failed starts": len(effort.get("failed_start_attempts", [])),
                "framework warnings": "; ".join(effort.get("launch_warnings", [])) or "-",
                "status": cell.status,
                "start note": start_note(effort.get("cold_start_s"), warm_s),
            }
        )
    return pd.DataFrame(rows).round(1)


def prefix_cache_table(frame: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "server",
        "workload",
        "designed_reuse",
        "server_hit_rate",
        "cached_tokens_ratio",
        "server_hit_unit",
        "reuse_realised",
        "cache_emptied_before_run",
        "ttft_ms_p50",
    ]
    # Every run whose plan designs reuse: conversations and trace replays with block ids.
    sub = frame[frame["designed_reuse"].notna()] if not frame.empty else frame
    return sub[cols].round(3) if not sub.empty else sub


def _gap(dist: Stat, stat: StatName) -> float | str | None:
    if dist.unsupported is not None:
        return "unsupported"  # chunks coalesced on the way: the gaps are not the server's
    return dist.value(stat) if dist.supported(stat) else None


def speculative_table(campaign_dir: Path) -> pd.DataFrame:
    """Runs with speculative decoding: acceptance from the server's counters, ITL per chunk beside per token.

    A speculative step streams several tokens in one chunk, so the gap between chunks (ITL)
    grows while the time per token falls; only the two together say what the user sees.
    """
    rows = []
    for cell in load_cells(campaign_dir):
        for run, summary in cell.summaries.items():
            spec = summary.speculative
            if spec is None:
                continue
            latency = summary.latency
            rows.append(
                {
                    "server": cell.label,
                    "workload": cell.workload,
                    "run": run,
                    "draft acceptance %": None if spec.acceptance_rate is None else 100 * spec.acceptance_rate,
                    "accepted per step": spec.accepted_per_step,
                    "draft tokens": spec.draft_tokens,
                    "ITL P50 ms (per chunk)": _gap(latency.itl_ms, "p50"),
                    "ITL/token P50 ms": _gap(latency.itl_per_token_ms, "p50"),
                    "ITL P99 ms (per chunk)": _gap(latency.itl_ms, "p99"),
                    "ITL/token P99 ms": _gap(latency.itl_per_token_ms, "p99"),
                    "TPOT P50 ms": _gap(latency.tpot_ms, "p50"),
                }
            )
    return pd.DataFrame(rows)


def failures_table(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    sub = frame[frame["failed"] > 0]
    return sub[["server", "workload", "run", "ok", "failed", "failed_by_kind"]]


def _sweep_axes(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    closed = frame[frame["mode"] == "closed"]
    if not closed.empty:
        return closed, "concurrency"
    return frame[frame["mode"] == "open"], "rate"


# The tail a latency panel draws: P99 where every repeat of a level supports it, else the highest below.
_TAILS: tuple[tuple[str, str, Literal["--", ":"], str], ...] = (("p99", "P99", "--", "^"), ("p90", "P90", ":", "v"))


def _tail_stat(rows: pd.DataFrame, metric: str) -> str | None:
    """The highest tail percentile every run in ``rows`` supports (their unsupported_figures say which not)."""
    marks = [m or {} for m in rows["unsupported_figures"]] if "unsupported_figures" in rows else [{}]
    for stat, _, _, _ in _TAILS:
        if all(f"{metric}_{stat}" not in m for m in marks) and rows[f"{metric}_{stat}"].notna().all():
            return stat
    return None


def sweep_levels(data: pd.DataFrame, axis: str, column: str) -> pd.DataFrame:
    """Per server and measured level: the mean over repeats of ``column`` (the verdict's statistic), min, max."""
    grouped = data.groupby(["server", axis])[column]
    return grouped.agg(["mean", "min", "max", "count"]).reset_index()


def sweep_figure(frame: pd.DataFrame, workload: str, palette: dict[str, Any] | None = None) -> Any:
    """Throughput, TTFT and TPOT (P50 and the supported tail) against concurrency (or rate), per server.

    Every point is the mean over a level's repeats, as in the verdict; the shaded band is the
    range of the repeats (labelled). The x axis ticks at the measured levels only and a line
    joins only levels the server measured; y axes start at 0, so a gap the size of the noise
    does not look dramatic. A latency panel's dashed line is P99 only where every repeat of
    the level supports a P99 (≥100 requests per run); elsewhere the dotted line is P90 where
    that is supported, and nothing is drawn where neither is (:func:`_tail_stat`).
    ``palette``: server -> colour (:func:`bakeoff.report.plots.server_palette`).
    """
    import matplotlib.pyplot as plt  # deferred: only the figures need the plotting libraries
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    colours = palette or server_palette(frame["server"])
    data, axis = _sweep_axes(frame[frame["workload"] == workload])
    measured = sorted(float(v) for v in data[axis].dropna().unique())
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    servers = sorted(data["server"].unique())

    def draw(
        ax: Any, server: str, column: str, style: str, mask: dict[float, bool] | None = None, marker: str = "o"
    ) -> None:
        levels = sweep_levels(data[data["server"] == server], axis, column).set_index(axis)
        # Reindexed on every measured level: a level this server lacks (or does not support) breaks the line.
        levels = levels.reindex(measured)
        if mask is not None:
            levels.loc[[lv for lv in measured if not mask.get(lv, False)], ["mean", "min", "max"]] = float("nan")
        colour = colours.get(server)
        ax.plot(levels.index, levels["mean"], linestyle=style, marker=marker, markersize=4, color=colour)
        spread = levels[levels["count"] > 1]
        if not spread.empty and style == "-":
            ax.fill_between(levels.index, levels["min"], levels["max"], color=colour, alpha=0.15, linewidth=0)

    tails_drawn: set[str] = set()
    for server in servers:
        draw(axes[0], server, "output_tok_s", "-")
        own = data[data["server"] == server]
        for ax, metric in ((axes[1], "ttft_ms"), (axes[2], "tpot_ms")):
            draw(ax, server, f"{metric}_p50", "-")
            chosen = {float(lv): _tail_stat(rows, metric) for lv, rows in own.groupby(axis)}
            for stat, label, style, marker in _TAILS:
                mask = {lv: s == stat for lv, s in chosen.items()}
                if any(mask.values()):
                    tails_drawn.add(label)
                    draw(ax, server, f"{metric}_{stat}", style, mask, marker)
    tails = [(label, style, marker) for _, label, style, marker in _TAILS if label in tails_drawn]
    tail_text = ", ".join(f"{label} {'dashed ▲' if style == '--' else 'dotted ▼'}" for label, style, _ in tails)
    titles = (
        "output tokens/s",
        f"TTFT ms (P50 solid{', ' + tail_text if tail_text else ''})",
        f"TPOT ms (P50 solid{', ' + tail_text if tail_text else ''})",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"{axis} (measured levels)")
        ax.set_ylabel("")
        if axis == "concurrency":
            ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(measured))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles: list[Any] = [Line2D([], [], color=colours.get(s), linewidth=2, label=s) for s in servers]
    handles += [
        Line2D([], [], color="grey", linestyle=style, marker=marker, label=label) for label, style, marker in tails
    ]
    handles.append(Patch(color="grey", alpha=0.25, label="band: range of the repeats"))
    axes[0].legend(handles=handles, fontsize=7)
    rehearsal = bool(data["rehearsal"].any()) if "rehearsal" in data else False
    note = " — points: mean over repeats; a tail only where every repeat supports it"
    fig.suptitle(
        f"workload: {workload}{note}"
        + (" — REHEARSAL: reference-server stand-ins, not a measurement" if rehearsal else "")
    )
    fig.tight_layout()
    plt.close(fig)  # shown once, by the notebook's display(), not again by the inline backend
    return fig


def turn_figure(campaign_dir: Path) -> Any:
    """Median TTFT by conversation turn: prefix caching should flatten later turns."""
    import matplotlib.pyplot as plt  # deferred: only the figures need the plotting libraries

    fig, ax = plt.subplots(figsize=(6, 4))
    for cell in load_cells(campaign_dir):
        for summary in cell.summaries.values():
            by_turn = summary.ttft_ms_by_turn
            if by_turn:
                turns = sorted(t for t, ms in by_turn.items() if ms is not None)
                ax.plot(
                    [t + 1 for t in turns],
                    [float(by_turn[t] or 0.0) for t in turns],
                    marker="o",
                    label=f"{cell.label} / {cell.workload}",
                )
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT P50 ms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    plt.close(fig)
    return fig


def group_table(campaign_dir: Path) -> pd.DataFrame:
    """Latency per request class (e.g. short vs long prompts in a long-prompt mix)."""
    rows = []
    for cell in load_cells(campaign_dir):
        for run, summary in cell.summaries.items():
            for group, block in summary.by_group.items():
                rows.append(
                    {
                        "server": cell.label,
                        "workload": cell.workload,
                        "run": run,
                        "class": group,
                        "n": block.ttft_ms.n,
                        # The support rule of every table: a tail n cannot support is shown as what it can.
                        "TTFT P50 ms": shown(block.ttft_ms, "p50"),
                        "TTFT P99 ms": shown(block.ttft_ms, "p99"),
                        "TPOT P50 ms": shown(block.tpot_ms, "p50"),
                        "TPOT P99 ms": shown(block.tpot_ms, "p99"),
                        "ITL P99 ms": shown(block.itl_ms, "p99"),
                        "ITL P99.9 ms": shown(block.itl_ms, "p99_9"),
                    }
                )
    return pd.DataFrame(rows).round(2)


def diagnose(frame: pd.DataFrame) -> list[str]:
    """Plain-language findings, following the measure-first bottleneck checklist.

    How batching scaled throughput (from two or more measured levels only, each the mean over
    its repeats: one level says nothing about scaling, and the finding says so), whether
    requests queued for admission, and what the protocol showed (reuse not realised, failed
    requests, coalesced chunks, short windows). Which resource bounds a server (memory,
    batching, compute, bandwidth) is the diagnosis's, in the "Why" section, with its evidence
    (:mod:`bakeoff.analysis.diagnosis`); how close decode came to the memory-bandwidth floor is
    the roofline's (:func:`bakeoff.report.explain.roofline_notes`): each said once, in one place.
    """
    notes: list[str] = []
    if "rehearsal" in frame and frame["rehearsal"].any():
        notes.append(
            "Rehearsal: no performance finding is drawn — the servers were reference-server stand-ins. "
            "Below: only what the rehearsal checks (failed requests, prefix reuse seen through the protocol)."
        )
    for (workload, server), group in frame.groupby(["workload", "server"], sort=True):
        if "rehearsal" in group and group["rehearsal"].any():
            _protocol_notes(notes, workload, server, group)
            continue
        closed = group[group["mode"] == "closed"]
        if not closed.empty:
            notes.extend(_scaling_notes(f"{server} / {workload}", closed))
        _protocol_notes(notes, workload, server, group)
    return notes


def _scaling_notes(who: str, closed: pd.DataFrame) -> list[str]:
    """How throughput and latency moved from the lowest measured level to the highest (means over repeats)."""
    columns = ["output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "ttft_ms_p99"]
    # A figure no run could support (TPOT where a fast server's chunks all came in one read) is
    # None in every row, an object column that a numeric mean would drop: make it NaN instead.
    numeric = closed[columns].apply(pd.to_numeric, errors="coerce").assign(concurrency=closed["concurrency"])
    by_level = numeric.groupby("concurrency")[columns].mean().sort_index()
    if len(by_level) < 2:
        level = ", ".join(f"{c:g}" for c in by_level.index)
        return [
            f"{who}: no scaling finding — one concurrency level measured ({level}); how throughput scales "
            "with load needs two or more levels."
        ]
    lo_c, hi_c = float(by_level.index[0]), float(by_level.index[-1])
    lo, hi = by_level.iloc[0], by_level.iloc[-1]
    scale = hi_c / lo_c
    where = f"from concurrency {lo_c:g} to {hi_c:g} ({scale:g}x; means over repeats)"
    if not lo["output_tok_s"] or pd.isna(lo["output_tok_s"]) or pd.isna(hi["output_tok_s"]):
        return []
    gain = hi["output_tok_s"] / lo["output_tok_s"]
    tpot = hi["tpot_ms_p50"] / lo["tpot_ms_p50"] if lo["tpot_ms_p50"] else None
    tpot_text = f"; TPOT P50 rose {tpot:.1f}x" if tpot is not None and not pd.isna(tpot) else ""
    notes = []
    if gain >= 0.5 * scale:
        notes.append(f"{who}: throughput grew {gain:.1f}x {where}{tpot_text} — batching still pays.")
    else:
        # A conclusion only as far as the numbers go: "bought latency" needs TPOT to have risen.
        bought = tpot is not None and not pd.isna(tpot) and tpot >= TPOT_FLAT
        what = "more concurrency bought latency, not throughput" if bought else "throughput stopped scaling"
        notes.append(
            f"{who}: throughput grew only {gain:.1f}x {where}{tpot_text} — {what} (what limits it: the "
            "diagnosis under Why)."
        )
    p50, p99 = hi["ttft_ms_p50"], hi["ttft_ms_p99"]
    top = closed[closed["concurrency"] == hi_c]
    marks: Any = top.get("unsupported_figures", [])
    tail_ok = not any("ttft_ms_p99" in (m or {}) for m in marks)  # a P99 the sample supports, or none
    if tail_ok and p50 and not pd.isna(p99) and p99 / p50 > 3:
        notes.append(
            f"{who}: at concurrency {hi_c:g} P99 TTFT is {p99 / p50:.1f}x P50 — requests queue for admission; "
            "look at max_num_seqs and the prefill token budget."
        )
    return notes


def _protocol_notes(notes: list[str], workload: object, server: object, group: pd.DataFrame) -> None:
    """Findings that hold for a rehearsal too: reuse realised or not, failed requests."""
    sessions = group[group["mode"].isin(["sessions", "tasks"])]
    for _, row in sessions.iterrows():
        realised = row["reuse_realised"]
        if realised is not None and not pd.isna(realised) and not bool(realised):
            notes.append(
                f"{server} / {workload}: prefix reuse was designed ({row['designed_reuse']:.0%}) "
                "but not realised by the server — prefix caching is off or evicted."
            )
    failed = int(group["failed"].sum())
    if failed:
        notes.append(f"{server} / {workload}: {failed} failed requests — see the failures table.")
    for column in ("chunking_warning", "window_warning"):
        if column in group:
            for _, row in group[group[column].notna()].drop_duplicates(column).iterrows():
                notes.append(f"{server} / {workload} / {row['run']}: {row[column]}")
    if "short_warning" in group:
        for _, row in group[group["short_warning"].notna()].iterrows():
            notes.append(f"{server} / {workload} / {row['run']}: {row['short_warning']}")
    if "cache_reset_ok" in group and (group["cache_reset_ok"] == False).any():  # noqa: E712 (None = no reset)
        notes.append(
            f"{server} / {workload}: the prefix-cache reset failed before some runs — their caches "
            "were not cold; see cache_emptied_before_run in the prefix-cache table."
        )


def _machine_text(machine: dict[str, Any]) -> str:
    """``AMD EPYC 9654, 2 cores, 7.8 GiB memory`` (and the GPUs where there are any), from run.json."""
    parts = [str(machine.get("cpu_model") or machine.get("platform") or "unknown CPU")]
    if machine.get("cpus"):
        parts.append(f"{machine['cpus']} cores")
    if machine.get("memory_gib"):
        parts.append(f"{float(machine['memory_gib']):.1f} GiB memory")
    if machine.get("gpu_count"):
        driver = f", driver {machine['gpu_driver']}" if machine.get("gpu_driver") else ""
        parts.append(f"{machine['gpu_count']}x {machine['gpu']}{driver}")
    return ", ".join(parts)


def _runs_as(server: dict[str, Any], versions: dict[str, Any]) -> str:
    """The image and digest a container ran, or the interpreter (or binary) a process ran."""
    if server.get("image"):
        digest = server.get("image_digest")
        return f"image {server['image']}" + (f" ({digest})" if digest else "")
    engine = versions.get("engine") if isinstance(versions.get("engine"), dict) else None
    if engine and engine.get("interpreter"):
        python = f" (Python {engine['python']})" if engine.get("python") else ""
        return f"{server.get('kind', 'process')}: {engine['interpreter']}{python}"
    words = str(server.get("command_line") or "").split()
    return f"{server.get('kind', 'process')}: {words[0]}" if words else str(server.get("kind") or "-")


def setup_table(campaign_dir: Path) -> pd.DataFrame:
    """What was compared, on what: each server's framework, version, image or interpreter, and the machine.

    Read from each server's first run (``run.json`` and the summary's provenance), so the
    report says it without opening either; the version is the one spelling provenance records.
    """
    rows = []
    seen: set[str] = set()
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    for cell in load_cells(campaign_dir):
        if cell.label in seen or not cell.summaries:
            continue
        seen.add(cell.label)
        run_name, summary = next(iter(cell.summaries.items()))
        run = read_json_or_empty(cell.dir / "runs" / run_name / RUN_INFO)
        server, versions = dict(run.get("server") or {}), dict(run.get("versions") or {})
        provenance = summary.provenance
        try:
            framework = load_backend(cell.backend).display_name
        except SpecError:
            framework = cell.backend
        rows.append(
            {
                "server": cell.label + suffix,
                "framework": framework,
                "version": (provenance.framework_version if provenance else None) or "-",
                "runs as": _runs_as(server, versions),
                "machine": _machine_text(dict(run.get("machine") or {})),
            }
        )
    return pd.DataFrame(rows)


def gpu_host_markdown(campaign_dir: Path) -> str | None:
    """A rehearsal's "on the GPU host" steps (its marker holds them), or None for a measured campaign."""
    marker = rehearsal_marker(campaign_dir)
    steps = marker.get("gpu_host") if marker else None
    return str(steps["markdown"]) if isinstance(steps, dict) and "markdown" in steps else None


def effort_notes(campaign_dir: Path) -> list[str]:
    """The notes under the effort table that apply to this campaign (GPU-memory knobs: GPU campaigns only)."""
    spec = yaml.safe_load((campaign_dir / "campaign.yaml").read_text()) or {}
    return [MEMORY_KNOB_NOTE, BATCHED_TOKENS_NOTE] if isinstance(spec, dict) and spec.get("gpu") else []


def campaign_title(campaign_dir: Path) -> str:
    spec = yaml.safe_load((campaign_dir / "campaign.yaml").read_text())
    title = f"# bakeoff report: {spec.get('name')}\n\n{spec.get('description', '')}"
    apart = measured_apart_note(campaign_dir)
    if apart is not None:
        title = f"{title}\n\n{apart}"
    rehearsal = rehearsal_marker(campaign_dir)
    if rehearsal is None:
        return title
    title = f"# REHEARSAL of {spec.get('name')} — not a measurement\n\n{spec.get('description', '')}"
    title += f"\n\n{apart}" if apart is not None else ""
    return (
        f"{title}\n\n> {REHEARSAL_BANNER}\n>\n> Campaign: `{rehearsal['source_campaign']}` (scaled down); "
        f"model on a real run: `{rehearsal['original_model']}`."
    )


def quality_table(campaign_dir: Path) -> pd.DataFrame:
    """One row per cell that ran the quality set: its rates in percent (:mod:`bakeoff.campaign.quality`)
    and its perplexity, with why not where a server was not scored."""

    rows = []
    # A rehearsal's rates are planted by its stand-ins (bakeoff.serving.stand_in_quality): marked like every table.
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    for path in sorted((campaign_dir / "cells").glob(f"*/{QUALITY_FILE}")):
        result = read_json(path)
        rates = result["rates"]
        server, _, workload = path.parent.name.partition("__")
        row: dict[str, Any] = {"server": server + suffix, "workload": workload, "answered": rates["answered"]}
        row["failed"] = rates["failed"]
        row.update({f"{name} %": None if rates[name] is None else 100 * rates[name] for name in QUALITY_RATES})
        # Older quality.json files have no perplexity: not measured, like a server without prompt logprobs.
        row.update({name: rates.get(name) for name in QUALITY_SCORES})
        row["perplexity not measured"] = (result.get("perplexity") or {}).get("why_not")
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty and table["perplexity not measured"].isna().all():
        table = table.drop(columns="perplexity not measured")
    return table


def remeasured_table(campaign_dir: Path) -> pd.DataFrame:
    """Cells a resumed campaign measured again: why, and what each earlier attempt had finished."""
    rows = [
        {
            "cell": path.parent.name,
            "earlier attempt": attempt["attempt"],
            "ended": attempt["status"],
            "finished requests kept": attempt["finished_requests"],
            "measured again because": attempt.get("why_measured_again"),
        }
        for path in sorted((campaign_dir / "cells").glob(f"*/{CELL_INFO}"))
        for attempt in read_json(path).get("earlier_attempts") or []
    ]
    return pd.DataFrame(rows)


def verdict_section(campaign_dir: Path) -> str:
    """The verdict the report opens with (:mod:`bakeoff.analysis.verdict`), as markdown."""
    if is_rehearsal(campaign_dir):
        # Its runs are left out of every verdict; "no sweep" would read as a missing workload.
        return "Rehearsal: no verdict is drawn. Every server was a reference-server stand-in, not a framework."
    notes = [n for n in (verdict.auto_repeats_note(campaign_dir),) if n is not None]
    notes += verdict.saturation_notes(campaign_dir)
    slo = verdict.campaign_slo(campaign_dir)
    return verdict.markdown(verdict.verdicts(campaign_dir), slo, notes, verdict.slo_basis(campaign_dir, slo))


def noise_table(campaign_dir: Path) -> pd.DataFrame:
    """Run-to-run noise: the coefficient of variation across repeats, per server, load and figure."""
    return pd.DataFrame(verdict.noise_table(campaign_dir))


def confidence_table(campaign_dir: Path) -> pd.DataFrame:
    """Every headline figure per server and load with n and its Student-t interval across repeats."""
    return pd.DataFrame(verdict.figures_table(campaign_dir))


def energy_table(campaign_dir: Path) -> pd.DataFrame:
    """Energy per run over its measured window, or 'not measured' with the reason."""
    rows: list[dict[str, Any]] = []
    for cell in load_cells(campaign_dir):
        for summary in cell.summaries.values():
            energy = summary.energy
            row: dict[str, Any] = {"server": cell.label, "workload": cell.workload, "run": summary.workload.run}
            if energy is None or energy.joules is None:
                why = energy.reason if energy is not None and energy.reason else "not recorded (run before energy)"
                rows.append({**row, "energy": f"not measured: {why}"})
                continue
            rows.append(
                {
                    **row,
                    "energy": f"{energy.source}: {', '.join(d.device for d in energy.devices)}",
                    "window s": f"{energy.start_s:.1f}–{energy.end_s:.1f} ({energy.window_s:.1f} s)",
                    "J": energy.joules,
                    "J/out tok": energy.j_per_output_token,
                    "out tok/J": energy.output_tokens_per_j,
                    "avg W": energy.average_w,
                }
            )
    return pd.DataFrame(rows)


def energy_unmeasured(campaign_dir: Path) -> str | None:
    """One line where no run of the campaign measured energy (why, once); None where any run did."""
    reasons = set()
    for row in energy_table(campaign_dir).to_dict("records"):
        text = str(row["energy"])
        if not text.startswith("not measured: "):
            return None
        reasons.add(text.removeprefix("not measured: "))
    return f"Energy not measured in any run: {'; '.join(sorted(reasons))}." if reasons else None


def folded(title: str, table: pd.DataFrame) -> str:
    """A per-run table folded under a details element: evidence one click away, not on the first screens."""
    import html

    body = styled(table).to_html()
    return f"<details><summary><b>{html.escape(title)}</b> ({len(table)} rows)</summary>{body}</details>"
