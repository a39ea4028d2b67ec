"""Tables, plots and diagnosis the notebooks show; the notebooks only call these.

Reads a campaign folder (``cells/*/cell.json``, ``cells/*/runs/*/summary.json``) into a
tidy pandas frame, one row per run, and draws the comparison figures with matplotlib.
Nothing here starts servers or touches the network: the HTML report is self-contained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.rehearsal import BANNER, is_rehearsal, marker
from bakeoff.store import read_json

GLOSSARY = """
| metric | definition |
|---|---|
| TTFT | request sent → first chunk that carries generated text. Role-only or empty chunks do not count. |
| TTFB | request sent → first stream event of any kind (what some tools report as TTFT). |
| E2E | request sent → end of the stream. |
| TPOT | (E2E − TTFT) / (output tokens − 1); output tokens from the server's `usage`. |
| ITL | gap between consecutive content chunks; *per token* divides each gap by the tokens in that chunk. |
| output tok/s | output tokens of successful requests / measured window (first send → last end). |
| tok/s per user | 1000 / TPOT ms: the decode speed one user sees. |
| goodput | requests meeting every SLO bound, per second of the window. |
| cost / M tok | cost per hour / (output tok/s × 3600) × 10⁶. |
| engine build s | TensorRT-LLM's `trtllm-build` (engine flow) or llama.cpp's GGUF conversion. |
| cold / warm start s | launch → health check answers; warm is a second start with the engine's caches filled. |
| designed reuse | share of prompt tokens repeating an earlier prefix, from the request plan. |
| server hit rate | prefix-cache hits / queries from the server's own counters over the run. |
| P50…P99.9 | percentiles over successful, non-warm-up requests; failures are counted by kind. |
"""

MEMORY_KNOB_NOTE = (
    "`gpu_memory_utilization` means different things: vLLM takes that share of total GPU memory; "
    "SGLang's `--mem-fraction-static` is a share of total memory for weights + KV cache; "
    "TensorRT-LLM's `free_gpu_memory_fraction` is a share of what is free *after* the weights load."
)


REHEARSAL_SUFFIX = " [rehearsal]"


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


def summary_table(summaries: dict[str, dict[str, Any]]) -> str:
    """A plain-text table of the headline figures, one row per run (for the terminal)."""
    header = [
        "run",
        "ok",
        "failed",
        "out tok/s",
        "req/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "ITL p50",
        "E2E p99",
    ]
    rows = [header]
    for name, s in summaries.items():
        rows.append(
            [
                name,
                _fmt(s["requests"]["ok"]),
                _fmt(s["requests"]["failed"]),
                _fmt(s["throughput"]["output_tok_s"]),
                _fmt(s["throughput"]["req_s"], 2),
                _fmt(s["ttft_ms"]["p50"]),
                _fmt(s["ttft_ms"]["p99"]),
                _fmt(s["tpot_ms"]["p50"], 2),
                _fmt(s["tpot_ms"]["p99"], 2),
                _fmt(s["itl_ms"]["p50"], 2),
                _fmt(s["e2e_ms"]["p99"]),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    failed = {n: s["requests"]["failed_by_kind"] for n, s in summaries.items() if s["requests"]["failed"]}
    tail = [f"failures in {n}: {kinds}" for n, kinds in failed.items()]
    return "\n".join(["(latencies in ms)", *lines, *tail])


def _row(cell: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    wl = summary.get("workload", {})
    pc = summary.get("prefix_cache") or {}
    slo = summary.get("slo") or {}
    cost = summary.get("cost") or {}
    return {
        "server": cell["server"]["label"],
        "backend": cell["backend"],
        "workload": cell["workload"],
        "run": wl.get("run"),
        "mode": wl.get("mode"),
        "concurrency": wl.get("concurrency"),
        "rate": wl.get("rate"),
        "ok": summary["requests"]["ok"],
        "failed": summary["requests"]["failed"],
        "failed_by_kind": summary["requests"]["failed_by_kind"],
        "output_tok_s": summary["throughput"]["output_tok_s"],
        "total_tok_s": summary["throughput"]["total_tok_s"],
        "req_s": summary["throughput"]["req_s"],
        **{
            f"{m}_{p}": summary[m][p]
            for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "ttfb_ms")
            for p in ("p50", "p90", "p99")
        },
        "tok_s_per_user_p50": summary["tok_s_per_user"]["p50"],
        "goodput_req_s": slo.get("goodput_req_s"),
        "slo_attainment": slo.get("attainment"),
        "usd_per_m_tok": cost.get("usd_per_million_output_tokens"),
        "designed_reuse": pc.get("designed_reuse"),
        "server_hit_rate": pc.get("server_hit_rate"),
        "cached_tokens_ratio": pc.get("cached_tokens_ratio"),
        "reuse_realised": pc.get("reuse_realised"),
        "cache_emptied_before_run": pc.get("cache_emptied_before_run"),
        "server_hit_unit": pc.get("server_hit_unit"),
        "interrupted": summary.get("interrupted", False),
        "rehearsal": bool(summary.get("rehearsal", False)),
        "short_completions": (summary.get("short_completions") or {}).get("count"),
        "short_warning": (summary.get("short_completions") or {}).get("warning"),
        "cache_reset_ok": (summary.get("cache_reset") or {}).get("ok"),
    }


def load_cells(campaign_dir: Path) -> list[dict[str, Any]]:
    cells = []
    for path in sorted((campaign_dir / "cells").glob("*/cell.json")):
        cell = read_json(path)
        cell["dir"] = path.parent
        cell["summaries"] = {p.parent.name: read_json(p) for p in sorted(path.parent.glob("runs/*/summary.json"))}
        cells.append(cell)
    return cells


def results_frame(campaign_dir: Path) -> pd.DataFrame:
    """One row per run of every cell, with the headline metrics as columns."""
    rows = [_row(cell, s) for cell in load_cells(campaign_dir) for s in cell["summaries"].values()]
    if not rows:
        return pd.DataFrame(columns=["server", "backend", "workload", "run", "mode", "concurrency", "rate", "failed"])
    frame = pd.DataFrame(rows)
    # A rehearsal's stand-ins carry the mark in every table and legend that names them.
    frame.loc[frame["rehearsal"], "server"] = frame.loc[frame["rehearsal"], "server"] + REHEARSAL_SUFFIX
    frame = frame.sort_values(["workload", "server", "concurrency", "rate"], na_position="last")
    return frame.reset_index(drop=True)


def styled(table: pd.DataFrame) -> Any:
    """A table for the report: no index column, two decimals, '-' for missing values."""
    return table.style.hide(axis="index").format(precision=2, na_rep="-", thousands=",")


def headline_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The table a reader decides from: throughput, latency tails, goodput, cost, failures."""
    if frame.empty:
        return frame
    cols = {
        "server": "server",
        "workload": "workload",
        "run": "run",
        "ok": "ok",
        "failed": "failed",
        "output_tok_s": "out tok/s",
        "req_s": "req/s",
        "ttft_ms_p50": "TTFT P50 ms",
        "ttft_ms_p99": "TTFT P99 ms",
        "tpot_ms_p50": "TPOT P50 ms",
        "tpot_ms_p99": "TPOT P99 ms",
        "itl_ms_p99": "ITL P99 ms",
        "e2e_ms_p99": "E2E P99 ms",
        "tok_s_per_user_p50": "tok/s/user",
        "goodput_req_s": "goodput req/s",
        "usd_per_m_tok": "$/M tok",
    }
    table = frame[list(cols)].rename(columns=cols)
    return table.dropna(axis=1, how="all").round(2)


def effort_table(campaign_dir: Path) -> pd.DataFrame:
    """Engineering effort per server: build and start times, flags changed, failed starts."""
    rows = []
    seen = set()
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    for cell in load_cells(campaign_dir):
        label = cell["server"]["label"] + suffix
        if label in seen:
            continue
        seen.add(label)
        effort = cell.get("effort", {})
        needs = effort.get("knob_change_needs", {})
        rows.append(
            {
                "server": label,
                "backend": cell["backend"],
                "image build s": effort.get("image_build_s"),
                "engine build s": effort.get("engine_build_s"),
                "cold start s": effort.get("cold_start_s"),
                "warm restart s": effort.get("warm_restart_s"),
                "cache-emptying restarts s": effort.get("cache_restart_s") or None,
                "flags changed": effort.get("flags_changed"),
                "config lines": effort.get("config_lines"),
                "knobs needing rebuild": ", ".join(k for k, v in needs.items() if v == "rebuild") or "-",
                "knobs needing restart": ", ".join(k for k, v in needs.items() if v == "restart") or "-",
                "failed starts": len(effort.get("failed_start_attempts", [])),
                "framework warnings": "; ".join(effort.get("launch_warnings", [])) or "-",
                "status": cell.get("status"),
            }
        )
    return pd.DataFrame(rows).round(1)


def prefix_cache_table(frame: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "server",
        "workload",
        "designed_reuse",
        "server_hit_rate",
        "cached_tokens_ratio",
        "server_hit_unit",
        "reuse_realised",
        "cache_emptied_before_run",
        "ttft_ms_p50",
    ]
    sub = frame[frame["mode"] == "sessions"] if not frame.empty else frame
    return sub[cols].round(3) if not sub.empty else sub


def failures_table(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return frame
    sub = frame[frame["failed"] > 0]
    return sub[["server", "workload", "run", "ok", "failed", "failed_by_kind"]]


def _sweep_axes(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    closed = frame[frame["mode"] == "closed"]
    if not closed.empty:
        return closed, "concurrency"
    return frame[frame["mode"] == "open"], "rate"


def sweep_figure(frame: pd.DataFrame, workload: str) -> Any:
    """Throughput, TTFT P50/P99 and TPOT P50/P99 against concurrency (or rate), per server."""
    import matplotlib.pyplot as plt

    data, axis = _sweep_axes(frame[frame["workload"] == workload])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (server, group) in enumerate(data.groupby("server", sort=True)):
        group = group.sort_values(axis)
        colour = colours[index % len(colours)]  # one colour per server on every panel
        axes[0].plot(group[axis], group["output_tok_s"], marker="o", color=colour, label=server)
        for col, style in (("ttft_ms_p50", "-"), ("ttft_ms_p99", "--")):
            axes[1].plot(group[axis], group[col], style, marker="o", color=colour, label=f"{server} {col[-3:].upper()}")
        for col, style in (("tpot_ms_p50", "-"), ("tpot_ms_p99", "--")):
            axes[2].plot(group[axis], group[col], style, marker="o", color=colour, label=f"{server} {col[-3:].upper()}")
    titles = ("output tokens/s", "TTFT ms (P50 solid, P99 dashed)", "TPOT ms (P50 solid, P99 dashed)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel(axis)
        if axis == "concurrency":
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    rehearsal = bool(data["rehearsal"].any()) if "rehearsal" in data else False
    fig.suptitle(
        f"workload: {workload}" + (" — REHEARSAL: reference-server stand-ins, not a measurement" if rehearsal else "")
    )
    fig.tight_layout()
    plt.close(fig)  # shown once, by the notebook's display(), not again by the inline backend
    return fig


def turn_figure(campaign_dir: Path) -> Any:
    """Median TTFT by conversation turn: prefix caching should flatten later turns."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for cell in load_cells(campaign_dir):
        for summary in cell["summaries"].values():
            by_turn = summary.get("ttft_ms_by_turn")
            if by_turn:
                turns = sorted(by_turn, key=int)
                ax.plot(
                    [int(t) + 1 for t in turns],
                    [by_turn[t] for t in turns],
                    marker="o",
                    label=f"{cell['server']['label']} / {cell['workload']}",
                )
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT P50 ms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    plt.close(fig)
    return fig


def group_table(campaign_dir: Path) -> pd.DataFrame:
    """Latency per request class (e.g. short vs long prompts in a long-prompt mix)."""
    rows = []
    for cell in load_cells(campaign_dir):
        for run, summary in cell["summaries"].items():
            for group, block in (summary.get("by_group") or {}).items():
                rows.append(
                    {
                        "server": cell["server"]["label"],
                        "workload": cell["workload"],
                        "run": run,
                        "class": group,
                        "n": block["ttft_ms"]["count"],
                        "TTFT P50 ms": block["ttft_ms"]["p50"],
                        "TTFT P99 ms": block["ttft_ms"]["p99"],
                        "TPOT P50 ms": block["tpot_ms"]["p50"],
                        "TPOT P99 ms": block["tpot_ms"]["p99"],
                        "ITL P99 ms": block["itl_ms"]["p99"],
                        "ITL P99.9 ms": block["itl_ms"]["p99.9"],
                    }
                )
    return pd.DataFrame(rows).round(2)


def model_weight_bytes(campaign_dir: Path) -> int | None:
    """Bytes of weights the campaign's model reads per decode step (its safetensors)."""
    import yaml

    from bakeoff.modelgen import DEFAULT_MODELS_DIR

    model = yaml.safe_load((campaign_dir / "campaign.yaml").read_text()).get("model", {})
    folder = Path(model["path"]) if model.get("path") else DEFAULT_MODELS_DIR / str(model.get("preset"))
    files = list(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) or None


def diagnose(frame: pd.DataFrame, weight_bytes: int | None = None) -> list[str]:
    """Plain-language findings, following the measure-first bottleneck checklist."""
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
        closed = group[group["mode"] == "closed"].sort_values("concurrency")
        single = closed[closed["concurrency"] == 1]
        if weight_bytes and not single.empty and single.iloc[0]["tpot_ms_p50"]:
            tpot = float(single.iloc[0]["tpot_ms_p50"])
            notes.append(
                f"{server} / {workload}: alone, each output token took {tpot:.1f} ms; reading "
                f"{weight_bytes / 1e6:,.0f} MB of weights once per token is {weight_bytes / tpot / 1e6:.1f} GB/s "
                "— compare with the memory bandwidth: near it, decode is bandwidth-bound and only "
                "batching, quantization or speculative decoding make it faster."
            )
        if len(closed) >= 2:
            lo, hi = closed.iloc[0], closed.iloc[-1]
            scale = hi["concurrency"] / lo["concurrency"]
            gain = hi["output_tok_s"] / lo["output_tok_s"] if lo["output_tok_s"] else 0
            tpot_growth = hi["tpot_ms_p50"] / lo["tpot_ms_p50"] if lo["tpot_ms_p50"] else 0
            if gain >= 0.5 * scale:
                notes.append(
                    f"{server} / {workload}: throughput grew {gain:.1f}x for {scale:.0f}x concurrency "
                    "— decode is memory-bandwidth-bound and batching still pays."
                )
            else:
                notes.append(
                    f"{server} / {workload}: throughput grew only {gain:.1f}x for {scale:.0f}x concurrency "
                    f"while TPOT rose {tpot_growth:.1f}x — the server is saturated (compute-bound "
                    "or limited by max_num_seqs); more concurrency buys latency, not throughput."
                )
            ttft_ratio = hi["ttft_ms_p99"] / hi["ttft_ms_p50"] if hi["ttft_ms_p50"] else 0
            if ttft_ratio > 3:
                notes.append(
                    f"{server} / {workload}: at concurrency {hi['concurrency']:.0f} P99 TTFT is "
                    f"{ttft_ratio:.1f}x P50 — requests queue for admission; look at max_num_seqs "
                    "and the prefill token budget."
                )
        _protocol_notes(notes, workload, server, group)
    return notes


def _protocol_notes(notes: list[str], workload: object, server: object, group: pd.DataFrame) -> None:
    """Findings that hold for a rehearsal too: reuse realised or not, failed requests."""
    sessions = group[group["mode"] == "sessions"]
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
    if "short_warning" in group:
        for _, row in group[group["short_warning"].notna()].iterrows():
            notes.append(f"{server} / {workload} / {row['run']}: {row['short_warning']}")
    if "cache_reset_ok" in group and (group["cache_reset_ok"] == False).any():  # noqa: E712 (None = no reset)
        notes.append(
            f"{server} / {workload}: the prefix-cache reset failed before some runs — their caches "
            "were not cold; see cache_emptied_before_run in the prefix-cache table."
        )


def campaign_title(campaign_dir: Path) -> str:
    import yaml

    spec = yaml.safe_load((campaign_dir / "campaign.yaml").read_text())
    title = f"# bakeoff report: {spec.get('name')}\n\n{spec.get('description', '')}"
    rehearsal = marker(campaign_dir)
    if rehearsal is None:
        return title
    title = f"# REHEARSAL of {spec.get('name')} — not a measurement\n\n{spec.get('description', '')}"
    return (
        f"{title}\n\n> {BANNER}\n>\n> Campaign: `{rehearsal['source_campaign']}` (scaled down); "
        f"model on a real run: `{rehearsal['original_model']}`."
    )
