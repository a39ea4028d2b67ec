"""The report of a ``bakeoff tune``: trials, search trace, Pareto plot, picks and both verdicts.

Written from the tune's result (``tune.json``, :mod:`bakeoff.campaign.tune`) into its folder:

- ``tune.md``: the budget every group got, the verdict *tuned vs tuned* beside the verdict
  *as given* (the untuned starts), each group's pick against its untuned start, its
  finalists with intervals over their repeats, the rejected trials, and the trial table
  (knobs, figure, SLO met, quality, time, state);
- ``trials.csv``: the trial table for a spreadsheet;
- ``trace.png``: each group's objective per trial and its running best;
- ``pareto.png``: every trial's output tok/s per GPU against tok/s per user, one colour per
  group, rejected trials crossed out, picks ringed.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from bakeoff.analysis.tune_compare import interval
from bakeoff.report.plots import server_palette

REPORT_FILE = "tune.md"


def _interval(values: list[float]) -> str:
    if not values:
        return "-"
    mean = float(np.mean(values))
    found = interval(values)
    if found is None:
        return f"{mean:,.3g} (n=1)"
    return f"{mean:,.3g} [{found[0]:,.3g}, {found[1]:,.3g}] (n={len(values)})"


def _knobs(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "as written"


def _verdict_lines(result: dict[str, Any], key: str, what: str) -> list[str]:
    found = result[key]
    if found["best"] is None:
        return [f"- {what}: nothing to compare"]
    if not found["against"]:
        return [f"- {what}: {found['best']} (the only group)"]
    lines = []
    for other in found["against"]:
        change = f"{other['change']:+.1%}" if other["change"] is not None else "?"
        verb = {"win": "beats", "loss": "loses to", "equivalent": "matches"}.get(other["outcome"], "is not told from")
        lines.append(f"- {what}: {found['best']} {verb} {other['group']} ({change}; {other['text']})")
    return lines


def markdown(result: dict[str, Any]) -> str:
    b = result["budget"]
    time_budget = f", at most {b['time_budget_s']:g} s" if b["time_budget_s"] else ""
    figure = result["figure"].replace("_", " ")
    lines = [
        f"# Tune of {result['campaign']}",
        "",
        f"Objective: **{result['objective']}** on workload {result['workload']} at load {result['load']:g}; "
        f"figure compared: {figure}; SLO {result['slo'] or 'none'}.",
        f"Budget per group (the same for every group): {b['trials']} trials{time_budget}; "
        f"pruning from a short probe {'on' if b['prune'] else 'off'}; the best {b['finalists']} finalists and "
        f"the untuned start re-measured {b['repeats']} times. A difference counts when the test says win/loss "
        f"and it is at least {result['min_effect']:.0%}. Took {result['seconds']:,.0f} s.",
        "",
        "## Verdicts",
        "",
        *_verdict_lines(result, "tuned", "tuned vs tuned"),
        *_verdict_lines(result, "as_given", "as given"),
    ]
    for g in result["groups"]:
        chosen, untuned = g["chosen"], g["untuned"]
        lines += ["", f"## {g['group']} ({g['backend']})", ""]
        lines.append(f"Searched (cost order): {', '.join(g['searched'])}; {g['spent_s']:,.0f} s of trials.")
        vs = g["vs_untuned"]
        if chosen["trial"] is None:
            why = f" ({vs['text']})" if vs else ""
            lines.append(f"**Pick: the untuned start** — no finalist won against it{why}.")
        else:
            lines.append(f"**Pick: trial {chosen['trial']}** ({_knobs(chosen['knobs'])}): {vs['text'] if vs else ''}")
        lines += ["", "| configuration | knobs | figure over repeats |", "|---|---|---|"]
        lines.append(f"| untuned | {_knobs(untuned['knobs'])} | {_interval(untuned['values'])} |")
        for c in g["finalists"]:
            lines.append(f"| trial {c['trial']} | {_knobs(c['knobs'])} | {_interval(c['values'])} |")
        if g["vs_runner_up"]:
            lines.append(f"\nBest finalist against the next: {g['vs_runner_up']['text']}")
        rejected = [t for t in g["trials"] if t["state"] == "rejected"]
        if rejected:
            lines += ["", "Rejected by the quality gate:"]
            lines += [f"- trial {t['number']} ({_knobs(t['knobs'])}): {t['quality']}" for t in rejected]
        lines += ["", "| trial | " + " | ".join(g["searched"]) + " | figure | SLO met | quality | s | state |"]
        lines.append("|" + "---|" * (len(g["searched"]) + 6))
        for t in g["trials"]:
            f = t["figures"]
            value = f.get("figure")
            cells = [str(t["knobs"].get(k)) for k in g["searched"]]
            slo = {True: "yes", False: "no"}.get(f.get("slo_met"), "-")
            shown = f"{value:,.3g}" if isinstance(value, int | float) else "-"
            shown += " (probe)" if t["state"] == "pruned" else " (n=1)"
            lines.append(
                f"| {t['number']} | " + " | ".join(cells) + f" | {shown} | {slo} | {t['quality']} | "
                f"{t['seconds'] or 0:,.0f} | {t['state']}: {t['note']} |"
            )
    lines += ["", "![search trace](trace.png)", "", "![trials on the Pareto plot](pareto.png)", ""]
    return "\n".join(lines)


def write_csv(result: dict[str, Any], path: Path) -> None:
    knobs = sorted({k for g in result["groups"] for k in g["searched"]})
    figures = ["figure", "slo_met", "output_tok_s", "tok_s_per_gpu", "tok_s_per_user", "ttft_ms_p99", "tpot_ms_p50"]
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["group", "trial", "label", "state", *knobs, *figures, "quality", "seconds", "note"])
        for g in result["groups"]:
            for t in g["trials"]:
                f = t["figures"]
                row = [g["group"], t["number"], t["label"], t["state"], *(t["knobs"].get(k, "") for k in knobs)]
                out.writerow([*row, *(f.get(k, "") for k in figures), t["quality"], t["seconds"], t["note"]])


def plots(result: dict[str, Any], out: Path) -> None:
    """``trace.png`` and ``pareto.png`` beside the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = server_palette(g["group"] for g in result["groups"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in result["groups"]:
        rows = [t for t in g["trials"] if t["values"]]
        xs = [t["number"] for t in rows]
        ys = [t["values"][0] for t in rows]
        ax.scatter(xs, ys, color=palette[g["group"]], label=g["group"], s=18)
        if ys:
            ax.step(xs, np.maximum.accumulate(ys), where="post", color=palette[g["group"]], alpha=0.6)
    ax.set_xlabel("trial")
    ax.set_ylabel(f"objective ({result['objective']})")
    ax.set_title("search trace: each trial and the running best")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "trace.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for g in result["groups"]:
        colour = palette[g["group"]]
        for t in g["trials"]:
            f = t["figures"]
            x, y = f.get("tok_s_per_user"), f.get("tok_s_per_gpu")
            if x is None or y is None:
                continue
            marker = "x" if t["state"] == "rejected" else "o"
            ax.scatter([x], [y], color=colour, marker=marker, s=22, alpha=0.8)
            if t["number"] == g["chosen"]["trial"]:
                ax.scatter([x], [y], facecolors="none", edgecolors="black", s=120)
        ax.scatter([], [], color=colour, label=g["group"])
    ax.scatter([], [], color="grey", marker="x", label="rejected (quality)")
    ax.set_xlabel("tok/s per user (1000 / TPOT P50)")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title("every trial; the pick ringed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=110)
    plt.close(fig)


def write(out: Path, result: dict[str, Any]) -> Path:
    """The whole tune report into ``out``; returns ``tune.md``."""
    (out / REPORT_FILE).write_text(markdown(result))
    write_csv(result, out / "trials.csv")
    plots(result, out)
    return out / REPORT_FILE
