"""The report of a ``bakeoff tune``: trials, search trace, Pareto plot, picks and both verdicts.

Written from the tune's result (``tune.json``, :mod:`bakeoff.campaign.tune`) into its folder:

- ``tune.md``: the budget every group got, the verdict *tuned vs tuned* beside the verdict
  *as given* (the untuned starts), each group's pick against its untuned start, its
  finalists with intervals over their repeats, the rejected trials, and the trial table
  (knobs, figure, SLO met, quality, time, state);
- ``trials.csv``: the trial table for a spreadsheet;
- ``trace.png``: each group's objective per trial and its running best;
- ``pareto.png``: every trial's output tok/s per GPU against tok/s per user, one colour per
  group, rejected trials crossed out, picks ringed, each group's untuned start a star.

Where no configuration of a group met the SLO at the load (goodput 0 in every trial), the
report says so at its head with the fixes a serving engineer would take and the configuration
that came closest; the trial table shows each trial's SLO miss. The untuned start is the
first row of each group's trial table (and of ``trials.csv``). A
rehearsal's report (``bakeoff tune --rehearse``) says REHEARSAL at its head, on every section
and on both plots, and renders its verdicts and picks as what ran, never as a finding: the
figures are reference-server stand-ins'.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from bakeoff.analysis.tune_compare import interval
from bakeoff.report.plots import server_palette
from bakeoff.results.layout import REHEARSAL_BANNER, REHEARSAL_TAG

REPORT_FILE = "tune.md"
NOT_JUDGED = "not judged: a rehearsal's figures are reference-server stand-ins', not the frameworks'"


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
    if result.get("rehearsal"):  # the test ran on stand-ins; its outcome is no claim about anyone
        groups = ", ".join([found["best"], *(o["group"] for o in found["against"])])
        return [f"- {what} ({groups}): {NOT_JUDGED}"]
    lines = []
    for other in found["against"]:
        # A comparison decided on how often the SLO was reached has no ratio to show.
        change = f"{other['change']:+.1%}; " if other["change"] is not None else ""
        verb = {"win": "beats", "loss": "loses to", "equivalent": "matches"}.get(other["outcome"], "is not told from")
        lines.append(f"- {what}: {found['best']} {verb} {other['group']} ({change}{other['text']})")
    return lines


def _nothing_met_lines(result: dict[str, Any]) -> list[str]:
    """The head's warning where a group met the SLO nowhere: what was compared instead, the fixes, the closest."""
    missed = [g for g in result["groups"] if g.get("nothing_met")]
    if not missed:
        return []
    where = "any group" if len(missed) == len(result["groups"]) else ", ".join(g["group"] for g in missed)
    fix = (
        "add lower levels to the workload's sweep, or relax the SLO (`slo:`)"
        if result["objective"] == "max_load"
        else f"lower the tuned load (`tune.load:`, now {result['load']:g}), relax the SLO (`slo:`), "
        "or tune for `objective: max_load` (the highest load within the SLO)"
    )
    lines = [
        f"> **No configuration met the SLO at this load** in {where}: goodput was 0 in every trial, so the "
        "search ranked the trials, and the pick and the verdicts compared them, by how far each missed it "
        "(the largest median TTFT/TPOT against its bound). To tune for goodput: " + fix + ".",
    ]
    for g in missed:
        closest = g["nothing_met"]
        which = "the untuned start" if closest["trial"] is None else f"trial {closest['trial']}"
        knobs = f" ({_knobs(closest['knobs'])})" if closest["label"] else ""
        lines.append(f"> - closest in {g['group']}: {which}{knobs}, {closest['text']}")
    return [*lines, ""]


def _slo_cell(f: dict[str, Any]) -> str:
    """The trial table's SLO column: met or not, and by how much the median missed where no request met it."""
    met = f.get("slo_met")
    if met is False and not f.get("figure") and f.get("slo_miss_text"):
        return f"no: {f['slo_miss_text']}"
    return "yes" if met is True else "no" if met is False else "-"


def _trial_row(t: dict[str, Any], searched: list[str]) -> str:
    f = t["figures"]
    value = f.get("figure")
    cells = [str(t["knobs"].get(k)) for k in searched]
    slo = _slo_cell(f)
    shown = f"{value:,.3g}" if isinstance(value, int | float) else "-"
    shown += " (probe)" if t["state"] == "pruned" else " (n=1)"
    number = "untuned" if t["number"] is None else str(t["number"])
    seconds = "-" if t["seconds"] is None else f"{t['seconds']:,.0f}"
    return (
        f"| {number} | " + " | ".join(cells) + f" | {shown} | {slo} | {t['quality']} | {seconds} | "
        f"{t['state']}: {t['note']} |"
    )


def _pick_line(g: dict[str, Any], rehearsal: bool) -> str:
    chosen, vs = g["chosen"], g["vs_untuned"]
    if rehearsal:
        which = "the untuned start" if chosen["trial"] is None else f"trial {chosen['trial']}"
        return f"Pick on stand-ins' figures: {which} ({_knobs(chosen['knobs'])}); {NOT_JUDGED}."
    if chosen["trial"] is None:
        why = f" ({vs['text']})" if vs else ""
        return f"**Pick: the untuned start** — no finalist won against it{why}."
    return f"**Pick: trial {chosen['trial']}** ({_knobs(chosen['knobs'])}): {vs['text'] if vs else ''}"


def markdown(result: dict[str, Any]) -> str:
    b = result["budget"]
    time_budget = f", at most {b['time_budget_s']:g} s" if b["time_budget_s"] else ""
    figure = result["figure"].replace("_", " ")
    rehearsal = result.get("rehearsal")
    tag = f"{REHEARSAL_TAG} " if rehearsal else ""
    lines = [f"# {tag}Tune of {result['campaign']}", ""]
    if rehearsal:
        lines += [f"> {REHEARSAL_BANNER}", ">", f"> Campaign: `{rehearsal['source_campaign']}` (scaled down).", ""]
    lines += _nothing_met_lines(result)
    lines += [
        f"Objective: **{result['objective']}** on workload {result['workload']} at load {result['load']:g}; "
        f"figure compared: {figure}; SLO {result['slo'] or 'none'}.",
        f"Budget per group (the same for every group): {b['trials']} trials{time_budget}; "
        f"pruning from a short probe {'on' if b['prune'] else 'off'}; the best {b['finalists']} finalists and "
        f"the untuned start re-measured {b['repeats']} times. A difference counts when the test says win/loss "
        f"and it is at least {result['min_effect']:.0%}. Took {result['seconds']:,.0f} s.",
        "",
        f"## {tag}Verdicts",
        "",
        *_verdict_lines(result, "tuned", "tuned vs tuned"),
        *_verdict_lines(result, "as_given", "as given"),
    ]
    for g in result["groups"]:
        untuned = g["untuned"]
        lines += ["", f"## {tag}{g['group']} ({g['backend']})", ""]
        lines.append(f"Searched (cost order): {', '.join(g['searched'])}; {g['spent_s']:,.0f} s of trials.")
        if g.get("nothing_met"):
            lines.append(f"No configuration met the SLO at this load; closest: {g['nothing_met']['text']}.")
        lines.append(_pick_line(g, bool(rehearsal)))
        # Where nothing met the SLO the figures are zeros: the miss over the repeats is what was compared.
        miss = bool(g.get("nothing_met"))
        head = "| configuration | knobs | figure over repeats |" + (" SLO miss over repeats |" if miss else "")
        lines += ["", head, "|---|---|---|" + ("---|" if miss else "")]
        for name, c in [("untuned", untuned), *((f"trial {c['trial']}", c) for c in g["finalists"])]:
            misses = f" {_interval(c.get('misses', []))} |" if miss else ""
            lines.append(f"| {name} | {_knobs(c['knobs'])} | {_interval(c['values'])} |{misses}")
        if g["vs_runner_up"] and not rehearsal:
            lines.append(f"\nBest finalist against the next: {g['vs_runner_up']['text']}")
        rejected = [t for t in g["trials"] if t["state"] == "rejected"]
        if rejected:
            lines += ["", "Rejected by the quality gate:"]
            lines += [f"- trial {t['number']} ({_knobs(t['knobs'])}): {t['quality']}" for t in rejected]
        lines += ["", "| trial | " + " | ".join(g["searched"]) + " | figure | SLO met | quality | s | state |"]
        lines.append("|" + "---|" * (len(g["searched"]) + 6))
        lines += [_trial_row(t, g["searched"]) for t in _with_untuned(g)]
    if rehearsal and rehearsal.get("gpu_host"):
        lines += ["", f"## {tag}On the GPU host", "", "```", rehearsal["gpu_host"], "```"]
    lines += ["", "![search trace](trace.png)", "", "![trials on the Pareto plot](pareto.png)", ""]
    return "\n".join(lines)


def _with_untuned(g: dict[str, Any]) -> list[dict[str, Any]]:
    """The group's trial rows, its untuned start first (a tune from before it was kept has none)."""
    first = g.get("untuned_trial")
    return [first, *g["trials"]] if first else list(g["trials"])


def write_csv(result: dict[str, Any], path: Path) -> None:
    knobs = sorted({k for g in result["groups"] for k in g["searched"]})
    figures = [
        "figure", "slo_met", "slo_miss", "slo_miss_text", "output_tok_s", "tok_s_per_gpu", "tok_s_per_user",
        "ttft_ms_p99", "tpot_ms_p50",
    ]  # fmt: skip
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["group", "trial", "label", "state", *knobs, *figures, "quality", "seconds", "note"])
        for g in result["groups"]:
            for t in _with_untuned(g):
                f = t["figures"]
                number = "untuned" if t["number"] is None else t["number"]
                row = [g["group"], number, t["label"], t["state"], *(t["knobs"].get(k, "") for k in knobs)]
                out.writerow([*row, *(f.get(k, "") for k in figures), t["quality"], t["seconds"], t["note"]])


def plots(result: dict[str, Any], out: Path) -> None:
    """``trace.png`` and ``pareto.png`` beside the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = server_palette(g["group"] for g in result["groups"])
    tag = "REHEARSAL (stand-ins, not measured): " if result.get("rehearsal") else ""
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in result["groups"]:
        rows = [t for t in g["trials"] if t["values"]]
        xs = [t["number"] for t in rows]
        ys = [t["values"][0] for t in rows]
        ax.scatter(xs, ys, color=palette[g["group"]], label=g["group"], s=18)
        if ys:
            ax.step(xs, np.maximum.accumulate(ys), where="post", color=palette[g["group"]], alpha=0.6)
        start = g.get("untuned_trial")
        if start and start["values"]:
            ax.axhline(start["values"][0], color=palette[g["group"]], linestyle=":", linewidth=1)
    ax.plot([], [], color="grey", linestyle=":", label="untuned start")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"objective ({result['objective']}; below 0: SLO missed, by how far)")
    ax.set_title(f"{tag}search trace: each trial and the running best")
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
        start = (g.get("untuned_trial") or {}).get("figures", {})
        x, y = start.get("tok_s_per_user"), start.get("tok_s_per_gpu")
        if x is not None and y is not None:
            ax.scatter([x], [y], color=colour, marker="*", s=160, edgecolors="black", linewidths=0.6, zorder=3)
            ax.annotate("untuned", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=7)
            if g["chosen"]["trial"] is None:  # the untuned start kept as the pick
                ax.scatter([x], [y], facecolors="none", edgecolors="black", s=260)
        ax.scatter([], [], color=colour, label=g["group"])
    ax.scatter([], [], color="grey", marker="x", label="rejected (quality)")
    ax.scatter([], [], color="grey", marker="*", s=80, label="untuned start")
    ax.set_xlabel("tok/s per user (1000 / TPOT P50)")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title(f"{tag}every trial; the pick ringed")
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
