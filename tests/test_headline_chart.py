"""The first screen's headline chart: a panel per workload, each on its own scale and unit."""

from __future__ import annotations

import matplotlib.pyplot as plt

from bakeoff.analysis.confidence import Estimate
from bakeoff.analysis.verdict import LevelVerdict, Standing, WorkloadVerdict
from bakeoff.report.decision import HEADLINE_PANELS, headline_figure


def _standing(server: str, value: float, meets: bool = True) -> Standing:
    figure = Estimate("goodput_req_s", "mean", value, value * 0.9, value * 1.1, repeats=3, samples=40)
    return Standing(server, "ref", meets, figure, None)


def _verdict(name: str, scale: float, loads: tuple[float, ...]) -> WorkloadVerdict:
    levels = {
        load: LevelVerdict(load, [_standing("fast", 2 * scale * load), _standing("slow", scale * load)], 0.05)
        for load in loads
    }
    return WorkloadVerdict(name, "concurrency", "goodput_req_s", {}, loads[-1], levels, {})


def test_each_workload_gets_its_own_panel_and_scale() -> None:
    chat, long = _verdict("chat", 5.0, (1.0,)), _verdict("long-prompts", 0.5, (1.0, 4.0))
    fig = headline_figure([chat, long])
    try:
        axes = fig.get_axes()
        assert [ax.get_title() for ax in axes] == ["chat", "long-prompts"]
        # Each panel its own loads and its own y range: the long prompts' bars are not flattened by chat's.
        assert [len(ax.get_xticks()) for ax in axes] == [1, 2]
        assert axes[0].get_ylim()[1] > 9.0 and axes[1].get_ylim()[1] < 5.0
        heights = sorted(round(p.get_height(), 3) for p in axes[1].patches)
        assert heights == [0.5, 1.0, 2.0, 4.0]  # slow, fast at concurrency 1 and 4
        # One legend for the figure (the first panel), naming every server.
        assert axes[1].get_legend() is None
        assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["fast", "slow"]
    finally:
        plt.close(fig)


def test_past_the_panels_the_chart_says_how_many_workloads_it_left_to_the_table() -> None:
    found = [_verdict(f"w{i}", 1.0, (1.0,)) for i in range(HEADLINE_PANELS + 2)]
    fig = headline_figure(found)
    try:
        assert len(fig.get_axes()) == HEADLINE_PANELS
        assert "2 more workload(s) in the table" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
