"""The report's "why" sections: telemetry series, the decode roofline, the diagnosis, the Pareto front, advice.

Thin glue between a campaign folder and the analyses (:mod:`bakeoff.observe.telemetry_series`,
:mod:`bakeoff.analysis.roofline`, :mod:`bakeoff.analysis.diagnosis`, :mod:`bakeoff.analysis.pareto`,
:mod:`bakeoff.analysis.advisor`) for ``compare.ipynb``. Like :mod:`bakeoff.report.tables`, nothing here
measures or reaches the network; every figure uses the campaign's one palette.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.analysis import pareto
from bakeoff.analysis.advisor import advise
from bakeoff.analysis.diagnosis import diagnose_cells
from bakeoff.analysis.roofline import ENV, campaign_roofline, efficiencies
from bakeoff.analysis.verdict import campaign_design
from bakeoff.observe.telemetry_series import LABELS, SERIES_KEY, read_series, with_rates
from bakeoff.report.frame import REHEARSAL_SUFFIX
from bakeoff.report.plots import server_palette, telemetry_figure
from bakeoff.results.layout import CellResult, is_rehearsal, load_cells, read_campaign_copy

ROOFLINE_NOTE = (
    "Decode floor per output token = bytes one decode step reads (the weights, plus the KV cache of the "
    "batch at its mean context) / memory bandwidth. Efficiency = floor / measured TPOT P50 at concurrency 1: "
    "1.0 is the physical limit; above it the measurement is wrong (coalesced chunks or a wrong bandwidth), "
    "never a finding."
)


def palette(frame: pd.DataFrame) -> dict[str, Any]:
    """The campaign's palette: every server in the results frame, one colour each."""
    return server_palette(frame["server"]) if not frame.empty else {}


def campaign_series(cells: Sequence[CellResult]) -> Any:
    """Every run's series (rates added) as one long frame: server, workload, run, repeat, level, t_s, metric, value.

    ``cells``: :func:`bakeoff.results.layout.load_cells` output; server labels as in the results frame.
    """
    parts = []
    for cell in cells:
        for run, summary in cell.summaries.items():
            name = summary.telemetry_series.get(SERIES_KEY)
            path = cell.dir / "runs" / run / name if name else None
            if path is None or not path.is_file():
                continue
            wide = with_rates(read_series(path))
            shown = [c for c in LABELS if c in wide and wide[c].notna().any()]
            long = wide.melt(id_vars=["t_s"], value_vars=shown, var_name="metric", value_name="value")
            long["server"] = cell.label + (REHEARSAL_SUFFIX if summary.rehearsal else "")
            long["workload"] = cell.workload
            long["run"] = run
            long["repeat"] = summary.workload.repeat or cell.repeat
            long["level"] = summary.workload.concurrency or summary.workload.rate
            parts.append(long.dropna(subset=["value"]))
    columns = ["server", "workload", "run", "repeat", "level", "t_s", "metric", "value"]
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)[columns]


def telemetry_figures(campaign_dir: Path, frame: pd.DataFrame) -> list[tuple[str, Any]]:
    """(workload, figure) for each workload with telemetry series."""
    series = campaign_series(load_cells(campaign_dir))
    if series.empty:
        return []
    colours = palette(frame)
    return [(w, telemetry_figure(series, w, colours, LABELS)) for w in sorted(series["workload"].unique())]


def roofline_table(campaign_dir: Path) -> pd.DataFrame:
    """Each server's decode efficiency against the floor at concurrency 1, per workload."""
    rows = campaign_roofline(campaign_dir)
    if not rows:
        return pd.DataFrame(rows)
    # Repeats of a cell: the median of each figure.
    table = pd.DataFrame(rows).groupby(["server", "workload", "bandwidth source"], as_index=False).median()
    return table[list(rows[0])].round(3)


def roofline_notes(table: pd.DataFrame) -> list[str]:
    """One sentence per server: how close to the floor, or why the figure cannot be right."""
    notes = []
    for _, row in table.iterrows():
        if row["efficiency"] > 1.0:
            notes.append(
                f"{row['server']} / {row['workload']}: TPOT {row['TPOT P50 ms']:.2f} ms is below the floor of "
                f"{row['floor ms']:.2f} ms ({row['implied GB/s']:,.0f} GB/s implied, {row['bandwidth GB/s']:,.0f} "
                f"assumed, from {row['bandwidth source']}): not a result. Either the bandwidth figure is low (a copy "
                "benchmark run on a busy host: delete ~/.cache/bakeoff/memory_bandwidth.json to measure it again, or "
                f"set {ENV}) or the TPOT is (chunks that coalesced several tokens)."
            )
        else:
            notes.append(
                f"{row['server']} / {row['workload']}: decode at {row['efficiency']:.0%} of the memory-bandwidth "
                f"floor ({row['TPOT P50 ms']:.2f} ms per token against a floor of {row['floor ms']:.2f} ms)."
            )
    return notes


def diagnosis_notes(campaign_dir: Path) -> list[str]:
    """The diagnosis of every measured cell, with the series and the roofline fraction it rests on."""
    return [d.markdown() for d in diagnose_cells(load_cells(campaign_dir), efficiencies(campaign_dir))]


PARETO_WITHHELD = (
    "No Pareto front in a rehearsal: every point would be the reference server at the rehearsal's fixed pace "
    "(its TTFT and inter-token gap are set by bakeoff, not by the framework), so a front would rank stand-ins, "
    "not frameworks. The front is drawn when the campaign runs on the GPU host."
)


def pareto_withheld(campaign_dir: Path) -> str | None:
    """Why no front is drawn (a rehearsal's stand-ins), or None when :func:`pareto_figures` draws one."""
    return PARETO_WITHHELD if is_rehearsal(campaign_dir) else None


def pareto_figures(
    campaign_dir: Path, frame: pd.DataFrame, axis: pareto.Axis = "throughput"
) -> list[tuple[str, Any, pd.DataFrame]]:
    """(workload, figure, front table) per workload with at least two points; none for a rehearsal.

    ``axis="energy"``: tokens per joule as y, for runs that measured energy (none: an empty list).
    """
    if pareto_withheld(campaign_dir) is not None:
        return []
    gpu = read_campaign_copy(campaign_dir).gpu
    units = {}
    for cell in load_cells(campaign_dir):
        label = cell.label
        units[label] = pareto.units(cell.knobs, gpu)
    pts = pareto.points(frame, units, axis)
    margin = campaign_design(campaign_dir).min_effect  # the verdict's margin: equals there are equals here
    colours = palette(frame)
    out = []
    for workload in sorted(pts["workload"].unique()):
        sub = pts[pts["workload"] == workload]
        if len(sub) < 2:
            continue
        fig = pareto.figure(pts, workload, colours, "GPU" if gpu else "machine", axis, margin)
        out.append((workload, fig, pareto.front(sub, margin).round(2)))
    return out


def advice_markdown(campaign_dir: Path) -> str:
    """The tuning advisor's next step, as the report shows it (nothing is written)."""
    advice = advise(campaign_dir)
    text = "\n".join(f"- {line}" for line in advice.markdown())
    if advice.steps:
        text += "\n\n`bakeoff advise " + str(campaign_dir) + "` writes the campaign that tests it."
    return text
