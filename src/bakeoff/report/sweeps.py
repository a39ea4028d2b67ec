"""Tables and figures by load: prefix caching, speculative decoding, sweep and turn figures, groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pandas as pd

from bakeoff.measure.load_modes import swept_modes
from bakeoff.report.plots import server_palette
from bakeoff.results.formulas import shown
from bakeoff.results.layout import (
    load_cells,
)
from bakeoff.results.summary import Stat, StatName


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


def _sweep_axes(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    # The first swept mode the campaign ran (closed loop before open loop), along its level.
    swept = swept_modes()
    for mode, level in swept:
        runs = frame[frame["mode"] == mode]
        if not runs.empty:
            return runs, level
    mode, level = swept[-1]
    return frame[frame["mode"] == mode], level


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
