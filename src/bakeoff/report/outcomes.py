"""The outcome sections: quality, re-measured cells, the verdict, noise and confidence, energy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.analysis import verdict
from bakeoff.report.frame import REHEARSAL_SUFFIX
from bakeoff.results.cell_record import read_cell_record
from bakeoff.results.layout import (
    QUALITY_FILE,
    QUALITY_RATES,
    QUALITY_SCORES,
    is_rehearsal,
    load_cells,
)
from bakeoff.results.store import CELL_INFO, read_json


def quality_table(campaign_dir: Path) -> pd.DataFrame:
    """One row per cell that ran the quality set: its rates in percent (:mod:`bakeoff.campaign.quality`)
    and its perplexity, with why not where a server was not scored."""

    rows = []
    # A rehearsal's rates are planted by its stand-ins (bakeoff.serving.stand_in_quality): marked like every table.
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    for path in sorted((campaign_dir / "cells").glob(f"*/{QUALITY_FILE}")):
        result = read_json(path)
        rates = result["rates"]
        server, _, workload = path.parent.name.partition("__")
        row: dict[str, Any] = {"server": server + suffix, "workload": workload, "answered": rates["answered"]}
        row["failed"] = rates["failed"]
        row.update({f"{name} %": None if rates[name] is None else 100 * rates[name] for name in QUALITY_RATES})
        # Older quality.json files have no perplexity: not measured, like a server without prompt logprobs.
        row.update({name: rates.get(name) for name in QUALITY_SCORES})
        row["perplexity not measured"] = (result.get("perplexity") or {}).get("why_not")
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty and table["perplexity not measured"].isna().all():
        table = table.drop(columns="perplexity not measured")
    return table


def remeasured_table(campaign_dir: Path) -> pd.DataFrame:
    """Cells a resumed campaign measured again: why, and what each earlier attempt had finished."""
    rows = [
        {
            "cell": path.parent.name,
            "earlier attempt": attempt.attempt,
            "ended": attempt.status,
            "finished requests kept": attempt.finished_requests,
            "measured again because": attempt.why_measured_again,
        }
        for path in sorted((campaign_dir / "cells").glob(f"*/{CELL_INFO}"))
        for attempt in read_cell_record(path).earlier_attempts
    ]
    return pd.DataFrame(rows)


def verdict_section(campaign_dir: Path) -> str:
    """The verdict the report opens with (:mod:`bakeoff.analysis.verdict`), as markdown."""
    if is_rehearsal(campaign_dir):
        # Its runs are left out of every verdict; "no sweep" would read as a missing workload.
        return "Rehearsal: no verdict is drawn. Every server was a reference-server stand-in, not a framework."
    notes = [n for n in (verdict.auto_repeats_note(campaign_dir),) if n is not None]
    notes += verdict.saturation_notes(campaign_dir)
    slo = verdict.campaign_slo(campaign_dir)
    return verdict.markdown(verdict.verdicts(campaign_dir), slo, notes, verdict.slo_basis(campaign_dir, slo))


def noise_table(campaign_dir: Path) -> pd.DataFrame:
    """Run-to-run noise: the coefficient of variation across repeats, per server, load and figure."""
    return pd.DataFrame(verdict.noise_table(campaign_dir))


def confidence_table(campaign_dir: Path) -> pd.DataFrame:
    """Every headline figure per server and load with n and its Student-t interval across repeats."""
    return pd.DataFrame(verdict.figures_table(campaign_dir))


def energy_table(campaign_dir: Path) -> pd.DataFrame:
    """Energy per run over its measured window, or 'not measured' with the reason."""
    rows: list[dict[str, Any]] = []
    for cell in load_cells(campaign_dir):
        for summary in cell.summaries.values():
            energy = summary.energy
            row: dict[str, Any] = {"server": cell.label, "workload": cell.workload, "run": summary.workload.run}
            if energy is None or energy.joules is None:
                why = energy.reason if energy is not None and energy.reason else "not recorded (run before energy)"
                rows.append({**row, "energy": f"not measured: {why}"})
                continue
            rows.append(
                {
                    **row,
                    "energy": f"{energy.source}: {', '.join(d.device for d in energy.devices)}",
                    "window s": f"{energy.start_s:.1f}–{energy.end_s:.1f} ({energy.window_s:.1f} s)",
                    "J": energy.joules,
                    "J/out tok": energy.j_per_output_token,
                    "out tok/J": energy.output_tokens_per_j,
                    "avg W": energy.average_w,
                }
            )
    return pd.DataFrame(rows)


def energy_unmeasured(campaign_dir: Path) -> str | None:
    """One line where no run of the campaign measured energy (why, once); None where any run did."""
    reasons = set()
    for row in energy_table(campaign_dir).to_dict("records"):
        text = str(row["energy"])
        if not text.startswith("not measured: "):
            return None
        reasons.add(text.removeprefix("not measured: "))
    return f"Energy not measured in any run: {'; '.join(sorted(reasons))}." if reasons else None
