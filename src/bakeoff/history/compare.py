"""``bakeoff compare``: is a new run better, worse, or the same within noise as its baseline?

Runs are matched by server label, workload and run name (``c8``, ``r2.0``); quality rates
by server and workload. For every gated metric (the campaign's ``regression:`` block, else
:data:`bakeoff.analysis.thresholds.DEFAULT_REGRESSION`) present on both sides, :func:`judge` says,
where both sides have two or more repeats, with the verdict's own test
(:func:`bakeoff.analysis.significance.decide`, Welch's t on log values, the threshold as its
margin), so the gate's false-alarm rate is the test's level (5%):

- **regressed** / **improved**: the change is significant and at least the threshold, the
  metric's worse / better way (TPOT up, tok/s down);
- **within noise**: the change's interval lies within ±threshold (equivalent);
- **undecided**: neither — the repeats cannot tell; the why says what they could detect and
  how many repeats would decide.

A side with one repeat (and quality rates, which are not repeated) is judged on the threshold
alone, and the why says so. A gate that cannot be judged (P99 unsupported by the sample, a
metric one side lacks) is listed under :attr:`Comparison.not_judged` with the reason.

Speed thresholds are relative to the baseline's value, quality thresholds are absolute
shares, but for the relative perplexity (:mod:`bakeoff.analysis.thresholds`). A regression
makes the command exit 1, so a pipeline can gate on it, and names the configuration to roll
back to: the baseline's backend, knobs, image digest and framework version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bakeoff.analysis.significance import decide
from bakeoff.analysis.thresholds import (
    GATE_METRICS,
    GateMetric,
    Reading,
    effective,
    estimates,
    parse_thresholds,
    quality_readings,
    unsupported,
)
from bakeoff.console import text_table
from bakeoff.errors import SpecError
from bakeoff.history import archive as arch
from bakeoff.history.baseline import Ref, baseline_archives, resolve
from bakeoff.history.index import repeat_groups, run_facts
from bakeoff.results.cell_record import cell_record_or_none
from bakeoff.results.layout import cell_names, read_campaign_copy
from bakeoff.results.store import CELL_INFO, read_json

Verdict = Literal["improved", "regressed", "within noise", "undecided"]
MARKED = ("baseline", "marked")  # --baseline words for "the baseline marked per server"
QUALITY_RUN = "quality"  # the run name quality rates are matched under
Key = tuple[str, str, str]  # server, workload, run


@dataclass(frozen=True)
class Config:
    """What to roll back to: how a server was configured when it measured the baseline."""

    server: str
    backend: str | None
    knobs: str
    image: str | None
    image_digest: str | None
    framework_version: str | None
    where: str  # the archive id, or the folder
    measured_at: str | None

    def line(self) -> str:
        parts = [f"backend {self.backend}", f"knobs {self.knobs}"]
        if self.framework_version:
            parts.append(f"framework version {self.framework_version}")
        if self.image:
            parts.append(f"image {self.image}")
        if self.image_digest:
            parts.append(f"digest {self.image_digest}")
        when = f", measured {self.measured_at}" if self.measured_at else ""
        return f"{self.server}: {', '.join(parts)} (baseline {self.where}{when})"


@dataclass
class Side:
    readings: dict[Key, dict[str, Reading]] = field(default_factory=dict)
    configs: dict[str, Config] = field(default_factory=dict)
    unsupported: dict[Key, dict[str, str]] = field(default_factory=dict)  # gate metric -> why it has no reading


@dataclass(frozen=True)
class Judgement:
    server: str
    workload: str
    run: str
    metric: str
    old: Reading
    new: Reading
    change: float
    threshold: float
    scale: str
    verdict: Verdict
    why: str


def _where(folder: Path) -> str:
    return arch.archive_id(folder) if (folder / arch.MANIFEST).is_file() else str(folder)


def load_side(ref: Ref) -> Side:
    """Every run's gate metrics over its repeats (and each cell's quality rates) of a folder, by key."""
    side = Side()
    campaign = read_campaign_copy(ref.folder)
    for key, repeats in repeat_groups(ref.folder).items():
        if ref.server is not None and key[0] != ref.server:
            continue
        side.readings[key] = estimates([r.summary for r in repeats])
        side.unsupported[key] = unsupported([r.summary for r in repeats], list(GATE_METRICS))
        facts = run_facts(ref.folder, repeats[0], campaign)
        started = facts["started_at"].isoformat(timespec="seconds") if facts["started_at"] else None
        side.configs.setdefault(
            key[0],
            Config(
                key[0],
                facts["backend"],
                facts["knobs"],
                facts["image"],
                facts["image_digest"],
                facts["framework_version"],
                _where(ref.folder),
                started,
            ),
        )
    rates: dict[Key, list[dict[str, Reading]]] = {}
    for path in sorted(ref.folder.glob("cells/*/quality.json")):
        server, workload = cell_names(path.parent.name, cell_record_or_none(path.parent / CELL_INFO))
        if ref.server is None or server == ref.server:
            rates.setdefault((server, workload, QUALITY_RUN), []).append(quality_readings(read_json(path)))
    for key, found in rates.items():  # repeats that checked quality: their mean rate
        names = {n for f in found for n in f}
        side.readings[key] = {
            n: Reading(sum(f[n].value for f in found if n in f) / sum(n in f for f in found)) for n in names
        }
    return side


_FROM_TEST: dict[str, Verdict] = {
    "win": "improved",
    "loss": "regressed",
    "equivalent": "within noise",
    "undecided": "undecided",
}


def judge(gate: GateMetric, threshold: float, old: Reading, new: Reading) -> tuple[Verdict, float, str]:
    """(verdict, change, why): change is relative to the old value, or absolute for quality shares."""
    if gate.scale == "relative" and len(old.values) >= 2 and len(new.values) >= 2:
        tested = decide(new.values, old.values, gate.better, min_effect=threshold)
        if tested.change is not None:
            why = f"{tested.text()} (margin: the {_pct(threshold, gate.scale)} threshold)"
            return _FROM_TEST[tested.outcome], tested.change, why
    if gate.scale == "absolute":
        change = new.value - old.value
    elif old.value == 0:
        change = 0.0 if new.value == 0 else math.copysign(math.inf, new.value)
    else:
        change = (new.value - old.value) / abs(old.value)
    worse = change > 0 if gate.better == "lower" else change < 0
    alone = "" if gate.scale == "absolute" else "; one repeat on a side: no test against noise, the threshold alone"
    if abs(change) <= threshold + 1e-12:
        return "within noise", change, f"within the {_pct(threshold, gate.scale)} threshold{alone}"
    verdict: Verdict = "regressed" if worse else "improved"
    return verdict, change, f"beyond the {_pct(threshold, gate.scale)} threshold ({gate.better} is better){alone}"


def _pct(value: float, scale: str) -> str:
    return f"{value * 100:g}{'%' if scale == 'relative' else ' pts'}"


@dataclass
class Comparison:
    campaign: str
    new: str
    judgements: list[Judgement] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # servers / runs with no baseline to judge against
    not_judged: list[str] = field(default_factory=list)  # "server/workload/run metric: why" for gates left out
    rollback: dict[str, Config] = field(default_factory=dict)

    @property
    def regressions(self) -> list[Judgement]:
        return [j for j in self.judgements if j.verdict == "regressed"]


def thresholds_of(folder: Path) -> dict[str, float]:
    """The gate of a campaign folder or archive: its campaign.yaml's regression block, else the defaults."""
    campaign = read_campaign_copy(folder)
    try:
        return effective(parse_thresholds(campaign.regression))
    except ValueError as exc:
        raise SpecError(f"{folder / arch.CAMPAIGN_COPY}: {exc}") from exc


def compare(new_ref: str | Path, root: Path, baseline_ref: str | Path | None = None) -> Comparison:
    """Judge NEW against ``baseline_ref``, or against each server's marked baseline."""
    new = resolve(new_ref, root)
    campaign = arch.campaign_name(new.folder)
    if baseline_ref is not None and str(baseline_ref) in MARKED and not Path(baseline_ref).exists():
        baseline_ref = None  # "--baseline baseline": the marked one, as the schedule files spell it
    olds: dict[str, Side] = {}
    if baseline_ref is not None:
        olds["*"] = load_side(resolve(baseline_ref, root))
    else:
        marked = baseline_archives(root, campaign)
        if not marked:
            raise SpecError(
                f"campaign {campaign} has no baseline in {root}: mark one with 'bakeoff baseline set "
                "reports/NAME' or give --baseline"
            )
        olds = {server: load_side(Ref(folder, server)) for server, folder in marked.items()}
    gates = thresholds_of(new.folder)
    result = Comparison(campaign, _where(new.folder))
    new_side = load_side(new)
    for key, new_readings in sorted(new_side.readings.items()):
        old_side = olds.get("*") or olds.get(key[0])
        old_readings = old_side.readings.get(key) if old_side is not None else None
        if old_side is None or old_readings is None:
            result.unmatched.append("/".join(key))
            continue
        for metric, threshold in gates.items():
            if metric not in old_readings or metric not in new_readings:
                why = _not_judged(metric, key, old_side, new_side)
                if why is not None:
                    result.not_judged.append(f"{'/'.join(key)} {metric}: {why}")
                continue
            gate = GATE_METRICS[metric]
            verdict, change, why = judge(gate, threshold, old_readings[metric], new_readings[metric])
            result.judgements.append(
                Judgement(
                    *key,
                    metric,
                    old_readings[metric],
                    new_readings[metric],
                    change,
                    threshold,
                    gate.scale,
                    verdict,
                    why,
                )
            )
            if verdict == "regressed" and key[0] in old_side.configs:
                result.rollback[key[0]] = old_side.configs[key[0]]
    return result


def _not_judged(metric: str, key: Key, old: Side, new: Side) -> str | None:
    """Why a gate has no verdict for a run; None for a quality gate of a campaign that checked no quality."""
    if metric not in GATE_METRICS or not GATE_METRICS[metric].key:
        return None  # quality rates: only campaigns that check quality have them
    for side, name in ((new, "new"), (old, "baseline")):
        why = side.unsupported.get(key, {}).get(metric)
        if why is not None:
            return f"{name}: {why}"
    return "not measured on one side"


def _value(reading: Reading) -> str:
    text = f"{reading.value:.4g}"
    if reading.lo is not None and reading.hi is not None:
        text += f" [{reading.lo:.4g}, {reading.hi:.4g}]"
    return text


def _change(j: Judgement) -> str:
    if math.isinf(j.change):
        return "new"
    return f"{j.change * 100:+.1f}%" if j.scale == "relative" else f"{j.change * 100:+.1f} pts"


def render(result: Comparison) -> str:
    """The verdict table, the servers without a baseline and what to roll back to."""
    rows = [
        (
            j.server,
            j.workload,
            j.run,
            j.metric,
            _value(j.old),
            _value(j.new),
            _change(j),
            j.verdict.upper() if j.verdict == "regressed" else j.verdict,
            j.why,
        )
        for j in result.judgements
    ]
    lines = [f"compare {result.new} (campaign {result.campaign}) against its baseline"]
    lines.append(
        text_table(["server", "workload", "run", "metric", "baseline", "new", "change", "verdict", "why"], rows)
    )
    if result.unmatched:
        lines.append(f"not judged (no baseline run to match): {', '.join(result.unmatched)}")
    if result.not_judged:
        lines.append("gates not judged:")
        lines += [f"  {line}" for line in result.not_judged]
    regressions = result.regressions
    verdicts = ("regressed", "improved", "within noise", "undecided")
    counts = {v: sum(j.verdict == v for j in result.judgements) for v in verdicts}
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items()))
    if regressions:
        lines.append("REGRESSION: roll back to the baseline's configuration:")
        lines += [f"  {config.line()}" for config in result.rollback.values()]
    return "\n".join(lines)


def as_json(result: Comparison) -> dict[str, Any]:
    """The comparison for pipelines (``bakeoff compare --json``)."""
    return {
        "campaign": result.campaign,
        "new": result.new,
        "regressed": bool(result.regressions),
        "judgements": [
            {
                "server": j.server,
                "workload": j.workload,
                "run": j.run,
                "metric": j.metric,
                "baseline": vars(j.old),
                "new": vars(j.new),
                "change": None if math.isinf(j.change) else j.change,
                "threshold": j.threshold,
                "scale": j.scale,
                "verdict": j.verdict,
                "why": j.why,
            }
            for j in result.judgements
        ],
        "unmatched": result.unmatched,
        "not_judged": result.not_judged,
        "rollback": {server: vars(config) for server, config in result.rollback.items()},
    }
