"""Figure conventions shared by every report figure: seaborn, one colour per server.

:func:`server_palette` gives each server label a colour from the sorted list of every
label in the campaign, so a server has the same colour on the sweep, the telemetry, the
Pareto front and any other figure, whichever subset of servers a figure shows.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import pandas as pd

from bakeoff.observe.telemetry_series import RATE_WINDOW_S

LineStyle = Literal["-", "--", ":", "-."]
# Line style per repeat in the telemetry figure (colour is the server's).
_REPEAT_STYLES: tuple[LineStyle, ...] = ("-", "--", ":", "-.")


def server_palette(servers: Iterable[str]) -> dict[str, Any]:
    """Server label -> colour, stable for a given set of labels."""
    import seaborn as sns  # deferred (here and below): plotting libraries load in seconds; tables need none

    labels = sorted(set(servers))
    colours = sns.color_palette("tab10" if len(labels) <= 10 else "husl", len(labels))
    return dict(zip(labels, colours, strict=True))


def telemetry_figure(series: pd.DataFrame, workload: str, palette: Mapping[str, Any], labels: Mapping[str, str]) -> Any:
    """The telemetry series of one workload: a row per metric, a column per load level, a line per repeat.

    Each repeat of a level is its own thin line in its server's colour and its repeat's line
    style (named in the legend), each starting at its own t = 0: never the repeats joined into
    one line that jumps back to the start. The spread between repeats shows as it is instead
    of as a band. Counter rates are over a trailing window
    (:func:`bakeoff.observe.telemetry_series.trailing_rate`), said in the title.

    Plain matplotlib rather than a seaborn facet grid:
    a sweep of five levels and seven metrics is 35 panels, and seaborn took about 10 s to build
    such a figure here, most of it laying out each panel (``benchmarks/report_render.py`` times
    the whole report).
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    data = series[series["workload"] == workload]
    # A metric that stayed 0 throughout (no queue, no preemptions) is named in the title, not drawn.
    nonzero = data.groupby("metric")["value"].apply(lambda v: bool((v != 0).any()))
    metrics = [m for m in labels if nonzero.get(m, False)]
    flat = [labels[m] for m in labels if m in nonzero.index and not nonzero[m]]
    data = data[data["metric"].isin(metrics)]
    # A trace replay has neither concurrency nor rate: its runs share one column.
    level = data["level"].astype(object).where(data["level"].notna(), "all")
    levels = sorted(level.unique(), key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0))
    rows, cols = max(len(metrics), 1), max(len(levels), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(1.5 + 3.4 * cols, 0.9 + 1.7 * rows), sharey="row", squeeze=False)
    repeat = data["repeat"] if "repeat" in data else pd.Series(1, index=data.index)
    repeats = sorted({int(r) for r in repeat.fillna(1)})
    styles = {r: _REPEAT_STYLES[i % len(_REPEAT_STYLES)] for i, r in enumerate(repeats)}
    for (metric, lvl, server, _run, rep), part in data.assign(level=level, repeat=repeat.fillna(1)).groupby(
        ["metric", "level", "server", "run", "repeat"], sort=False
    ):
        ax = axes[metrics.index(str(metric))][levels.index(lvl)]
        colour = palette.get(str(server))
        part = part.sort_values("t_s")
        # Markers: a run with one sample in this window still shows, as a dot.
        ax.plot(
            part["t_s"],
            part["value"],
            color=colour,
            linestyle=styles[int(str(rep))],
            linewidth=1.1,
            alpha=0.85,
            marker="o",
            markersize=2,
        )
    for i, metric in enumerate(metrics):
        axes[i][0].set_ylabel(labels[metric].replace(" (", "\n("), fontsize=8)
    for j, lvl in enumerate(levels):
        axes[0][j].set_title(f"level {lvl:g}" if isinstance(lvl, float | int) else "all requests", fontsize=9)
        axes[-1][j].set_xlabel("seconds into the measured window", fontsize=8)
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    servers = sorted(set(data["server"]))
    handles = [Line2D([], [], color=palette.get(s), linewidth=2) for s in servers]
    names = list(servers)
    if len(repeats) > 1:
        handles += [Line2D([], [], color="grey", linestyle=styles[r], linewidth=1.1) for r in repeats]
        names += [f"repeat {r}" for r in repeats]
    fig.legend(handles, names, loc="upper right", fontsize=8, frameon=False)
    title = (
        f"{workload}: server telemetry over the measured window (about 1 sample / s; one line per repeat; "
        f"counter rates over a trailing {RATE_WINDOW_S:g} s, as one scrape interval reads scrape timing)"
    )
    # Wrapped to the figure (the legend takes the right side of the header); the header grows with it.
    width_in = 1.5 + 3.4 * cols
    lines = textwrap.wrap(title, width=max(int(width_in * 9), 40))
    if flat:
        lines += textwrap.wrap(f"0 throughout: {', '.join(flat)}", width=max(int(width_in * 9), 40))
    header_in = 0.3 + 0.2 * len(lines)
    fig.set_size_inches(width_in, header_in + 1.7 * rows)
    fig.suptitle("\n".join(lines), x=0.02, ha="left", fontsize=9)
    top = 1 - (header_in + 0.2) / (header_in + 1.7 * rows)
    fig.subplots_adjust(left=0.1 if cols == 1 else 0.06, right=0.98, top=top, hspace=0.35)
    plt.close(fig)
    return fig
