"""The report's first screen: the question, the answer per load, one chart, and what to try next.

A reader who stops after one screen leaves with the decision: which server to pick at each load
the campaign measured (the winner, its margin over the runner-up with the interval, and how sure
the verdict is), the headline chart of the ranked figure with its intervals, and the next knob to
turn (:mod:`bakeoff.analysis.advisor`). Everything else in the report is the evidence for it.

The screen is one self-contained HTML block (the chart embedded as a PNG data URI) whose parts
carry ids, so a browser test can check they sit above the fold: ``bakeoff-decision``,
``bakeoff-answer``, ``bakeoff-headline-chart``, ``bakeoff-next``.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakeoff.analysis import verdict
from bakeoff.analysis.advisor import advise
from bakeoff.analysis.significance import Decision
from bakeoff.analysis.verdict import LevelVerdict, WorkloadVerdict
from bakeoff.measure.load_modes import load_text
from bakeoff.report.outcomes import energy_unmeasured
from bakeoff.report.plots import server_palette
from bakeoff.results.layout import is_rehearsal, read_campaign_copy

IDS = ("bakeoff-decision", "bakeoff-answer", "bakeoff-headline-chart", "bakeoff-next")


@dataclass(frozen=True)
class Answer:
    """One load's answer: who to pick, by how much over the runner-up, and how sure."""

    workload: str
    load: str
    pick: str
    margin: str
    sure: str


def _load_text(v: WorkloadVerdict, load: float) -> str:
    return load_text(v.axis, load)


def _inverse(d: Decision) -> str:
    """``d`` is runner-up / best: the best's lead over the runner-up, as a % change with its interval."""
    if d.ratio is None:
        return "no ratio"
    point = f"{1 / d.ratio - 1:+.0%}"
    if d.lo and d.hi:
        return f"{point} [{1 / d.hi - 1:+.0%}, {1 / d.lo - 1:+.0%}]"
    return point


def _sure(level: LevelVerdict, d: Decision | None) -> str:
    repeats = min((s.figure.repeats for s in level.contenders), default=0)
    if d is None:
        return f"{repeats} repeat(s); nothing to compare against"
    held = f"false-win rate held at {d.alpha:.0%}" if d.family is None else "family-wise false-win rate held"
    if d.decided:
        noise = f", noise {d.noise:.0%}" if d.noise is not None else ""
        return f"decided: {repeats} repeats{noise}, {held}"
    return f"not decided: {d.evidence() or d.why or 'too few repeats'}"


def answers(found: list[WorkloadVerdict]) -> list[Answer]:
    """One row per workload and load: the winner, the margin over the runner-up, and how sure."""
    rows = []
    for v in found:
        for load, level in v.levels.items():
            where = _load_text(v, load)
            contenders = level.contenders
            if not contenders:
                rows.append(Answer(v.workload, where, "no server met the SLO", "", ""))
                continue
            best = contenders[0]
            runner = contenders[1] if len(contenders) > 1 else None
            d = runner.against_best if runner is not None else None
            pick = level.winner or level.outcome()
            if runner is None or d is None:
                margin = "the only server within the SLO" if runner is None else "no test"
            elif d.outcome == "equivalent":
                margin = f"{best.server} vs {runner.server}: within ±{level.min_effect:.0%}"
            else:
                margin = f"{best.server} {_inverse(d)} over {runner.server}"
            rows.append(Answer(v.workload, where, pick, margin, _sure(level, d)))
    return rows


def question(campaign_dir: Path, found: list[WorkloadVerdict]) -> str:
    """The question the campaign asks, in words: which server, on what, ranked by what, under what SLO."""
    campaign = read_campaign_copy(campaign_dir)
    servers = [s.name for s in campaign.servers]
    model = campaign.model if isinstance(campaign.model, dict) else {"path": campaign.model or "the model"}
    named = model.get("preset") or model.get("served_name") or Path(str(model.get("path", "the model"))).name
    unit = found[0].unit if found else "throughput"
    slo = verdict.campaign_slo(campaign_dir)
    bounds = [f"{k} ≤ {v:g} ms" for k, v in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms)) if v]
    within = f" within the SLO ({', '.join(bounds)})" if bounds else ""
    if found and all(v.agentic for v in found):  # judged by tasks: the task SLO is the question's bound
        tasks = sorted({f"P90 task completion ≤ {v.task_slo_s:g} s" for v in found if v.task_slo_s is not None})
        within = f" within the task SLO ({', '.join(tasks)})" if tasks else ""
    return f"Which of {', '.join(servers)} serves `{named}` with the most {unit}{within}, at each load measured?"


def repeat_design(campaign_dir: Path) -> str | None:
    """How repeats spent their engine starts (``warm_repeats``), as the campaign ran, or None when cold."""
    if not read_campaign_copy(campaign_dir).warm_repeats:
        return None
    return "Repeats on one warm start; cold start measured once per server."


# The first screen's chart holds this many workloads side by side; the rest are in the answer
# table beside it and the verdict below (more panels would shrink each below reading size).
HEADLINE_PANELS = 3


def headline_figure(found: list[WorkloadVerdict]) -> Any:
    """The ranked figure per server at each load, one panel per workload (its own unit and scale:
    a chat load's req/s and a long-prompt load's differ several-fold), with the 95% intervals."""
    import matplotlib.pyplot as plt  # deferred: plotting loads in seconds

    shown = found[:HEADLINE_PANELS]
    servers = sorted({s.server for v in shown for lv in v.levels.values() for s in lv.standings})
    colours = server_palette(servers)
    fig, axes = plt.subplots(1, len(shown), figsize=(6.4, 3.2), dpi=90, squeeze=False)
    for ax, v in zip(axes[0], shown, strict=True):
        _panel(ax, v, servers, colours, legend=ax is axes[0][0])
    more = f"; {len(found) - len(shown)} more workload(s) in the table" if len(found) > len(shown) else ""
    fig.suptitle(f"Mean over repeats [95% interval]; hatched: misses the SLO{more}", fontsize=9)
    fig.tight_layout()
    return fig


def _panel(ax: Any, v: WorkloadVerdict, servers: list[str], colours: dict[str, Any], *, legend: bool) -> None:
    """One workload's bars: a group per load, a bar per server."""
    loads = list(v.levels)
    width = 0.8 / max(len(servers), 1)
    for i, server in enumerate(servers):
        for j, load in enumerate(loads):
            s = next((s for s in v.levels[load].standings if s.server == server), None)
            if s is None or s.figure.value is None:
                continue
            x = j + (i - (len(servers) - 1) / 2) * width
            lo = s.figure.value - (s.figure.lo if s.figure.lo is not None else s.figure.value)
            hi = (s.figure.hi if s.figure.hi is not None else s.figure.value) - s.figure.value
            ax.bar(
                x,
                s.figure.value,
                width,
                color=colours[server],
                label=server if j == 0 else None,
                hatch=None if s.meets_slo else "//",
                yerr=[[lo], [hi]],
                capsize=3,
            )
    ax.set_xticks(range(len(loads)), [_load_text(v, load) for load in loads], fontsize=8)
    ax.set_ylabel(v.unit, fontsize=8)
    ax.set_title(v.workload, fontsize=9)
    if legend:
        ax.legend(fontsize=7, frameon=False)


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _next(campaign_dir: Path) -> str:
    lines = advise(campaign_dir).markdown()
    first = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(lines[0]).replace("**", "")).rstrip(".")
    more = f" (and {len(lines) - 1} more under Tuning advice)" if len(lines) > 1 else ""
    return f"{first}{more} — <code>bakeoff advise {html.escape(str(campaign_dir))}</code> writes the campaign."


def first_screen(campaign_dir: Path) -> str:
    """The decision as HTML: question, answer table, headline chart and next step, side by side."""
    if is_rehearsal(campaign_dir):
        return (
            '<section id="bakeoff-decision"><p id="bakeoff-answer"><b>Rehearsal: no decision.</b> Every server was '
            "a reference-server stand-in; the campaign decides when it runs on the real host.</p></section>"
        )
    found = verdict.verdicts(campaign_dir)
    rows = answers(found)
    table = "".join(
        f"<tr><td>{html.escape(r.workload)}, {html.escape(r.load)}</td>"
        f"<td><b>{html.escape(r.pick)}</b></td><td>{html.escape(r.margin)}</td><td>{html.escape(r.sure)}</td></tr>"
        for r in rows
    )
    answer = (
        '<table id="bakeoff-answer"><thead><tr><th>load</th><th>pick</th><th>margin over the runner-up</th>'
        f"<th>how sure</th></tr></thead><tbody>{table}</tbody></table>"
        if rows
        else '<p id="bakeoff-answer">No sweep (concurrency levels or request rates) to judge: no verdict.</p>'
    )
    chart = (
        f'<img id="bakeoff-headline-chart" alt="headline chart" style="max-width:100%" '
        f'src="data:image/png;base64,{_png(headline_figure(found))}">'
        if found
        else ""
    )
    notes = [n for n in (repeat_design(campaign_dir), energy_unmeasured(campaign_dir)) if n]
    small = "".join(f'<p style="font-size:90%;margin:2px 0">{html.escape(n)}</p>' for n in notes)
    return (
        '<section id="bakeoff-decision"><style>#bakeoff-answer th, #bakeoff-answer td '
        "{text-align: left; vertical-align: top}</style>"
        f"<h2>The decision</h2><p><b>Question.</b> {html.escape(question(campaign_dir, found))}</p>"
        '<div style="display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap">'
        f'<div style="flex:1 1 560px">{answer}{small}</div><div style="flex:0 1 580px">{chart}</div></div>'
        f'<p id="bakeoff-next"><b>What to try next.</b> {_next(campaign_dir)}</p>'
        "</section>"
    )
