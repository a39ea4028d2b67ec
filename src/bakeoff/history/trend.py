"""The trend report: every gated metric over time, per server and framework version.

``bakeoff trend`` executes ``notebooks/trend.ipynb`` (a parameters cell and calls into
this module) over the history index and exports it to ``trend.html``. Each point is one
archived run; it is judged against its server's marked baseline with the same rule and
thresholds as ``bakeoff compare`` (:func:`bakeoff.history.compare.judge`), so a point the gate
would fail is marked as a regression here too. The baseline's value is drawn as a dashed
line, the repeat interval (when the run had repeats) as an error bar, and each framework
version has its own marker, so a release that moved a metric shows where it did.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bakeoff.analysis.thresholds import GATE_METRICS, Reading
from bakeoff.errors import SpecError
from bakeoff.history import archive as arch
from bakeoff.history.compare import judge, thresholds_of
from bakeoff.history.index import connect
from bakeoff.notebook import kernelrun
from bakeoff.notebook.htmlexport import export_html
from bakeoff.notebook.kernelrun import kernel_environment
from bakeoff.paths import notebook, notebook_kernel, reports_dir

if TYPE_CHECKING:
    import pandas as pd

_QUERY = """
WITH w AS (
    SELECT archive, server, workload, any_value(campaign) AS campaign,
           coalesce(max(framework_version), '?') AS framework_version, min(started_at) AS started_at
    FROM runs GROUP BY archive, server, workload),
points AS (
    SELECT archive, server, workload, run, metric, value, lo, hi, better FROM estimates
    UNION ALL
    SELECT archive, server, workload, 'quality', metric, value, NULL, NULL, NULL FROM quality)
SELECT w.campaign, p.archive, p.server, p.workload, p.run, w.framework_version, w.started_at,
       p.metric, p.value, p.lo, p.hi, coalesce(b.archive = p.archive, FALSE) AS is_baseline
FROM points p JOIN w USING (archive, server, workload)
LEFT JOIN baselines b ON b.campaign = w.campaign AND b.server = p.server
WHERE (? IS NULL OR w.campaign = ?)
ORDER BY w.started_at
"""


def trend_frame(history_dir: Path | str, campaign: str | None = None, metrics: list[str] | None = None) -> pd.DataFrame:
    """One row per run and metric, with ``verdict`` against the server's baseline (None without one)."""
    root = Path(history_dir)
    with connect(root) as con:
        frame: pd.DataFrame = con.execute(_QUERY, [campaign, campaign]).df()
    if frame.empty:
        where = f"campaign {campaign}" if campaign else "any campaign"
        raise SpecError(f"no archived runs of {where} in {root}: run the campaign (it archives) or check --campaign")
    gates = {c: _campaign_gates(root, c) for c in frame["campaign"].unique()}
    # Every gated metric the runs have (quality rates only where quality was checked).
    chosen = set(metrics) if metrics else {m for g in gates.values() for m in g}
    unknown = sorted(chosen - set(GATE_METRICS))
    if unknown:
        raise SpecError(f"--metric {', '.join(unknown)}: not a gate metric; e.g. {', '.join(list(GATE_METRICS)[:6])}")
    frame = frame[frame["metric"].isin(chosen)].copy()
    frame["threshold"] = [gates[c].get(m, 0.05) for c, m in zip(frame["campaign"], frame["metric"], strict=True)]
    frame["verdict"] = _verdicts(frame)
    return frame


def _campaign_gates(root: Path, campaign: str) -> dict[str, float]:
    """The thresholds of the campaign's newest archive: the gate as it stands now."""
    folders = arch.archives(root, campaign)
    return thresholds_of(folders[-1]) if folders else {}


def _reading(row: dict[str, Any]) -> Reading:
    def bound(value: Any) -> float | None:
        return None if value is None or value != value else float(value)  # NaN in the frame: no interval

    return Reading(float(row["value"]), bound(row["lo"]), bound(row["hi"]))


def _verdicts(frame: pd.DataFrame) -> list[str | None]:
    keys = ("campaign", "server", "workload", "run", "metric")
    rows = [{str(k): v for k, v in r.items()} for r in frame.to_dict("records")]
    base = {tuple(r[k] for k in keys): r for r in rows if r["is_baseline"]}
    out: list[str | None] = []
    for row in rows:
        reference = base.get(tuple(row[k] for k in keys))
        if reference is None:
            out.append(None)
        elif row["archive"] == reference["archive"]:
            out.append("baseline")
        else:
            gate = GATE_METRICS[str(row["metric"])]
            out.append(judge(gate, float(row["threshold"]), _reading(reference), _reading(row))[0])
    return out


def regression_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The points the gate fails: when, which server, version and metric, and by how much."""
    bad = frame[frame["verdict"] == "regressed"]
    columns = ["started_at", "campaign", "server", "workload", "run", "framework_version", "metric", "value", "archive"]
    return bad[columns].reset_index(drop=True)


def versions_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per campaign, server and framework version: the runs measured and when first and last."""
    runs = frame.drop_duplicates(["archive", "server", "workload", "run"])
    grouped = runs.groupby(["campaign", "server", "framework_version"])
    table = grouped.agg(runs=("run", "size"), first=("started_at", "min"), last=("started_at", "max"))
    return table.reset_index()


def figure(frame: pd.DataFrame, campaign: str, metric: str) -> Any:
    """One metric of one campaign over time: a panel per workload run, a line per server."""
    import matplotlib.pyplot as plt  # deferred: matplotlib is heavy and only the trend report draws
    from matplotlib.lines import Line2D

    data = frame[(frame["campaign"] == campaign) & (frame["metric"] == metric)]
    panels = sorted({(w, r) for w, r in zip(data["workload"], data["run"], strict=True)})
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.5 * max(len(panels), 1), 3.6), squeeze=False)
    servers = sorted(data["server"].unique())
    versions = sorted(data["framework_version"].unique())
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(servers)}
    markers = {v: "osD^vP*"[i % 7] for i, v in enumerate(versions)}
    for ax, (workload, run) in zip(axes[0], panels, strict=False):
        _panel(ax, data[(data["workload"] == workload) & (data["run"] == run)], colours, markers)
        ax.set_title(f"{workload} / {run}")
        ax.set_ylabel(metric)
        ax.tick_params(axis="x", labelrotation=30)
    handles = [Line2D([], [], color=c, label=s) for s, c in colours.items()]
    handles += [Line2D([], [], color="grey", marker=m, linestyle="", label=f"version {v}") for v, m in markers.items()]
    handles += [
        Line2D([], [], color="grey", linestyle="--", label="baseline"),
        Line2D([], [], color="red", marker="X", linestyle="", markersize=10, label="regression"),
    ]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False)
    better = GATE_METRICS[metric].better
    fig.suptitle(f"{campaign}: {metric} ({better} is better)")
    fig.tight_layout()
    plt.close(fig)
    return fig


def _panel(ax: Any, data: pd.DataFrame, colours: dict[str, Any], markers: dict[str, str]) -> None:
    for server, points in data.groupby("server"):
        colour = colours[str(server)]
        ax.plot(points["started_at"], points["value"], color=colour, linewidth=1)
        for version, group in points.groupby("framework_version"):
            ax.scatter(group["started_at"], group["value"], color=colour, marker=markers[str(version)], zorder=3)
        spread = points.dropna(subset=["lo", "hi"])
        if not spread.empty:
            ax.errorbar(
                spread["started_at"],
                spread["value"],
                yerr=[spread["value"] - spread["lo"], spread["hi"] - spread["value"]],
                fmt="none",
                ecolor=colour,
                capsize=3,
            )
        baseline = points[points["verdict"] == "baseline"]
        if not baseline.empty:
            ax.axhline(float(baseline["value"].iloc[0]), color=colour, linestyle="--", linewidth=1)
        bad = points[points["verdict"] == "regressed"]
        ax.scatter(bad["started_at"], bad["value"], color="red", marker="X", s=90, zorder=4)


def render_trend(
    history_dir: Path, campaign: str | None = None, metrics: list[str] | None = None, out: Path | None = None
) -> Path:
    """Execute ``trend.ipynb`` over the history and export it to ``OUT/trend.html``."""
    trend_frame(history_dir, campaign, metrics)  # bad input fails here, before a kernel starts
    out = (out or reports_dir() / (f"trend-{campaign}" if campaign else "trend")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    parameters = {"history_dir": str(Path(history_dir).resolve()), "campaign": campaign, "metrics": metrics}
    with kernel_environment():
        kernelrun.execute(notebook("trend.ipynb"), out / "trend.ipynb", parameters, out, kernel_name=notebook_kernel())
    return export_html(out / "trend.ipynb", out / "trend.html")
