"""The engineering-effort section's checks of each server before it measured anything.

- :func:`smoke_table`: the smoke run (``smoke.json``, :mod:`bakeoff.results.smoke`), one row
  per server, a column per step, with what each step found.
- :func:`effective_values_table`: for the knobs a campaign left unset, what bakeoff's backend
  YAML declares as the framework's default beside what the server's image itself defaults to,
  as its pre-flight read it from the framework's parser (``server.image_defaults`` in each
  cell's effort record and ``run.json``): "framework defaults" means what the image did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.results.layout import PREFLIGHT_FILE, REHEARSAL_TAG, is_rehearsal, load_cells
from bakeoff.results.smoke import read_smoke, smoke_rows
from bakeoff.results.store import read_json_or_empty

REHEARSAL_SUFFIX = f" {REHEARSAL_TAG}"


def smoke_table(campaign_dir: Path) -> pd.DataFrame:
    """The campaign's smoke run, empty when none ran in this folder."""
    result = read_smoke(campaign_dir)
    if result is None:
        return pd.DataFrame()
    rows = smoke_rows(result)
    if result.rehearsal:
        for row in rows:
            row["server"] += REHEARSAL_SUFFIX
    return pd.DataFrame(rows)


def _shown(value: object) -> object:
    return "unset (from the model)" if value is None else value


def effective_values_table(campaign_dir: Path) -> pd.DataFrame:
    """Per server and unset knob: the YAML's declared default, the image's own, and whether they differ.

    A server whose pre-flight read no defaults (a rehearsal, a skipped or unchecked pre-flight)
    gets one row saying why, so an empty column is never mistaken for agreement.
    """
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    preflight = read_json_or_empty(campaign_dir / PREFLIGHT_FILE)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for cell in load_cells(campaign_dir):
        server = cell.effort.server
        if cell.label in seen or server is None:
            continue
        seen.add(cell.label)
        set_knobs = cell.knobs
        effective = server.effective_knobs
        image = server.image_defaults or {}
        if not image:
            found = (preflight.get("servers") or {}).get(cell.label) or {}
            if preflight.get("skipped"):
                why = "the pre-flight was skipped (--skip-preflight)"
            elif found:
                why = f"its pre-flight ({found.get('status')}: {found.get('detail')}) read none"
            else:
                why = "no pre-flight record"
            rows.append(
                {"server": cell.label + suffix, "knob": "-", "declared (backend YAML)": "-",
                 "image default (pre-flight)": f"not read: {why}", "differs": "-"}
            )  # fmt: skip
            continue
        for knob, value in sorted(image.items()):
            if knob in set_knobs:
                continue  # set by the campaign: its value is what ran
            declared = effective.get(knob)
            rows.append(
                {
                    "server": cell.label + suffix,
                    "knob": knob,
                    "declared (backend YAML)": _shown(declared),
                    "image default (pre-flight)": _shown(value),
                    "differs": "yes" if declared != value else "no",
                }
            )
    return pd.DataFrame(rows)
