"""The results frame (one row per run) and the tables read straight from it: summary, headline, failures.

Also the small pieces every report section shares: headings, number formatting, the styled and folded
HTML of a table.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.results import metric_table
from bakeoff.results.formulas import highest_supported
from bakeoff.results.layout import (
    REHEARSAL_TAG,
    CellResult,
    is_rehearsal,
    load_cells,
)
from bakeoff.results.summary import PERCENTILES, STAT_LABELS, RunSummary

# From the metric table, like the headline columns: a metric is added there, once.
GLOSSARY = metric_table.glossary()

REHEARSAL_SUFFIX = f" {REHEARSAL_TAG}"


def heading(title: str, campaign_dir: Path, level: int = 2) -> str:
    """A section heading; in a rehearsal every heading says so."""
    mark = " — REHEARSAL, not a measurement" if is_rehearsal(campaign_dir) else ""
    return f"{'#' * level} {title}{mark}"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def summary_table(summaries: dict[str, RunSummary]) -> str:
    """A plain-text table of the headline figures, one row per run (for the terminal).

    Columns are the metric table's headline figures; one no run has (no SLO, no cost) is left out.
    A percentile the run's sample cannot support shows the highest one it does (``P90 41.20 (n=24;
    P99 needs ≥100)``, :func:`bakeoff.results.formulas.supported_text`), as in the report;
    :func:`run_warnings` says what each run's numbers can and cannot be read as.
    """
    readers = metric_table.headline_readers()
    columns = list(metric_table.headline_columns())
    values = {name: [read(s) for _, read in readers] for name, s in summaries.items()}
    marks = {name: metric_table.unsupported_figures(s) for name, s in summaries.items()}
    shown = [i for i in range(len(readers)) if any(v[i] is not None for v in values.values())]
    header = ["run", "ok", "failed", *(readers[i][0] for i in shown)]
    rows = [header]
    for name, s in summaries.items():
        implied = implied_req_s(s)
        if implied is not None:  # two rates that disagree are shown side by side, not one as if steady
            marks[name]["req_s"] = f"{s.throughput.req_s:.2f} (tok/s: {implied:.2f})"
        cells = [marks[name].get(columns[i]) or _fmt(values[name][i], 2) for i in shown]
        rows.append([name, _fmt(s.requests.ok), _fmt(s.requests.failed), *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    tail = [f"failures in {n}: {s.requests.failed_by_kind}" for n, s in summaries.items() if s.requests.failed]
    return "\n".join([*lines, *tail])


def run_warnings(name: str, summary: RunSummary, more_requests: str = "requests_per_slot") -> list[str]:
    """What a run's figures can be read as: its window, the percentiles its sample supports, its rates.

    ``more_requests`` names the setting that gives a level more requests where the caller has
    another (``bakeoff bench``: ``--num-requests``). ``name`` prefixes each line (none when empty).
    """
    out: list[str] = []
    name = f"{name}: " if name else ""
    window = summary.window
    if window is not None and window.warning:
        hint = window.warning
        if more_requests != "requests_per_slot":
            # The minimums are a campaign's settings; where the caller has no flag for them, only its own flag.
            hint = hint.replace("raise requests_per_slot or lower the minimums", f"raise {more_requests}")
        out.append(f"{name}{hint.replace('requests_per_slot', more_requests)}")
    for text in (summary.chunking.warning, summary.short_completions.warning):
        if text:
            out.append(f"{name}{text}")
    for metric in metric_table.DISTRIBUTIONS:
        dist = metric.stat(summary)
        missing = [STAT_LABELS[s] for s in metric.headline_stats if s in PERCENTILES and not dist.supported(s)]
        if not missing or dist.unsupported is not None or dist.n == 0:
            continue
        best = highest_supported(dist)
        shown = (
            f"the highest it supports is {STAT_LABELS[best]} = {dist.value(best):,.2f}"
            if best
            else "it supports no percentile"
        )
        out.append(
            f"{name}{metric.name} {', '.join(missing)} unsupported by n={dist.n} samples ({shown}); "
            f"raise {more_requests} for more"
        )
    implied = implied_req_s(summary)
    if implied is not None:
        tput, window = summary.throughput, summary.window
        inside = window.requests_inside if window is not None else summary.requests.ok
        per_request = summary.tokens.completion / summary.requests.ok
        # req/s counts requests that *ended* inside the window; tok/s every token inside it. With few
        # requests in the window the count is coarse, and the two disagree.
        out.append(
            f"{name}req/s {tput.req_s:.2f} counts the requests that ended inside a {tput.window_s:.1f} s "
            f"window ({inside} measured there); output tok/s {tput.output_tok_s:,.1f} at "
            f"{per_request:.0f} tokens a request is {implied:.2f} req/s: too few requests for either to be "
            f"steady; raise {more_requests}"
        )
    return out


def implied_req_s(summary: RunSummary) -> float | None:
    """The req/s a run's output tok/s implies, where it disagrees with its req/s by over 25 % (else None)."""
    tput = summary.throughput
    done = summary.requests.ok
    per_request = summary.tokens.completion / done if done else 0.0
    if not (tput.req_s and per_request and tput.output_tok_s):
        return None
    implied = tput.output_tok_s / per_request
    return implied if abs(implied / tput.req_s - 1) > 0.25 else None


def _row(cell: CellResult, summary: RunSummary) -> dict[str, Any]:
    wl = summary.workload
    pc = summary.prefix_cache
    return {
        "server": cell.label,
        "backend": cell.backend,
        "workload": cell.workload,
        "run": wl.run,
        "repeat": wl.repeat,
        "mode": wl.mode,
        "concurrency": wl.concurrency,
        "rate": wl.rate,
        "ok": summary.requests.ok,
        "failed": summary.requests.failed,
        "failed_by_kind": summary.requests.failed_by_kind,
        **{column: read(summary) for column, read in metric_table.frame_columns()},
        "reuse_realised": pc.reuse_realised if pc else None,
        "cache_emptied_before_run": pc.cache_emptied_before_run if pc else None,
        "server_hit_unit": pc.server_hit_unit if pc else None,
        "interrupted": summary.interrupted,
        "rehearsal": summary.rehearsal,
        "short_completions": summary.short_completions.count,
        "short_warning": summary.short_completions.warning,
        "cache_reset_ok": summary.cache_reset.ok if summary.cache_reset else None,
        "coalesced_share": summary.chunking.share,
        "chunking_warning": summary.chunking.warning,
        "window_warning": summary.window.warning if summary.window else None,
        "unsupported_figures": metric_table.unsupported_figures(summary),
    }


def results_frame(campaign_dir: Path) -> pd.DataFrame:
    """One row per run of every cell, with the headline metrics as columns."""
    rows = [_row(cell, s) for cell in load_cells(campaign_dir) for s in cell.summaries.values()]
    if not rows:
        return pd.DataFrame(columns=["server", "backend", "workload", "run", "mode", "concurrency", "rate", "failed"])
    frame = pd.DataFrame(rows)
    # A rehearsal's stand-ins carry the mark in every table and legend that names them.
    frame.loc[frame["rehearsal"], "server"] = frame.loc[frame["rehearsal"], "server"] + REHEARSAL_SUFFIX
    frame = frame.sort_values(["workload", "server", "concurrency", "rate"], na_position="last")
    return frame.reset_index(drop=True)


# Columns that count things: shown as whole numbers even where a missing value made the column float
# (an open-loop row has no concurrency), so concurrency 1 reads "1", not "1.00".
WHOLE_NUMBER_COLUMNS = ("concurrency", "repeat", "ok", "failed", "failed starts", "flags changed", "config lines")


def styled(table: pd.DataFrame) -> Any:
    """A table for the report: no index column, two decimals, '-' for missing values, counts as whole numbers."""
    style = table.style.hide(axis="index").format(precision=2, na_rep="-", thousands=",")
    whole: list[Hashable] = [
        c for c in WHOLE_NUMBER_COLUMNS if c in table.columns and pd.api.types.is_numeric_dtype(table[c])
    ]
    return style.format("{:,.0f}", subset=whole, na_rep="-") if whole else style


# A warm restart is flagged only when clearly slower: start times vary by a second or so run to
# run (llama.cpp's 1.05 s against 1.03 s is no finding), a cache that did not help shows as more.
SLOWER_RESTART = 1.25
SLOWER_RESTART_S = 5.0


def start_note(cold_s: float | None, warm_s: float | None) -> str:
    """Flags a warm restart clearly slower than the cold start: the caches a restart should reuse did not help."""
    if cold_s is None or warm_s is None or pd.isna(cold_s) or pd.isna(warm_s):
        return "-"
    if warm_s < cold_s * SLOWER_RESTART or warm_s - cold_s < SLOWER_RESTART_S:
        return "-"
    return (
        f"warm restart ({warm_s:.0f} s) slower than the cold start ({cold_s:.0f} s): the caches a restart "
        "reuses did not help, or the machine was busy; read the restart's server.log"
    )


def headline_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The table a reader decides from: throughput, latency tails, goodput, cost, failures."""
    if frame.empty:
        return frame
    cols = {"server": "server", "workload": "workload", "run": "run", "ok": "ok", "failed": "failed"}
    cols.update(metric_table.headline_columns())
    table = frame[list(cols)].round(2).astype(object)
    if "unsupported_figures" in frame:
        # A percentile the sample cannot support is shown as such, never as a number.
        for index, marks in frame["unsupported_figures"].items():
            for column, why in (marks or {}).items():
                if column in table.columns:
                    table.at[index, column] = why
    return table.rename(columns=cols).dropna(axis=1, how="all")


def failures_table(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    sub = frame[frame["failed"] > 0]
    return sub[["server", "workload", "run", "ok", "failed", "failed_by_kind"]]


def folded(title: str, table: pd.DataFrame) -> str:
    """A per-run table folded under a details element: evidence one click away, not on the first screens."""
    import html

    body = styled(table).to_html()
    return f"<details><summary><b>{html.escape(title)}</b> ({len(table)} rows)</summary>{body}</details>"
