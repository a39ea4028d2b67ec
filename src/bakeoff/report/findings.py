"""Prose findings read from the results frame: scaling, protocol and latency-shape notes."""

from __future__ import annotations

from typing import Any

import pandas as pd

from bakeoff.analysis.diagnosis import TPOT_FLAT
from bakeoff.measure.load_modes import prefix_sharing_modes


def diagnose(frame: pd.DataFrame) -> list[str]:
    """Plain-language findings, following the measure-first bottleneck checklist.

    How batching scaled throughput (from two or more measured levels only, each the mean over
    its repeats: one level says nothing about scaling, and the finding says so), whether
    requests queued for admission, and what the protocol showed (reuse not realised, failed
    requests, coalesced chunks, short windows). Which resource bounds a server (memory,
    batching, compute, bandwidth) is the diagnosis's, in the "Why" section, with its evidence
    (:mod:`bakeoff.analysis.diagnosis`); how close decode came to the memory-bandwidth floor is
    the roofline's (:func:`bakeoff.report.explain.roofline_notes`): each said once, in one place.
    """
    notes: list[str] = []
    if "rehearsal" in frame and frame["rehearsal"].any():
        notes.append(
            "Rehearsal: no performance finding is drawn — the servers were reference-server stand-ins. "
            "Below: only what the rehearsal checks (failed requests, prefix reuse seen through the protocol)."
        )
    for (workload, server), group in frame.groupby(["workload", "server"], sort=True):
        if "rehearsal" in group and group["rehearsal"].any():
            _protocol_notes(notes, workload, server, group)
            continue
        closed = group[group["mode"] == "closed"]
        if not closed.empty:
            notes.extend(_scaling_notes(f"{server} / {workload}", closed))
        _protocol_notes(notes, workload, server, group)
    return notes


def _scaling_notes(who: str, closed: pd.DataFrame) -> list[str]:
    """How throughput and latency moved from the lowest measured level to the highest (means over repeats)."""
    columns = ["output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "ttft_ms_p99"]
    # A figure no run could support (TPOT where a fast server's chunks all came in one read) is
    # None in every row, an object column that a numeric mean would drop: make it NaN instead.
    numeric = closed[columns].apply(pd.to_numeric, errors="coerce").assign(concurrency=closed["concurrency"])
    by_level = numeric.groupby("concurrency")[columns].mean().sort_index()
    if len(by_level) < 2:
        level = ", ".join(f"{c:g}" for c in by_level.index)
        return [
            f"{who}: no scaling finding — one concurrency level measured ({level}); how throughput scales "
            "with load needs two or more levels."
        ]
    lo_c, hi_c = float(by_level.index[0]), float(by_level.index[-1])
    lo, hi = by_level.iloc[0], by_level.iloc[-1]
    scale = hi_c / lo_c
    where = f"from concurrency {lo_c:g} to {hi_c:g} ({scale:g}x; means over repeats)"
    if not lo["output_tok_s"] or pd.isna(lo["output_tok_s"]) or pd.isna(hi["output_tok_s"]):
        return []
    gain = hi["output_tok_s"] / lo["output_tok_s"]
    tpot = hi["tpot_ms_p50"] / lo["tpot_ms_p50"] if lo["tpot_ms_p50"] else None
    tpot_text = f"; TPOT P50 rose {tpot:.1f}x" if tpot is not None and not pd.isna(tpot) else ""
    notes = []
    if gain >= 0.5 * scale:
        notes.append(f"{who}: throughput grew {gain:.1f}x {where}{tpot_text} — batching still pays.")
    else:
        # A conclusion only as far as the numbers go: "bought latency" needs TPOT to have risen.
        bought = tpot is not None and not pd.isna(tpot) and tpot >= TPOT_FLAT
        what = "more concurrency bought latency, not throughput" if bought else "throughput stopped scaling"
        notes.append(
            f"{who}: throughput grew only {gain:.1f}x {where}{tpot_text} — {what} (what limits it: the "
            "diagnosis under Why)."
        )
    p50, p99 = hi["ttft_ms_p50"], hi["ttft_ms_p99"]
    top = closed[closed["concurrency"] == hi_c]
    marks: Any = top.get("unsupported_figures", [])
    tail_ok = not any("ttft_ms_p99" in (m or {}) for m in marks)  # a P99 the sample supports, or none
    if tail_ok and p50 and not pd.isna(p99) and p99 / p50 > 3:
        notes.append(
            f"{who}: at concurrency {hi_c:g} P99 TTFT is {p99 / p50:.1f}x P50 — requests queue for admission; "
            "look at max_num_seqs and the prefill token budget."
        )
    return notes


def _protocol_notes(notes: list[str], workload: object, server: object, group: pd.DataFrame) -> None:
    """Findings that hold for a rehearsal too: reuse realised or not, failed requests."""
    sessions = group[group["mode"].isin(prefix_sharing_modes())]
    for _, row in sessions.iterrows():
        realised = row["reuse_realised"]
        if realised is not None and not pd.isna(realised) and not bool(realised):
            notes.append(
                f"{server} / {workload}: prefix reuse was designed ({row['designed_reuse']:.0%}) "
                "but not realised by the server — prefix caching is off or evicted."
            )
    failed = int(group["failed"].sum())
    if failed:
        notes.append(f"{server} / {workload}: {failed} failed requests — see the failures table.")
    for column in ("chunking_warning", "window_warning"):
        if column in group:
            for _, row in group[group[column].notna()].drop_duplicates(column).iterrows():
                notes.append(f"{server} / {workload} / {row['run']}: {row[column]}")
    if "short_warning" in group:
        for _, row in group[group["short_warning"].notna()].iterrows():
            notes.append(f"{server} / {workload} / {row['run']}: {row['short_warning']}")
    if "cache_reset_ok" in group and (group["cache_reset_ok"] == False).any():  # noqa: E712 (None = no reset)
        notes.append(
            f"{server} / {workload}: the prefix-cache reset failed before some runs — their caches "
            "were not cold; see cache_emptied_before_run in the prefix-cache table."
        )
