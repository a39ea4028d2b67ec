"""Tables, plots and diagnosis the notebooks show; the notebooks only call these.

Reads a campaign folder (``cells/*/cell.json``, ``cells/*/runs/*/summary.json``) into a
tidy pandas frame, one row per run, and draws the comparison figures with seaborn.
Nothing here starts servers or touches the network: the HTML report is self-contained.

This module is the notebooks' one import (``from bakeoff.report import tables as report``);
each section lives in its own module: :mod:`.frame` (the results frame and the tables read
from it), :mod:`.setup` (what ran where, build and start costs, the title), :mod:`.sweeps`
(tables and figures by load), :mod:`.findings` (prose findings) and :mod:`.outcomes`
(quality, verdict, noise, energy).
"""

from __future__ import annotations

from bakeoff.report.findings import diagnose
from bakeoff.report.frame import (
    GLOSSARY,
    REHEARSAL_SUFFIX,
    WHOLE_NUMBER_COLUMNS,
    _row,
    failures_table,
    folded,
    heading,
    headline_table,
    implied_req_s,
    results_frame,
    run_warnings,
    start_note,
    styled,
    summary_table,
)
from bakeoff.report.outcomes import (
    confidence_table,
    energy_table,
    energy_unmeasured,
    noise_table,
    quality_table,
    remeasured_table,
    verdict_section,
)
from bakeoff.report.setup import (
    BATCHED_TOKENS_NOTE,
    MEMORY_KNOB_NOTE,
    build_seconds,
    build_step,
    campaign_title,
    effort_notes,
    effort_table,
    gpu_host_markdown,
    kv_pool_table,
    setup_table,
)
from bakeoff.report.sweeps import (
    group_table,
    prefix_cache_table,
    speculative_table,
    sweep_figure,
    sweep_levels,
    turn_figure,
)

__all__ = [
    "BATCHED_TOKENS_NOTE",
    "GLOSSARY",
    "MEMORY_KNOB_NOTE",
    "REHEARSAL_SUFFIX",
    "WHOLE_NUMBER_COLUMNS",
    "_row",
    "build_seconds",
    "build_step",
    "campaign_title",
    "confidence_table",
    "diagnose",
    "effort_notes",
    "effort_table",
    "energy_table",
    "energy_unmeasured",
    "failures_table",
    "folded",
    "gpu_host_markdown",
    "group_table",
    "heading",
    "headline_table",
    "implied_req_s",
    "kv_pool_table",
    "noise_table",
    "prefix_cache_table",
    "quality_table",
    "remeasured_table",
    "results_frame",
    "run_warnings",
    "setup_table",
    "speculative_table",
    "start_note",
    "styled",
    "summary_table",
    "sweep_figure",
    "sweep_levels",
    "turn_figure",
    "verdict_section",
]
