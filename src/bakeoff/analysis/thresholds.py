"""Gate metrics: the names a campaign's ``regression:`` block may use, their readings and thresholds.

A gate metric is a figure one number can stand for, with a direction
(:mod:`bakeoff.results.metric_table` gives both):

- a run-level figure by its key: ``output_tok_s``, ``goodput_req_s``, ``usd_per_m_tok``;
- a distribution's statistic as ``KEY_STAT``: ``tpot_ms_p50``, ``ttft_ms_p99``, ``e2e_ms_mean``;
- a quality rate from a cell's ``quality.json`` (:data:`QUALITY`): ``quality_invalid_json``...

A threshold is a relative change for speed metrics (``5%`` = 0.05: a TPOT 5 % higher) and
an absolute change in the share for quality rates, which are shares already and are often
0 (``2%``: two more outputs in a hundred invalid); ``quality_perplexity``, not a share, is
gated relatively like speed. Metrics without a direction (designed reuse) cannot be gated.
:data:`DEFAULT_REGRESSION` applies when a campaign sets none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from bakeoff.analysis.confidence import estimate
from bakeoff.results.metric_table import METRICS
from bakeoff.results.summary import RunSummary, StatName

Better = Literal["higher", "lower"]
Scale = Literal["relative", "absolute"]

# The rates of a cell's quality.json (bakeoff.results.layout.QUALITY_RATES, and its perplexity),
# gated as quality_RATE: which way is better, and whether a change is a share or relative.
QUALITY_PREFIX = "quality_"
QUALITY: dict[str, tuple[Better, Scale]] = {
    "quality_invalid_json": ("lower", "absolute"),
    "quality_truncated": ("lower", "absolute"),
    "quality_refused": ("lower", "absolute"),
    "quality_exact": ("higher", "absolute"),
    "quality_length_ok": ("higher", "absolute"),
    "quality_agreement": ("higher", "absolute"),
    "quality_word_agreement": ("higher", "absolute"),
    "quality_perplexity": ("lower", "relative"),
}

# Gated when a campaign has no regression block: decode speed, throughput, the tails users feel.
DEFAULT_REGRESSION: dict[str, float] = {
    "output_tok_s": 0.05,
    "tpot_ms_p50": 0.05,
    "ttft_ms_p50": 0.10,
    "e2e_ms_p99": 0.10,
    # Quality at temperature 0 is deterministic: any share worse is a regression (when measured).
    **dict.fromkeys((name for name, (_, scale) in QUALITY.items() if scale == "absolute"), 0.0),
    # Prompt logprobs move in the last bits with the batch a request shares: 1% is a real change.
    "quality_perplexity": 0.01,
}


@dataclass(frozen=True)
class GateMetric:
    name: str
    better: Better
    scale: Scale
    stat: StatName | None = None  # the statistic of a distribution
    key: str = ""  # the metric table row (empty for quality rates)


def _table() -> dict[str, GateMetric]:
    found: dict[str, GateMetric] = {}
    for metric in METRICS:
        if metric.better is None:
            continue
        if metric.read is not None:
            found[metric.key] = GateMetric(metric.key, metric.better, "relative", key=metric.key)
            continue
        for stat in get_args(StatName):
            name = f"{metric.key}_{stat}"
            found[name] = GateMetric(name, metric.better, "relative", stat, metric.key)
    for name, (better, scale) in QUALITY.items():
        found[name] = GateMetric(name, better, scale)
    return found


GATE_METRICS: dict[str, GateMetric] = _table()


@dataclass(frozen=True)
class Reading:
    """One figure: a run's value (no interval), or a cell's mean over repeats with its interval."""

    value: float
    lo: float | None = None
    hi: float | None = None
    repeats: int | None = None
    values: tuple[float, ...] = ()  # one per repeat: what the gate's test (bakeoff.analysis.significance) reads


def readings(summary: RunSummary) -> dict[str, Reading]:
    """Every metric figure of one run by its gate name (undirected ones included); no intervals."""
    found: dict[str, Reading] = {}
    for metric in METRICS:
        if metric.read is not None:
            value = metric.read(summary)
            if value is not None:
                found[metric.key] = Reading(float(value))
            continue
        stat = metric.stat(summary)
        for name in get_args(StatName):
            figure = stat.value(name)
            if figure is not None:
                found[f"{metric.key}_{name}"] = Reading(figure)
    return found


def estimates(repeats: Sequence[RunSummary]) -> dict[str, Reading]:
    """Every gate metric over a cell's repeats: the mean and its interval (:mod:`.confidence`).

    A percentile the repeats' samples cannot support is left out: it cannot be judged
    (:func:`unsupported` says why).
    """
    found: dict[str, Reading] = {}
    for name, gate in GATE_METRICS.items():
        if not gate.key:
            continue
        figure = estimate(repeats, gate.key, gate.stat)
        if figure.supported and figure.value is not None:
            found[name] = Reading(figure.value, figure.lo, figure.hi, figure.repeats, figure.values)
    return found


def unsupported(repeats: Sequence[RunSummary], names: Sequence[str]) -> dict[str, str]:
    """Why each of the gate metrics ``names`` has no reading over these repeats (only those without one)."""
    found: dict[str, str] = {}
    for name in names:
        gate = GATE_METRICS.get(name)
        if gate is None or not gate.key:
            continue
        figure = estimate(repeats, gate.key, gate.stat)
        if not figure.supported:
            found[name] = figure.unsupported or "not measured"
    return found


def quality_readings(quality: dict[str, Any]) -> dict[str, Reading]:
    """A cell's ``quality.json`` rates by gate name; a rate not measured (None) is left out."""
    rates = quality.get("rates") or {}
    return {
        f"{QUALITY_PREFIX}{rate}": Reading(float(value))
        for rate, value in rates.items()
        if f"{QUALITY_PREFIX}{rate}" in QUALITY and isinstance(value, int | float)
    }


def parse_threshold(name: str, raw: object, where: str = "regression.") -> float:
    """``5%`` or 0.05 -> 0.05; anything else is a ValueError naming the field (``where`` + ``name``) and the fix."""
    name = f"{where}{name}"
    if isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            value = float(raw.strip()[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"{name}: {raw!r} is not a percentage; write e.g. 5%") from None
    elif isinstance(raw, int | float) and not isinstance(raw, bool):
        value = float(raw)
        if value > 1:
            raise ValueError(f"{name}: {raw} reads as {value * 100:g}%; write {raw:g}% or {raw / 100:g}")
    else:
        raise ValueError(f"{name}: {raw!r} is not a threshold; write a percentage such as 5%")
    if value < 0:
        raise ValueError(f"{name}: a threshold cannot be negative ({raw})")
    return value


def parse_thresholds(raw: object) -> dict[str, float]:
    """A campaign's ``regression`` block, names checked against :data:`GATE_METRICS`."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError("regression must be a mapping of metric: threshold, e.g. {tpot_ms_p50: 5%}")
    out: dict[str, float] = {}
    for name, value in raw.items():
        if name not in GATE_METRICS:
            close = sorted(n for n in GATE_METRICS if n.startswith(str(name).split("_")[0]))[:8]
            hint = f"; did you mean one of: {', '.join(close)}" if close else ""
            raise ValueError(
                f"regression.{name}: not a metric bakeoff can gate on{hint} (run-level figures by key, "
                "distributions as KEY_STAT such as tpot_ms_p50, or a quality rate)"
            )
        out[str(name)] = parse_threshold(str(name), value)
    return out


def effective(thresholds: Mapping[str, float]) -> dict[str, float]:
    """What a comparison gates on: the campaign's block, or the defaults when it set none."""
    return dict(thresholds) if thresholds else dict(DEFAULT_REGRESSION)
