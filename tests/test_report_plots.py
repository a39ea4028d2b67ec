"""Report figures that do not invent: measured levels only, means as in the verdict, tails only where supported.

No engines: synthetic summaries (:mod:`verdict_planted`) made into the results frame, and a
planted telemetry series; each test reads the drawn matplotlib artists.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bakeoff.analysis import pareto
from bakeoff.report.plots import server_palette, telemetry_figure
from bakeoff.report.tables import _row, sweep_figure
from bakeoff.results.cell_record import CellRecord
from bakeoff.results.layout import CellResult
from bakeoff.results.summary import RunSummary
from verdict_planted import run


def _with_tail(summary: RunSummary, p90: float) -> RunSummary:
    """The run with a P90 beside its P99 (TTFT and TPOT), as a real summary carries."""
    latency = summary.latency.model_copy(
        update={
            "ttft_ms": summary.latency.ttft_ms.model_copy(update={"p90": p90}),
            "tpot_ms": summary.latency.tpot_ms.model_copy(update={"p90": 11.0}),
        }
    )
    return summary.model_copy(update={"latency": latency})


def _frame() -> pd.DataFrame:
    """Server a at concurrency 1 (200 requests a run: P99 supported) and 8 (24 a run: P90 only), 3 repeats."""
    rows = []
    for repeat, (low, high) in enumerate([(100.0, 400.0), (110.0, 420.0), (90.0, 440.0)], start=1):
        cell = CellResult(
            Path(f"a__sweep__r{repeat}"), {"label": "a"}, "vllm-cpu", "sweep", repeat, "ok", {}, CellRecord()
        )
        rows.append(_row(cell, _with_tail(run(low, concurrency=1, repeat=repeat, n=200), 80.0)))
        rows.append(_row(cell, _with_tail(run(high, concurrency=8, repeat=repeat, n=24), 90.0)))
    return pd.DataFrame(rows)


def _xs(line: object) -> list[float]:
    x, y = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)  # type: ignore[attr-defined]
    return [float(v) for v, w in zip(x, y, strict=True) if not np.isnan(w)]


def test_a_log2_axis_ticks_at_measured_levels_only_and_axes_start_at_zero() -> None:
    fig = sweep_figure(_frame(), "sweep")
    for ax in fig.axes:
        assert list(ax.get_xticks()) == [1.0, 8.0]  # never 2 and 4, which nobody measured
        assert not ax.xaxis.get_minor_ticks() or not any(t.get_visible() for t in ax.xaxis.get_minor_ticks())
        assert ax.get_ylim()[0] == 0.0
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "band: range of the repeats" in texts


def test_points_are_the_means_over_repeats_as_in_the_verdict() -> None:
    fig = sweep_figure(_frame(), "sweep")
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "-"]
    assert list(line.get_ydata()) == pytest.approx([100.0, 420.0])


def test_no_p99_line_is_drawn_from_runs_that_do_not_support_a_p99() -> None:
    fig = sweep_figure(_frame(), "sweep")
    ttft = fig.axes[1]
    p99 = [ln for ln in ttft.get_lines() if ln.get_linestyle() == "--"]
    p90 = [ln for ln in ttft.get_lines() if ln.get_linestyle() == ":"]
    assert p99 and all(_xs(ln) == [1.0] for ln in p99)  # P99 only where 200 requests a run support it
    assert p90 and all(_xs(ln) == [8.0] for ln in p90)  # P90 where 24 do, and it says so
    assert "P99 dashed" in ttft.get_title() and "P90 dotted" in ttft.get_title()


def test_the_telemetry_plot_draws_one_labelled_line_per_repeat() -> None:
    t = np.arange(0.0, 6.0)
    series = pd.concat(
        [
            pd.DataFrame(
                {"server": "a", "workload": "w", "run": "c4", "repeat": r, "level": 4.0, "t_s": t}
                | {"metric": "running", "value": 3.0 + r}
            )
            for r in (1, 2, 3)
        ],
        ignore_index=True,
    )
    fig = telemetry_figure(series, "w", server_palette(["a"]), {"running": "requests running"})
    lines = fig.axes[0].get_lines()
    assert len(lines) == 3  # not one line through three repeats
    for line in lines:
        assert np.all(np.diff(np.asarray(line.get_xdata(), dtype=float)) > 0), "a line jumps back to t = 0"
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"repeat 1", "repeat 2", "repeat 3"} <= set(names)
    assert len({line.get_linestyle() for line in lines}) == 3


def test_the_pareto_plot_starts_its_axes_at_zero() -> None:
    # Two servers 2% apart: drawn from 0, the gap reads as the noise it is.
    frame = pd.DataFrame(
        {
            "workload": "w",
            "server": ["a", "b"],
            "run": "c4",
            "concurrency": 4,
            "rate": None,
            "output_tok_s": [300.0, 306.0],
            "tok_s_per_user_p50": [70.0, 71.0],
        }
    )
    pts = pareto.points(frame, {})
    ax = pareto.figure(pts, "w", server_palette(["a", "b"]), "machine").axes[0]
    assert ax.get_xlim()[0] == 0.0 and ax.get_ylim()[0] == 0.0
