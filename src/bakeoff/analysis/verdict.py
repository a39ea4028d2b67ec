"""The verdict a report opens with: which server, and which framework, to pick for which load.

For every workload (a sweep of loads: concurrency levels or request rates):

- the highest load each server *sustains*: every repeat of that run met the SLO (nearest-rank
  P99 of each bounded metric within its bound, :func:`bakeoff.measure.slo.run_meets_slo`) and none
  of its requests failed;
- at *every* load every server ran (a load regime), the whole ranking: the best server there
  (highest goodput, or output tok/s when the SLO sets no bound, among those meeting the SLO)
  and every other server's standing against it — *equivalent* within the campaign's
  ``min_effect``, *undecided* (with the difference the repeats could detect and the repeats
  that would decide), or *loses* by X% [interval] — every comparison at the load one family
  held to the campaign's level, the choice of the best included (:mod:`bakeoff.analysis.best`:
  the paired t between two servers, Tukey's range over round-pooled noise among more, a
  Bonferroni-corrected pairwise rule where noise cannot be pooled). The level's *winner* is the
  best server only when it beats every other;
- the *matched load*: the highest load every server ran at which at least one met the SLO,
  the headline of the workload;
- per level, the *framework verdict*: the best configuration of each backend against the best
  of the other backends (a framework is not judged by its worst setting), out of the same
  family, so this second choice adds no false claim;
- the cost per million output tokens of each server at the matched load.

Every margin names its figure and unit (``-18.0% goodput req/s``: a relative change).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from bakeoff.analysis.best import Family, family, level_text
from bakeoff.analysis.confidence import Estimate, estimate, supported_estimate
from bakeoff.analysis.significance import ALPHA, MIN_EFFECT, Decision, look_alpha, planned_looks
from bakeoff.analysis.task_verdict import task_metric, task_run_meets, task_slo, task_slo_text
from bakeoff.analysis.thresholds import parse_threshold
from bakeoff.measure.load_modes import load_axis, load_text
from bakeoff.measure.slo import Slo, resolve_slo, run_meets_slo, slo_pairs
from bakeoff.results.formulas import needed_samples
from bakeoff.results.layout import AUTO_REPEATS, load_cells, read_campaign_copy
from bakeoff.results.metric_table import BY_KEY
from bakeoff.results.store import read_json_or_empty
from bakeoff.results.summary import STAT_LABELS, RunSummary, StatName

Runs = dict[str, dict[float, list[RunSummary]]]  # server -> load -> one summary per repeat


@dataclass(frozen=True)
class Standing:
    """One server at one load: its figure, whether it met the SLO, and how it stands against the best there."""

    server: str
    backend: str
    meets_slo: bool
    figure: Estimate  # goodput (or output tok/s) with its interval
    usd_per_m_tok: float | None
    against_best: Decision | None = None  # this server / the best; None for the best and for SLO misses
    busy: tuple[str, ...] = ()  # repeats measured on a busy host, each with what took the CPU

    def text(self, best: str, unit: str) -> str:
        host = f" ⚠ host busy — {'; '.join(self.busy)}" if self.busy else ""
        if not self.meets_slo:
            return f"{self.server}: misses the SLO ({self.figure.text(2)} {unit}){host}"
        if self.against_best is None:
            return f"{self.server}: {self.figure.text(2)} {unit} — best{host}"
        return f"{self.server}: {self.against_best.text(unit, best)}{host}"


@dataclass(frozen=True)
class LevelVerdict:
    """Every server at one load, best first (those meeting the SLO, by their figure, then the rest)."""

    load: float
    standings: list[Standing]
    min_effect: float
    family: Family | None = None  # how the servers meeting the SLO were compared, at what level, and why

    @property
    def best(self) -> str | None:
        first = self.standings[0] if self.standings else None
        return first.server if first is not None and first.meets_slo else None

    @property
    def contenders(self) -> list[Standing]:
        return [s for s in self.standings if s.meets_slo]

    @property
    def winner(self) -> str | None:
        """The best server when it beats every other one that met the SLO (or is the only one)."""
        others = self.contenders[1:]
        if self.best is None or any(s.against_best is None or s.against_best.outcome != "loss" for s in others):
            return None
        return self.best

    def outcome(self) -> str:
        busy = sum(len(s.busy) for s in self.standings)
        text = self._outcome()
        return f"{text} (unreliable: {busy} run(s) measured on a busy host)" if busy else text

    def _outcome(self) -> str:
        if self.best is None:
            return "no server met the SLO"
        others = self.contenders[1:]
        if not others:
            return f"{self.best} (the only server meeting the SLO there)"
        if self.winner is not None:
            return f"{self.best} wins"
        equal = [s.server for s in others if s.against_best is not None and s.against_best.outcome == "equivalent"]
        unclear = [s.server for s in others if s.against_best is None or s.against_best.outcome != "loss"]
        unclear = [u for u in unclear if u not in equal]
        if not unclear:
            return f"{', '.join([self.best, *equal])} equivalent (within ±{self.min_effect:.0%}), no single winner"
        return f"undecided: {self.best} leads, {', '.join(unclear)} not told apart from it"


@dataclass(frozen=True)
class FrameworkVerdict:
    """At one load: each backend's best configuration against the best backend's."""

    load: float
    best: Standing | None  # the best configuration of the best backend
    others: list[Standing]  # each other backend's best configuration, its against_best vs ``best``
    missing: list[str]  # backends with no configuration meeting the SLO there


@dataclass(frozen=True)
class WorkloadVerdict:
    workload: str
    axis: str  # "concurrency" or "rate"
    metric: str  # the figure servers are ranked by
    sustained: dict[str, float | None]  # server -> highest load within the SLO
    matched_load: float | None
    levels: dict[float, LevelVerdict]  # every load every server ran
    frameworks: dict[float, FrameworkVerdict]  # per load, when servers span two or more backends
    task_slo_s: float | None = None  # agentic workloads: the task SLO their runs were judged on

    @property
    def agentic(self) -> bool:
        return self.axis.startswith("task")

    @property
    def unit(self) -> str:
        row = BY_KEY[self.metric]
        return f"{row.name} {row.unit}" if row.unit not in row.name else row.name

    @property
    def matched(self) -> LevelVerdict | None:
        return self.levels.get(self.matched_load) if self.matched_load is not None else None

    @property
    def best(self) -> str | None:
        return self.matched.best if self.matched is not None else None

    @property
    def outcome(self) -> str:
        if self.matched is None:
            return "no server met the SLO at any load every server ran"
        return self.matched.outcome()


@dataclass(frozen=True)
class Design:
    """How the campaign's repeats are compared: its margin, the level of each look, whether slots pair."""

    min_effect: float = MIN_EFFECT
    alpha: float = ALPHA  # per look: repeats: auto splits ALPHA over its planned looks
    paired: bool = True  # interleaved repeats: repeat r of every server ran in round r


def campaign_slo(campaign_dir: Path) -> Slo:
    return resolve_slo(Slo.model_validate(read_campaign_copy(campaign_dir).slo or {}))


def campaign_design(campaign_dir: Path) -> Design:
    """The comparison a campaign's copy asks for (the spec was validated when it ran)."""
    campaign = read_campaign_copy(campaign_dir)
    written = campaign.min_effect
    effect = parse_threshold("min_effect", MIN_EFFECT if written is None else written, where="")
    alpha = ALPHA
    if campaign.repeats == "auto" and campaign.max_repeats is not None:
        alpha = look_alpha(ALPHA, planned_looks(campaign.min_repeats, campaign.max_repeats))
    return Design(effect, alpha, campaign.interleave)


def _bounded(slo: Slo) -> bool:
    return any(v is not None for v in (slo.ttft_ms, slo.ttfa_ms, slo.tpot_ms, slo.e2e_ms))


def _load(summary: RunSummary) -> tuple[str, float] | None:
    wl = summary.workload
    return load_axis(wl.mode, wl.concurrency, wl.rate)


def collect(campaign_dir: Path) -> tuple[dict[str, tuple[str, Runs]], dict[str, str]]:
    """(workload -> (load axis, server -> load -> repeats), server -> backend); rehearsals, interrupted runs out."""
    found: dict[str, tuple[str, Runs]] = {}
    backends: dict[str, str] = {}
    for cell in load_cells(campaign_dir):
        backends[cell.label] = cell.backend
        for summary in cell.summaries.values():
            load = _load(summary)
            if load is None or summary.rehearsal or summary.interrupted:
                continue
            axis, value = load
            runs: Runs = found.setdefault(cell.workload, (axis, defaultdict(lambda: defaultdict(list))))[1]
            runs[cell.label][value].append(summary)
    return found, backends


def meets(repeats: list[RunSummary], slo: Slo) -> bool:
    """Every repeat without failures and, where the SLO bounds something, within it."""
    for summary in repeats:
        if summary.agent_tasks is not None:  # an agentic run is judged by its tasks (analysis.task_verdict)
            if not task_run_meets(summary):
                return False
            continue
        if summary.requests.failed or summary.requests.ok == 0:
            return False
        if _bounded(slo) and not run_meets_slo(summary, slo):
            return False
    return True


def judge(
    workload: str,
    axis: str,
    runs: Runs,
    slo: Slo,
    design: Design | None = None,
    backends: dict[str, str] | None = None,
) -> WorkloadVerdict:
    design = design or Design()
    backends = backends or {}
    every = [summary for by_load in runs.values() for reps in by_load.values() for summary in reps]
    metric = task_metric(every) or ("goodput_req_s" if _bounded(slo) else "output_tok_s")
    sustained = {
        server: max((load for load, reps in by_load.items() if meets(reps, slo)), default=None)
        for server, by_load in sorted(runs.items())
    }
    common = set.intersection(*(set(by_load) for by_load in runs.values())) if runs else set()
    levels: dict[float, LevelVerdict] = {}
    frameworks: dict[float, FrameworkVerdict] = {}
    for load in sorted(common):
        standings = [
            Standing(
                server,
                backends.get(server, "?"),
                meets(by_load[load], slo),
                estimate(by_load[load], metric),
                _cost(by_load[load]),
                busy=_busy(by_load[load]),
            )
            for server, by_load in sorted(runs.items())
        ]
        standings.sort(key=lambda s: (not s.meets_slo, -(s.figure.value or 0.0)))
        fam = _family(standings, design)
        levels[load] = LevelVerdict(load, _against(standings, fam), design.min_effect, fam)
        if len({s.backend for s in standings}) > 1:
            frameworks[load] = _frameworks(load, standings, fam)
    passing = [load for load, level in levels.items() if level.best is not None]
    matched = max(passing, default=None)
    return WorkloadVerdict(workload, axis, metric, sustained, matched, levels, frameworks, task_slo(every))


def _family(standings: list[Standing], design: Design) -> Family:
    """Every server meeting the SLO at a load, as one family of comparisons at the campaign's level.

    Repeats pair by round where the campaign interleaved and every server's repeats say their round.
    """
    contenders = [s for s in standings if s.meets_slo]
    paired = design.paired and all(s.figure.by_slot for s in contenders)
    samples = {s.server: s.figure.by_slot if paired else s.figure.values for s in contenders}
    return family(samples, "higher", paired=paired, min_effect=design.min_effect, alpha=design.alpha)


def _against(standings: list[Standing], fam: Family) -> list[Standing]:
    """The standings with each SLO-meeting server's decision against the first (the best), within ``fam``."""
    if not standings or not standings[0].meets_slo:
        return standings
    best = standings[0]
    return [best] + [
        replace(s, against_best=fam.versus(s.server, best.server)) if s.meets_slo else s for s in standings[1:]
    ]


def _frameworks(load: float, standings: list[Standing], fam: Family) -> FrameworkVerdict:
    """Each backend's best configuration (standings are best first) against the best backend's.

    A second choice among the same servers: its comparisons are the level's family's, whose
    level covers every pair, so choosing each framework's best adds no false claim.
    """
    firsts: dict[str, Standing] = {}
    for s in standings:
        if s.meets_slo:
            firsts.setdefault(s.backend, replace(s, against_best=None))
    missing = sorted({s.backend for s in standings} - set(firsts))
    tops = list(firsts.values())
    if not tops:
        return FrameworkVerdict(load, None, [], missing)
    ranked = _against(tops, fam)
    return FrameworkVerdict(load, ranked[0], ranked[1:], missing)


def _busy(repeats: list[RunSummary]) -> tuple[str, ...]:
    """The repeats measured on a busy host (:class:`bakeoff.results.summary.HostLoad`), with the reason."""
    return tuple(
        f"repeat {s.workload.repeat}: {s.host.note or 'busy'}" for s in repeats if s.host is not None and s.host.busy
    )


def _cost(repeats: list[RunSummary]) -> float | None:
    costs = [s.cost.usd_per_million_output_tokens for s in repeats if s.cost is not None]
    known = [c for c in costs if c is not None]
    return sum(known) / len(known) if known else None


def verdicts(campaign_dir: Path) -> list[WorkloadVerdict]:
    slo, design = campaign_slo(campaign_dir), campaign_design(campaign_dir)
    found, backends = collect(campaign_dir)
    return [judge(wl, axis, runs, slo, design, backends) for wl, (axis, runs) in sorted(found.items())]


def undecided(found: list[WorkloadVerdict]) -> list[str]:
    """Every comparison not decided yet, as ``workload at load: server vs best`` (what ``repeats: auto`` waits on)."""
    out = []
    for v in found:
        for load, level in v.levels.items():
            for s in level.standings:
                if s.against_best is not None and not s.against_best.decided:
                    out.append(f"{v.workload} at {_load_text(v.axis, load)}: {s.server} vs {level.best}")
    return out


def saturation_notes(campaign_dir: Path) -> list[str]:
    """Where each sweep stopped raising the load and why, with the levels skipped (not missing)."""
    notes = []
    for cell in load_cells(campaign_dir):
        stop = cell.record.saturation
        if stop is None or not stop.skipped:
            continue
        notes.append(
            f"Sweep {cell.workload}, {cell.label} (repeat {cell.repeat}): stopped raising the load after "
            f"{stop.after} ({stop.why}; every server had saturated by that level); skipped, not "
            f"missing: {', '.join(stop.skipped)}."
        )
    return notes


def auto_repeats_note(campaign_dir: Path) -> str | None:
    """How ``repeats: auto`` ended: the rounds it ran and why it stopped; None for fixed repeats."""
    found = read_json_or_empty(campaign_dir / AUTO_REPEATS)
    if not found:
        return None
    note = f"Repeats: auto — {found.get('rounds')} round(s) of at most {found.get('max_repeats')}: {found.get('why')}"
    left = found.get("undecided") or []
    looks = (
        f" Each look held its claims to {level_text(ALPHA)} / the planned looks family-wise, so the level holds "
        f"{level_text(ALPHA)} over every look and every choice of the best made in them."
    )
    return note + (f" (still undecided: {'; '.join(left)})" if left else "") + "." + looks


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
    return "none" if load is None else load_text(axis, load)


def _framework_line(v: WorkloadVerdict, load: float, fw: FrameworkVerdict) -> str:
    where = f"{v.workload}, {_load_text(v.axis, load)}"
    if fw.best is None:
        return f"- {where}: no framework met the SLO"
    parts = [f"{fw.best.backend} ({fw.best.server}) is best by {v.unit}"]
    for s in fw.others:
        d = s.against_best
        if d is None:
            continue
        parts.append(f"{s.backend} ({s.server}) {d.text(v.unit)}")
    parts += [f"{b} misses the SLO" for b in fw.missing]
    return f"- {where}: " + "; ".join(parts)


def slo_basis(campaign_dir: Path, slo: Slo) -> str:
    """What the SLO was judged on: nearest-rank P99, which a run under 100 requests does not support.

    Nearest-rank P99 of fewer than 100 samples is the sample maximum (the slowest request), so
    such a run is judged on its maximum: stricter than a P99, and said so rather than passed off.
    """
    judged = small = 0
    for _wl, (_axis, runs) in collect(campaign_dir)[0].items():
        for by_load in runs.values():
            for repeats in by_load.values():
                for summary in repeats:
                    if summary.agent_tasks is not None:
                        continue  # judged on its task SLO, not on the request SLO
                    n = _bounded_samples(summary, slo)
                    if n is None:
                        continue
                    judged += 1
                    small += n < needed_samples("p99")
    if not judged or not small:
        return "judged on nearest-rank P99 per run, every repeat"
    return (
        f"judged on nearest-rank P99 per run, every repeat; {small} of {judged} runs measured fewer than "
        f"{needed_samples('p99')} requests, which support no P99: those are judged on the sample maximum "
        "(their slowest request), a stricter test"
    )


def _bounded_samples(summary: RunSummary, slo: Slo) -> int | None:
    """The fewest samples behind any metric the SLO bounds in this run (None: the SLO bounds nothing)."""
    counts = [dist.n for dist, bound in slo_pairs(summary, slo) if bound is not None]
    return min(counts) if counts else None


def markdown(found: list[WorkloadVerdict], slo: Slo, notes: list[str] | None = None, basis: str | None = None) -> str:
    """The verdict section: the framework verdict first, then per workload every level's whole ranking.

    ``basis``: what the SLO was judged on (:func:`slo_basis`); by default nearest-rank P99.
    """
    if not found:
        return "No sweep (concurrency levels or request rates) to judge: no verdict."
    named = (("TTFT ms", slo.ttft_ms), ("TTFA ms", slo.ttfa_ms), ("TPOT ms", slo.tpot_ms), ("E2E ms", slo.e2e_ms))
    bounds = ", ".join(f"{k} ≤ {v:g}" for k, v in named if v)
    lines: list[str] = []
    framework_lines = [_framework_line(v, load, fw) for v in found for load, fw in v.frameworks.items()]
    if framework_lines:
        lines += ["**Which framework** (each framework's best configuration against the best one, per load):"]
        lines += framework_lines
        lines.append("")
    agentic = [v for v in found if v.agentic]
    slo_line = ""
    if len(agentic) < len(found):
        slo_line = (
            f"SLO: {bounds or 'none set (every request must succeed)'}, "
            f"{basis or 'judged on nearest-rank P99 per run, every repeat'}"
            + (" (request workloads). " if agentic else ". ")
        )
    if agentic:
        # Agentic runs are judged by their tasks (analysis.task_verdict): name that SLO, not the request one.
        slo_line += "Agentic workloads are judged by tasks: " + "; ".join(
            task_slo_text(v.workload, v.task_slo_s) for v in agentic
        )
        slo_line += ". "
    lines.append(
        slo_line + "Figures: mean over repeats [95% Student-t interval] (n = repeats). Margins: the ratio of a "
        "server's figure to the best one's as a % change [interval]. Every claim at a load is held to one "
        "family-wise level, the choice of the best server (and of each framework's best) included: between two "
        "servers the paired t by round on log values (Welch's t where repeats do not pair); among three or more "
        "measured in the same rounds, Tukey's studentized range over their log noise pooled by a server + round "
        "fit; where that noise cannot be pooled, each pair's test at the level / the number of pairs "
        "(Bonferroni). Each load names the rule it ran and its level. A loss or win is significant and at least "
        "the campaign's min_effect, equivalent lies wholly within ±min_effect, else undecided."
    )
    lines += [f"\n{note}" for note in notes or []]
    for v in found:
        lines += ["", f"**{v.workload}** — at the matched load ({_load_text(v.axis, v.matched_load)}): {v.outcome}"]
        if v.levels:
            regimes = "; ".join(f"{_load_text(v.axis, load)}: {lv.outcome()}" for load, lv in v.levels.items())
            lines.append(f"- winner per load: {regimes}")
        for load, level in v.levels.items():
            if not level.standings:
                continue
            lines.append(f"- at {_load_text(v.axis, load)}, ranked by {v.unit} (higher is better):")
            if level.family is not None and level.family.kind != "none":
                lines.append(f"  - compared by {level.family.rule}")
            best = level.best or level.standings[0].server
            for s in level.standings:
                cost = ""
                if load == v.matched_load and s.usd_per_m_tok is not None:
                    cost = f", ${s.usd_per_m_tok:,.3f} per M output tokens"
                lines.append(f"  - {s.text(best, v.unit)}{cost}")
        sustained = "; ".join(f"{srv} {_load_text(v.axis, load)}" for srv, load in v.sustained.items())
        lines.append(f"- highest load sustained within the {'task ' if v.agentic else ''}SLO: {sustained}")
    return "\n".join(lines)


def noise_table(campaign_dir: Path) -> list[dict[str, object]]:
    """Run-to-run noise: per (workload, server, load) the coefficient of variation across repeats of each figure."""
    rows: list[dict[str, object]] = []
    for wl, (axis, runs) in sorted(collect(campaign_dir)[0].items()):
        for server, by_load in sorted(runs.items()):
            for load, repeats in sorted(by_load.items()):
                if len(repeats) < 2:
                    continue
                row: dict[str, object] = {"workload": wl, "server": server, axis: load, "repeats": len(repeats)}
                for label, metric, stat in _FIGURES:
                    cv = estimate(repeats, metric, stat).cv  # type: ignore[arg-type]
                    row[f"CV {label}"] = f"{cv:.1%}" if cv is not None else "-"
                rows.append(row)
    return rows


def _figure_text(repeats: list[RunSummary], metric: str, stat: str | None) -> str:
    """'mean [lo, hi] (n)'; for a percentile the repeats do not support, the highest they do, named."""
    if stat is None:
        return estimate(repeats, metric).text(1)
    wanted: StatName = stat  # type: ignore[assignment]
    found = supported_estimate(repeats, metric, wanted)
    if found.stat == wanted or not found.supported or found.stat is None:
        return found.text(1)
    return f"{STAT_LABELS[found.stat]} {found.text(1)}; {STAT_LABELS[wanted]} needs ≥{needed_samples(wanted)} per run"


def figures_table(campaign_dir: Path) -> list[dict[str, object]]:
    """Rows (workload, server, run) x every headline figure as 'mean [lo, hi] (n)'; a percentile the
    sample does not support shows the highest one it does, named (``P90 41.2 [..] (n=3×24); P99 needs ≥100``)."""
    rows: list[dict[str, object]] = []
    for wl, (axis, runs) in sorted(collect(campaign_dir)[0].items()):
        figures = _figures([s for by_load in runs.values() for reps in by_load.values() for s in reps])
        for server, by_load in sorted(runs.items()):
            for load, repeats in sorted(by_load.items()):
                row: dict[str, object] = {"workload": wl, "server": server, axis: load}
                for label, metric, stat in figures:
                    row[label] = _figure_text(repeats, metric, stat)
                rows.append(row)
    return rows
