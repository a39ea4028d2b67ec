"""The figures of a measured cell, and the objective Optuna is told from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bakeoff.analysis.verdict import meets
from bakeoff.backends.spec import BackendSpec, KnobValue
from bakeoff.campaign.tune.folder import Target
from bakeoff.measure.load_modes import load_level
from bakeoff.measure.slo import Slo, slo_miss
from bakeoff.results.metric_table import BY_KEY
from bakeoff.results.store import SUMMARY, read_summary
from bakeoff.results.summary import RunSummary

WORST = -1.0  # told for a failed, skipped or rejected trial: below every measured one (see missed())


# --- figures of a cell ---------------------------------------------------------------------------


def goodput_metric(slo: Slo) -> str:
    """The verdict's figure: goodput where the SLO bounds something, else output tok/s."""
    bounded = any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))
    return "goodput_req_s" if bounded else "output_tok_s"


def _summaries(cell_dir: Path) -> list[RunSummary]:
    return [read_summary(p) for p in sorted((cell_dir / "runs").glob(f"*/{SUMMARY}"))]


def _load_of(summary: RunSummary) -> float | None:
    wl = summary.workload
    level = load_level(wl.mode, wl.concurrency, wl.rate)
    return level[1] if level is not None else None


def figures(cell_dir: Path, target: Target, gpus: int) -> dict[str, Any]:
    """A cell's figures at the load: the objective's and the Pareto plot's, and whether the SLO held."""
    runs = [s for s in _summaries(cell_dir) if not s.interrupted]
    at = [s for s in runs if _load_of(s) == target.load]
    sustained = max((load for s in runs if (load := _load_of(s)) is not None and meets([s], target.slo)), default=0.0)
    # max_load's fallback where no load is met: the closest any load of the sweep came.
    misses = [m.factor for s in runs if (m := slo_miss(s, target.slo)) is not None]
    lowest = min(misses, default=None)
    if not at:
        return {"figure": None, "slo_met": False, "sustained": sustained, "lowest_slo_miss": lowest}
    s = at[0]
    tpot = BY_KEY["tpot_ms"].value(s, "p50")
    tok_s = BY_KEY["output_tok_s"].value(s)
    miss = slo_miss(s, target.slo)
    return {
        "figure": BY_KEY[goodput_metric(target.slo)].value(s),
        "slo_met": meets([s], target.slo),
        "sustained": sustained,
        "slo_miss": miss.factor if miss is not None else None,
        "slo_miss_text": miss.text() if miss is not None else None,
        "lowest_slo_miss": lowest,
        "output_tok_s": tok_s,
        "tok_s_per_gpu": tok_s / gpus if tok_s is not None else None,
        "tok_s_per_user": 1000.0 / tpot if tpot else None,
        "ttft_ms_p99": BY_KEY["ttft_ms"].value(s, "p99"),
        "tpot_ms_p50": tpot,
    }


def missed(miss: float | None) -> float:
    """A trial that met nothing, ranked by its SLO miss: in (-1, 0), higher the smaller the miss.

    Below every positive goodput or load, above :data:`WORST`; no miss to rank by (nothing
    measured at the load) is the worst.
    """
    return WORST if miss is None else -miss / (1.0 + miss)


def ranked_goodput(found: dict[str, Any]) -> float:
    """Goodput at the load where a request met the SLO, else the trial's SLO miss (:func:`missed`)."""
    figure = found.get("figure")
    if figure is None:
        return WORST
    return float(figure) if figure > 0 else missed(found.get("slo_miss"))


def objective(found: dict[str, Any], target: Target) -> list[float]:
    """The value(s) told to Optuna: higher is better for every objective."""
    if target.spec.objective == "pareto":
        return [found.get("tok_s_per_gpu") or 0.0, found.get("tok_s_per_user") or 0.0]
    if target.spec.objective == "max_load":
        sustained = float(found.get("sustained") or 0.0)
        return [sustained if sustained > 0 else missed(found.get("lowest_slo_miss"))]
    return [ranked_goodput(found)]


def _gpus(knobs: dict[str, KnobValue], backend: BackendSpec) -> int:
    tp = knobs.get("tensor_parallel_size", 1)
    return int(tp) if backend.accelerator == "gpu" and isinstance(tp, int) and tp > 0 else 1
