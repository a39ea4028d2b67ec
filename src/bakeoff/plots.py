"""Figure conventions shared by every report figure: seaborn, one colour per server.

:func:`server_palette` gives each server label a colour from the sorted list of every
label in the campaign, so a server has the same colour on the sweep, the telemetry, the
Pareto front and any other figure, whichever subset of servers a figure shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd


def server_palette(servers: Iterable[str]) -> dict[str, Any]:
    """Server label -> colour, stable for a given set of labels."""
    import seaborn as sns

    labels = sorted(set(servers))
    colours = sns.color_palette("tab10" if len(labels) <= 10 else "husl", len(labels))
    return dict(zip(labels, colours, strict=True))


def telemetry_figure(series: pd.DataFrame, workload: str, palette: Mapping[str, Any], labels: Mapping[str, str]) -> Any:
    """The telemetry series of one workload: a panel per metric, a column per load level, a line per server."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    data = series[series["workload"] == workload].copy()
    data["metric"] = data["metric"].map(lambda m: labels.get(m, m))
    order = [labels[m] for m in labels if labels[m] in set(data["metric"])]
    levels = sorted(data["level"].dropna().unique())
    grid = sns.relplot(
        data=data,
        x="t_s",
        y="value",
        hue="server",
        palette=dict(palette),
        row="metric",
        row_order=order,
        col="level",
        col_order=levels,
        kind="line",
        height=1.9,
        aspect=2.0,
        facet_kws={"sharey": "row", "sharex": False, "margin_titles": True},
    )
    grid.set_axis_labels("seconds into the measured window", "")
    grid.set_titles(row_template="{row_name}", col_template="level {col_name}")
    grid.figure.suptitle(f"{workload}: server telemetry over the measured window (about 1 sample / s)", y=1.01)
    plt.close(grid.figure)
    return grid.figure
