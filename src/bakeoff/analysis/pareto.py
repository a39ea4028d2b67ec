"""The Pareto front per workload: throughput per GPU against interactivity.

Serving trades the two: batching more requests raises the total tokens a GPU produces
per second and lowers the tokens each user sees per second. Every load level of every
server is one point — x: interactivity, tok/s per user (P50, = 1000 / TPOT P50); y:
output tok/s per GPU (per machine on CPU: the whole machine is the unit). A point is the
mean over its repeats on each axis (the statistic the verdict uses). A point is on the front
when no other point of the workload is at least as good on both axes and better on one by
more than the campaign's practical margin (``min_effect``, :mod:`bakeoff.analysis.significance`):
points equivalent within the noise are equals, so two identical servers are both on the front.
The front is what a team chooses along, whatever framework it comes from.

GPUs per server: ``tensor_parallel_size`` (default 1) times ``data_parallel_size`` when
a backend exposes it; a CPU server is one machine.

Where runs measured energy, the same front can be drawn with energy efficiency as y
(``axis="energy"``: output tokens per joule over the measured window, from the energy
counters; :mod:`bakeoff.observe.energy`), the cost axis that needs no price list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import pandas as pd

from bakeoff.analysis.significance import MIN_EFFECT

X = "tok_s_per_user"
Y = "tok_s_per_unit"
Axis = Literal["throughput", "energy"]
# y of each axis: the frame column it comes from, and whether it is shared over the server's GPUs.
_Y_SOURCE: dict[str, tuple[str, bool]] = {"throughput": ("output_tok_s", True), "energy": ("output_tok_per_j", False)}


def units(knobs: Mapping[str, Any], gpu: bool) -> int:
    """GPUs a server occupies (1 machine on CPU)."""
    if not gpu:
        return 1
    return int(knobs.get("tensor_parallel_size") or 1) * int(knobs.get("data_parallel_size") or 1)


def points(frame: pd.DataFrame, server_units: Mapping[str, int], axis: Axis = "throughput") -> pd.DataFrame:
    """One point per run with both axes known: workload, server, run, level, x, y.

    ``axis``: y is output tok/s per GPU (``throughput``) or output tokens per joule (``energy``).
    """
    column, per_unit = _Y_SOURCE[axis]
    needed = {"workload", "server", "run", column, "tok_s_per_user_p50"}
    if frame.empty or not needed <= set(frame.columns):
        return pd.DataFrame(columns=["workload", "server", "run", "level", X, Y])
    data = frame[frame[column].notna() & frame["tok_s_per_user_p50"].notna()]
    level = data["concurrency"].where(data["concurrency"].notna(), data["rate"])
    per = data["server"].map(lambda s: server_units.get(s, 1) if per_unit else 1).astype(float)
    out = pd.DataFrame(
        {
            "workload": data["workload"],
            "server": data["server"],
            "run": data["run"],
            "level": level,
            X: data["tok_s_per_user_p50"].astype(float),
            Y: data[column].astype(float) / per,
        }
    )
    # Repeats of a level are one point: their mean on each axis, as in the verdict.
    return out.groupby(["workload", "server", "level"], as_index=False).agg(
        run=("run", "first"), **{X: (X, "mean"), Y: (Y, "mean")}
    )[["workload", "server", "run", "level", X, Y]]


def front(pts: pd.DataFrame, margin: float = MIN_EFFECT) -> pd.DataFrame:
    """The non-dominated points (higher is better on both axes), ordered by interactivity.

    A point dominates another only when it is at least as good on both axes and better on one
    by more than ``margin`` (a share): a gap inside the margin is noise, not a trade-off.
    """
    if pts.empty:
        return pts
    xs, ys = pts[X].to_numpy(), pts[Y].to_numpy()
    keep = []
    for i in range(len(pts)):
        beyond = (xs > xs[i] * (1 + margin)) | (ys > ys[i] * (1 + margin))
        dominated = ((xs >= xs[i]) & (ys >= ys[i]) & beyond).any()
        keep.append(not dominated)
    return pts[keep].sort_values(X).reset_index(drop=True)


def figure(
    pts: pd.DataFrame,
    workload: str,
    palette: Mapping[str, Any],
    unit: str,
    axis: Axis = "throughput",
    margin: float = MIN_EFFECT,
) -> Any:
    """Every server's points on the same axes, levels joined per server, the front (at ``margin``) drawn over them."""
    import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only the report (the report extra) draws
    import seaborn as sns

    data = pts[pts["workload"] == workload].sort_values(["server", X])
    fig, ax = plt.subplots(figsize=(7.5, 5))
    sns.lineplot(
        data=data, x=X, y=Y, hue="server", palette=dict(palette), marker="o", sort=False, estimator=None, ax=ax
    )
    for _, row in data.iterrows():
        ax.annotate(f"{row['level']:g}", (row[X], row[Y]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    best = front(data, margin)
    if not best.empty:
        ax.step(best[X], best[Y], where="pre", color="black", linewidth=1.2, linestyle="--", label="Pareto front")
        ax.scatter(best[X], best[Y], s=90, facecolors="none", edgecolors="black", zorder=3)
    ax.set_xlabel("interactivity: output tok/s per user (P50)")
    if axis == "energy":
        ax.set_ylabel("energy efficiency: output tokens per joule")
        ax.set_title(f"{workload}: energy efficiency vs interactivity (labels: concurrency or rate)")
    else:
        ax.set_ylabel(f"throughput: output tok/s per {unit}")
        ax.set_title(f"{workload}: throughput vs interactivity (labels: concurrency or rate)")
    # From 0: a gap the size of the noise between two points must not look like a trade-off.
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig
