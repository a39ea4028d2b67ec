"""The optimization ladder in the report: the waterfall, the quality per step, the final configuration.

A ladder campaign (:mod:`bakeoff.campaign.ladder`) writes ``ladder.json`` beside its cells: the
baseline's and each step's outcome (speed, memory, quality, effective dtypes) and the decision
on each step (kept or rolled back, the reasons, the last kept step it was judged against).
This module turns that file into what a reader wants to see, the same in ``report.html`` and
in ``ladder.md``:

- :func:`waterfall_rows` / :func:`waterfall_table`: one row per step, its Δ columns against
  the step it was judged on (the last kept one, not the row above: after a rollback those
  differ);
- :func:`waterfall_figure`: output tok/s as a waterfall, each kept step moving the level from
  the last kept one, a rolled-back step drawn apart (it moved nothing), and the exact-answer
  rate and word agreement per step below it;
- :func:`final_markdown`: the final configuration and its rollback chain;
- :func:`waterfall_markdown`: all of it as Markdown, for ``ladder.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.results.layout import LADDER_FILE
from bakeoff.results.store import read_json

# The decision each row shows.
BASELINE, KEPT, ROLLED_BACK = "baseline", "kept", "rolled back"


def ladder_data(campaign_dir: Path) -> dict[str, Any] | None:
    """``ladder.json`` of a campaign folder, or None when the campaign had no ladder."""
    path = campaign_dir / LADDER_FILE
    return read_json(path) if path.is_file() else None


def _ratio(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else new / old - 1


def waterfall_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The baseline, then each step with its Δ against the step it was judged on."""
    base = data["baseline"]
    outcomes = {base["label"]: base}
    every = [base, *(s["outcome"] for s in data["steps"])]
    groups = sorted({g for o in every for g in o.get("exact_by_group") or {}})
    # Only servers that return prompt logprobs are scored (vLLM, not llama.cpp): no column of blanks.
    scored = any(o.get("perplexity") is not None for o in every)

    def row(outcome: dict[str, Any], decision: dict[str, Any] | None) -> dict[str, Any]:
        against = None if decision is None else outcomes.get(decision["against"])
        reasons = [] if decision is None else decision["reasons"]
        dtypes = outcome.get("dtypes") or {}
        values: dict[str, Any] = {
            "step": outcome["label"],
            "decision": BASELINE if decision is None else (KEPT if decision["kept"] else ROLLED_BACK),
            "judged against": None if decision is None else decision["against"],
            "out tok/s": outcome.get("output_tok_s"),
            "Δ tok/s %": None
            if against is None or (r := _ratio(outcome.get("output_tok_s"), against.get("output_tok_s"))) is None
            else 100 * r,
            "TTFT P50 ms": outcome.get("ttft_ms_p50"),
            "TTFT P99 ms": outcome.get("ttft_ms_p99"),
            "TPOT P50 ms": outcome.get("tpot_ms_p50"),
            "TPOT P99 ms": outcome.get("tpot_ms_p99"),
            # Per token, not per chunk: with speculation a chunk can carry several tokens.
            "ITL/token P50 ms": outcome.get("itl_per_token_ms_p50"),
            "peak RSS MiB": outcome.get("peak_rss_mib"),
            "exact %": _percent(outcome.get("exact")),
            "Δ exact pts": _percent(None if decision is None else decision.get("exact_change")),
            **{f"exact {g} %": _percent((outcome.get("exact_by_group") or {}).get(g)) for g in groups},
            "word agreement %": _percent(None if decision is None else decision.get("word_agreement")),
            **(
                {
                    "perplexity": outcome.get("perplexity"),
                    "Δ perplexity %": _percent(None if decision is None else decision.get("perplexity_change")),
                }
                if scored
                else {}
            ),
            "draft acceptance %": _percent(outcome.get("spec_acceptance_rate")),
            "weights": dtypes.get("weights"),
            "KV cache": dtypes.get("kv_cache"),
            "why tried": outcome.get("why") or None,
            "verdict": None if decision is None else ("; ".join(reasons) or "within the quality bound"),
        }
        return values

    rows = [row(base, None)]
    for step in data["steps"]:
        outcomes[step["outcome"]["label"]] = step["outcome"]
        rows.append(row(step["outcome"], step["decision"]))
    return rows


def _percent(share: float | None) -> float | None:
    return None if share is None else 100 * share


def waterfall_table(campaign_dir: Path) -> pd.DataFrame:
    """The waterfall as a table for the report; empty without a ladder."""
    data = ladder_data(campaign_dir)
    return pd.DataFrame(waterfall_rows(data)) if data is not None else pd.DataFrame()


def bound_text(data: dict[str, Any]) -> str:
    bound = data.get("bound") or {}
    if not bound:
        return "Each step is judged against the last kept step."
    return (
        "Each step is measured on top of the last kept step and judged against it: kept while the "
        f"exact-answer rate falls by at most {bound['max_exact_drop']:.0%} and greedy outputs agree word "
        f"for word at least {bound['min_word_agreement']:.0%}"
        + (
            f", and the held-out perplexity (where the server returns prompt logprobs) rises by at most "
            f"{bound['max_perplexity_rise']:.0%}"
            if "max_perplexity_rise" in bound
            else ""
        )
        + "; otherwise rolled back, and the next step "
        "starts again from the last kept one."
    )


def final_markdown(data: dict[str, Any]) -> str:
    """The final configuration, what it bought against the baseline, and its rollback chain."""
    final = data["final"]
    outcomes = {
        data["baseline"]["label"]: data["baseline"],
        **{s["outcome"]["label"]: s["outcome"] for s in data["steps"]},
    }
    change = _ratio(outcomes[final["label"]].get("output_tok_s"), data["baseline"].get("output_tok_s"))
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(final["knobs"].items())) or "(defaults)"
    bought = "" if change is None else f"; {change:+.0%} output tok/s against the baseline"
    rolled = [s["outcome"]["label"] for s in data["steps"] if not s["decision"]["kept"]]
    lines = [
        f"**Final configuration:** `{final['label']}` ({knobs}){bought}.",
        "",
        "**Rollback chain** (each link undoes the last): " + " → ".join(f"`{label}`" for label in final["chain"]),
    ]
    if rolled:
        lines += ["", "**Rolled back:** " + ", ".join(f"`{label}`" for label in rolled)]
    return "\n".join(lines)


def _cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    if isinstance(value, float):
        # Changes carry their sign; milliseconds of a fast step need the second decimal.
        return f"{value:+.1f}" if column.startswith("Δ") else f"{value:,.{2 if ' ms' in column else 1}f}"
    return str(value).replace("|", "\\|")


def waterfall_markdown(data: dict[str, Any]) -> str:
    """The waterfall table, the bound and the final configuration as Markdown (``ladder.md``)."""
    rows = waterfall_rows(data)
    head = list(rows[0])
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    table += ["| " + " | ".join(_cell(c, r[c]) for c in head) + " |" for r in rows]
    return "\n".join(["## Optimization ladder", "", bound_text(data), "", *table, "", final_markdown(data), ""])


def waterfall_figure(campaign_dir: Path) -> Any:
    """Output tok/s step by step (kept steps move the level, rolled-back ones stand apart) over the
    quality of each step; None without a ladder."""
    data = ladder_data(campaign_dir)
    if data is None:
        return None
    import matplotlib.pyplot as plt  # deferred: plotting libraries load in seconds; tables need none

    rows = waterfall_rows(data)
    labels = [r["step"] for r in rows]
    x = range(len(rows))
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(1.6 + 1.25 * len(rows), 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    level, last = rows[0]["out tok/s"] or 0.0, 0  # the last kept step's tok/s and position
    top.bar(0, level, color="#4c72b0", width=0.6)
    top.annotate(f"{level:,.0f}", (0, level), ha="center", va="bottom", fontsize=8)
    for i, r in enumerate(rows[1:], start=1):
        value = r["out tok/s"]
        if value is None:  # the step did not run: nothing to draw but its name
            top.annotate("did not run", (i, level), ha="center", va="bottom", fontsize=8, color="#c44e52")
            continue
        kept = r["decision"] == KEPT
        colour = ("#55a868" if value >= level else "#c44e52") if kept else "#bbbbbb"
        top.bar(i, value - level, bottom=level, color=colour, width=0.6, hatch=None if kept else "//")
        delta = r["Δ tok/s %"]
        text = f"{value:,.0f}" + ("" if delta is None else f"\n{delta:+.0f}%")
        top.annotate(text, (i, max(value, level)), ha="center", va="bottom", fontsize=8)
        top.plot([last, i], [level, level], color="#555555", linewidth=0.8, linestyle=":")
        if kept:
            level, last = value, i
    top.set_ylabel("output tok/s")
    top.set_title("Each step against the last kept one (grey, hatched: rolled back, the level stays)", fontsize=10)
    top.grid(axis="y", alpha=0.3)
    top.set_ylim(0, top.get_ylim()[1] * 1.15)
    exact = [r["exact %"] for r in rows]
    agreement = [r["word agreement %"] for r in rows]
    bottom.bar(x, [0 if v is None else v for v in exact], color="#8172b3", width=0.6, label="exact answers %")
    points = [(i, v) for i, v in zip(x, agreement, strict=True) if v is not None]
    if points:
        bottom.plot(*zip(*points, strict=True), "o", color="#dd8452", label="word agreement with the last kept step %")
    for i, r in enumerate(rows):
        if r["decision"] == ROLLED_BACK:
            bottom.annotate("rolled back", (i, 2), ha="center", fontsize=7, color="#c44e52", rotation=90, va="bottom")
    bottom.set_ylim(0, 105)
    bottom.set_ylabel("quality %")
    bottom.legend(fontsize=7, loc="lower left", frameon=False)
    bottom.grid(axis="y", alpha=0.3)
    bottom.set_xticks(list(x), labels, rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig
