"""The verdict a report opens with: per workload, which server to pick under the campaign's SLO.

For every workload (a sweep of loads: concurrency levels or request rates):

- the highest load each server *sustains*: every repeat of that run met the SLO (nearest-rank
  P99 of each bounded metric within its bound, :func:`bakeoff.measure.slo.run_meets_slo`) and none
  of its requests failed;
- the *matched load*: the highest load every server ran at which at least one met the SLO;
- the *best* server there: highest goodput (output tok/s when the SLO sets no bound) among
  those meeting the SLO, its *margin* over the runner-up as a ratio with its interval across
  repeats (:func:`bakeoff.analysis.significance.decide`: win, equivalent within the campaign's
  ``min_effect``, or undecided), and its cost per million output tokens at that load.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from bakeoff.analysis.confidence import Estimate, estimate
from bakeoff.analysis.significance import ALPHA, MIN_EFFECT, Decision, decide, look_alpha, planned_looks
from bakeoff.analysis.thresholds import parse_threshold
from bakeoff.measure.slo import Slo, resolve_slo, run_meets_slo
from bakeoff.results.layout import load_cells
from bakeoff.results.summary import RunSummary

Runs = dict[str, dict[float, list[RunSummary]]]  # server -> load -> one summary per repeat


@dataclass(frozen=True)
class ServerAtLoad:
    server: str
    meets_slo: bool
    figure: Estimate  # goodput (or output tok/s) with its interval
    usd_per_m_tok: float | None


@dataclass(frozen=True)
class WorkloadVerdict:
    workload: str
    axis: str  # "concurrency" or "rate"
    metric: str  # the figure the best server is chosen by
    sustained: dict[str, float | None]  # server -> highest load within the SLO
    matched_load: float | None
    at_load: list[ServerAtLoad]  # every server at the matched load, best first
    best: str | None
    runner_up: str | None
    margin: Decision | None

    @property
    def outcome(self) -> str:
        if self.best is None:
            return "no server met the SLO at any load every server ran"
        if self.runner_up is None:
            return f"{self.best} (the only server meeting the SLO there)"
        if self.margin is None or self.margin.outcome == "undecided":
            return f"undecided between {self.best} and {self.runner_up}: more repeats needed"
        if self.margin.outcome == "equivalent":
            return f"equivalent: {self.best} and {self.runner_up} within ±{self.margin.min_effect:.0%}"
        return f"{self.best} wins"


@dataclass(frozen=True)
class Design:
    """How the campaign's repeats are compared: its margin, the level of each look, whether slots pair."""

    min_effect: float = MIN_EFFECT
    alpha: float = ALPHA  # per look: repeats: auto splits ALPHA over its planned looks
    paired: bool = True  # interleaved repeats: repeat r of every server ran in round r


def _raw(campaign_dir: Path) -> dict[str, object]:
    raw = yaml.safe_load((campaign_dir / "campaign.yaml").read_text()) or {}
    return raw if isinstance(raw, dict) else {}


def campaign_slo(campaign_dir: Path) -> Slo:
    return resolve_slo(Slo.model_validate(_raw(campaign_dir).get("slo") or {}))


def campaign_design(campaign_dir: Path) -> Design:
    """The comparison a campaign's copy asks for (the spec was validated when it ran)."""
    raw = _raw(campaign_dir)
    effect = parse_threshold("min_effect", raw.get("min_effect", MIN_EFFECT), where="")
    alpha = ALPHA
    if raw.get("repeats") == "auto":
        low, high = raw.get("min_repeats", 2), raw.get("max_repeats")
        if isinstance(low, int) and isinstance(high, int):
            alpha = look_alpha(ALPHA, planned_looks(low, high))
    return Design(effect, alpha, raw.get("interleave", True) is not False)


def _bounded(slo: Slo) -> bool:
    return any(v is not None for v in (slo.ttft_ms, slo.ttfa_ms, slo.tpot_ms, slo.e2e_ms))


def _load(summary: RunSummary) -> tuple[str, float] | None:
    wl = summary.workload
    if wl.mode == "closed" and wl.concurrency is not None:
        return "concurrency", float(wl.concurrency)
    if wl.mode == "open" and wl.rate is not None:
        return "rate", float(wl.rate)
    return None


def collect(campaign_dir: Path) -> dict[str, tuple[str, Runs]]:
    """workload -> (load axis, server -> load -> repeats); rehearsals and interrupted runs left out."""
    found: dict[str, tuple[str, Runs]] = {}
    for cell in load_cells(campaign_dir):
        for summary in cell.summaries.values():
            load = _load(summary)
            if load is None or summary.rehearsal or summary.interrupted:
                continue
            axis, value = load
            runs: Runs = found.setdefault(cell.workload, (axis, defaultdict(lambda: defaultdict(list))))[1]
            runs[cell.label][value].append(summary)
    return found


def meets(repeats: list[RunSummary], slo: Slo) -> bool:
    """Every repeat without failures and, where the SLO bounds something, within it."""
    for summary in repeats:
        if summary.requests.failed or summary.requests.ok == 0:
            return False
        if _bounded(slo) and not run_meets_slo(summary, slo):
            return False
    return True


def judge(workload: str, axis: str, runs: Runs, slo: Slo, design: Design | None = None) -> WorkloadVerdict:
    design = design or Design()
    metric = "goodput_req_s" if _bounded(slo) else "output_tok_s"
    sustained = {
        server: max((load for load, reps in by_load.items() if meets(reps, slo)), default=None)
        for server, by_load in sorted(runs.items())
    }
    common = set.intersection(*(set(by_load) for by_load in runs.values())) if runs else set()
    passing = [load for load in common if any(meets(by_load[load], slo) for by_load in runs.values())]
    matched = max(passing, default=None)
    if matched is None:
        return WorkloadVerdict(workload, axis, metric, sustained, None, [], None, None, None)
    at_load = [
        ServerAtLoad(server, meets(by_load[matched], slo), estimate(by_load[matched], metric), _cost(by_load[matched]))
        for server, by_load in runs.items()
    ]
    at_load.sort(key=lambda s: (not s.meets_slo, -(s.figure.value or 0.0)))
    contenders = [s for s in at_load if s.meets_slo]
    best = contenders[0].server
    runner = contenders[1].server if len(contenders) > 1 else None
    margin = None
    if runner is not None:
        margin = versus(contenders[0].figure, contenders[1].figure, "higher", design)
    return WorkloadVerdict(workload, axis, metric, sustained, matched, at_load, best, runner, margin)


def versus(a: Estimate, b: Estimate, better: Literal["higher", "lower"], design: Design) -> Decision:
    """``a`` against ``b`` over their repeats, paired by round where the campaign interleaved and both know it."""
    paired = design.paired and bool(a.by_slot) and bool(b.by_slot)
    return decide(
        a.by_slot if paired else a.values,
        b.by_slot if paired else b.values,
        better,
        paired=paired,
        min_effect=design.min_effect,
        alpha=design.alpha,
    )


def _cost(repeats: list[RunSummary]) -> float | None:
    costs = [s.cost.usd_per_million_output_tokens for s in repeats if s.cost is not None]
    known = [c for c in costs if c is not None]
    return sum(known) / len(known) if known else None


def verdicts(campaign_dir: Path) -> list[WorkloadVerdict]:
    slo, design = campaign_slo(campaign_dir), campaign_design(campaign_dir)
    return [judge(wl, axis, runs, slo, design) for wl, (axis, runs) in sorted(collect(campaign_dir).items())]


# --- rendering ------------------------------------------------------------------------------

_FIGURES: tuple[tuple[str, str, str | None], ...] = (
    ("output tok/s", "output_tok_s", None),
    ("goodput req/s", "goodput_req_s", None),
    ("TTFT P50 ms", "ttft_ms", "p50"),
    ("TTFT P99 ms", "ttft_ms", "p99"),
    ("TPOT P50 ms", "tpot_ms", "p50"),
    ("TPOT P99 ms", "tpot_ms", "p99"),
)
# Shown where some run has them: a reasoning model's answer latency, and measured energy.
_REASONING_FIGURES: tuple[tuple[str, str, str | None], ...] = (
    ("TTFA P50 ms", "ttfa_ms", "p50"),
    ("TTFA P99 ms", "ttfa_ms", "p99"),
)
_ENERGY_FIGURES: tuple[tuple[str, str, str | None], ...] = (("J / output token", "j_per_output_token", None),)


def _figures(summaries: list[RunSummary]) -> tuple[tuple[str, str, str | None], ...]:
    figures = _FIGURES
    if any(s.tokens.reasoning for s in summaries):
        figures += _REASONING_FIGURES
    if any(s.energy is not None and s.energy.joules is not None for s in summaries):
        figures += _ENERGY_FIGURES
    return figures


def _load_text(axis: str, load: float | None) -> str:
    if load is None:
        return "none"
    return f"concurrency {load:g}" if axis == "concurrency" else f"{load:g} req/s"


def markdown(found: list[WorkloadVerdict], slo: Slo) -> str:
    """The verdict section: one block per workload, each figure with its interval and n."""
    if not found:
        return "No sweep (concurrency levels or request rates) to judge: no verdict."
    named = (("TTFT ms", slo.ttft_ms), ("TTFA ms", slo.ttfa_ms), ("TPOT ms", slo.tpot_ms), ("E2E ms", slo.e2e_ms))
    bounds = ", ".join(f"{k} ≤ {v:g}" for k, v in named if v)
    lines = [
        f"SLO: {bounds or 'none set (every request must succeed)'}, judged on nearest-rank P99 per run, every "
        "repeat. Figures: mean over repeats [95% Student-t interval] (n = repeats). Margins: the ratio of the "
        "two servers' figures as a % change [95% interval], by Welch's t on log values (paired by round where "
        "repeats interleave); a win is significant and at least the campaign's min_effect, equivalent lies "
        "wholly within ±min_effect, else undecided.",
    ]
    for v in found:
        lines += ["", f"**{v.workload}** — {v.outcome}"]
        if v.matched_load is not None:
            lines.append(
                f"- matched load: {_load_text(v.axis, v.matched_load)}; chosen by {v.metric.replace('_', ' ')}"
            )
        if v.margin is not None and v.runner_up is not None:
            lines.append(f"- margin of {v.best} over {v.runner_up} ({v.metric.replace('_', ' ')}): {v.margin.text()}")
        for s in v.at_load:
            cost = f", ${s.usd_per_m_tok:,.3f} per M output tokens" if s.usd_per_m_tok is not None else ""
            within = "meets the SLO" if s.meets_slo else "misses the SLO"
            lines.append(f"- {s.server}: {s.figure.text(2)}, {within}{cost}")
        sustained = "; ".join(f"{srv} {_load_text(v.axis, load)}" for srv, load in v.sustained.items())
        lines.append(f"- highest load sustained within the SLO: {sustained}")
    return "\n".join(lines)


def figures_table(campaign_dir: Path) -> list[dict[str, object]]:
    """Rows (workload, server, run) x every headline figure as 'mean [lo, hi] (n)' or why it is unsupported."""
    rows: list[dict[str, object]] = []
    for wl, (axis, runs) in sorted(collect(campaign_dir).items()):
        figures = _figures([s for by_load in runs.values() for reps in by_load.values() for s in reps])
        for server, by_load in sorted(runs.items()):
            for load, repeats in sorted(by_load.items()):
                row: dict[str, object] = {"workload": wl, "server": server, axis: load}
                for label, metric, stat in figures:
                    row[label] = estimate(repeats, metric, stat).text(1)  # type: ignore[arg-type]
                rows.append(row)
    return rows
