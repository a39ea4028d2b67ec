"""One row of the metric table: :class:`Metric` and the two constructors its rows use.

Owns the shape of a metric definition (formula or reader, words, unit, column, direction);
the rows themselves live in :mod:`bakeoff.results.metric_table` and
:mod:`bakeoff.results.agent_metrics`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bakeoff.results.formulas import Samples
from bakeoff.results.summary import RunSummary, Stat, StatName

Better = Literal["higher", "lower"]


@dataclass(frozen=True)
class Metric:
    """One reported metric.

    A distribution has ``samples`` (per-request values -> a :class:`Stat` in ``latency``);
    its ``column`` holds ``{stat}`` for the statistic's label. A run-level figure has
    ``read``. ``frame_stats`` / ``headline_stats``: statistics carried into the results
    frame / shown in the headline table; ``headline`` does the same for a run-level figure.
    """

    key: str
    name: str  # as the glossary names it
    unit: str
    definition: str
    better: Better | None
    column: str
    samples: Samples | None = None
    read: Callable[[RunSummary], float | None] | None = None
    frame_stats: tuple[StatName, ...] = ("p50", "p90", "p99")
    headline_stats: tuple[StatName, ...] = ()
    headline: bool = False
    # Exists only for some runs (reasoning phases): with no sample it is absent, not unsupported.
    conditional: bool = False

    def stat(self, summary: RunSummary) -> Stat:
        return summary.latency.get(self.key)

    def value(self, summary: RunSummary, stat: StatName | None = None) -> float | None:
        """The figure from a summary: ``stat`` of a distribution, or the run-level value."""
        if self.read is not None:
            return self.read(summary)
        dist = self.stat(summary)
        # A distribution marked unsupported (coalesced chunks) has no figure to show, only its reason.
        return None if dist.unsupported is not None else dist.value(stat or "p50")


def distribution(
    key: str,
    name: str,
    definition: str,
    column: str,
    samples: Samples,
    *,
    unit: str = "ms",
    better: Better = "lower",
    frame: tuple[StatName, ...] = ("p50", "p90", "p99"),
    headline: tuple[StatName, ...] = (),
    conditional: bool = False,
) -> Metric:
    return Metric(key, name, unit, definition, better, column, samples, None, frame, headline, False, conditional)


def figure(
    key: str,
    name: str,
    unit: str,
    definition: str,
    better: Better | None,
    read: Callable[[RunSummary], float | None],
    *,
    column: str = "",
    headline: bool = False,
) -> Metric:
    return Metric(key, name, unit, definition, better, column or name, None, read, (), (), headline)
