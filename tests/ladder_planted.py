"""A ladder campaign run by the real ``campaign run`` (``execute._run_ladder``) with planted cells.

The ladder's own code runs: the derived campaign written per step, ``prepare`` and the
pre-flight of each step's server, the knobs of the last kept step merged into the next step,
:func:`outcome_of` reading the cell folders, :func:`decide`, ``ladder.json`` and ``ladder.md``.
Only the cells' measurement is planted: ``execute._run_cells`` (the one call through which the
ladder measures a step) is replaced by :func:`planted_cells`, which writes each cell's folder
(``cell.json``, a run's ``summary.json`` and telemetry, ``quality.json``) with figures that
follow from the knobs the cell was given, so a wrong carry-over shows as a wrong figure. The
compare notebook is not rendered (its ladder section is tested on ``ladder.json`` itself).

The planted server, by its knobs:

- output tok/s: 100 (``quantization: none``), 150 (``q8_0``), 210 (``q4_0``); times 0.9 with
  ``kv_cache_dtype: q8_0``, times 1.1 with ``max_num_seqs: 8``;
- exact-answer rate 0.60, 0.60, 0.40, less 0.01 with the q8_0 KV cache; held-out phrasing half
  of it; ``q4_0`` changes three of ten greedy answers completely;
- ``speculative`` set: the cell fails (the step did not run);
- peak RSS 40 MiB; weights ``BF16 x16`` unquantized, else ``Q8_0 x15``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bakeoff.campaign import execute
from bakeoff.campaign.cells import Cell
from bakeoff.campaign.execute import run_campaign
from bakeoff.campaign.progress import CampaignProgress
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.observe.telemetry_series import SERIES_FILE, write_series
from bakeoff.results.store import write_json, write_summary
from history_planted import summary

BACKEND = """\
name: planted
display_name: planted server (ladder test)
runtime: process
accelerator: cpu
command: ["{python}", "-m", "bakeoff.ref.server", "--port", "{port}", "--model", "{served_model_name}"]
health: {path: /health, timeout_s: 20, interval_s: 0.1}
cache_reset: {kind: none}
knobs:
  quantization: {type: str, default: none, choices: [none, q8_0, q4_0], env: PLANTED_QUANT}
  kv_cache_dtype: {type: str, default: auto, choices: [auto, q8_0], env: PLANTED_KV}
  max_num_seqs: {type: int, default: 4, flag: --slots, minimum: 1}
  speculative: {type: str, default: none, choices: [none, ngram], env: PLANTED_SPEC}
"""

QUALITY_SET = """\
{"id": "e", "kind": "exact", "prompt": "Say yes.", "answer": "yes", "max_tokens": 4}
"""

SPEED = {"none": 100.0, "q8_0": 150.0, "q4_0": 210.0}
EXACT = {"none": 0.60, "q8_0": 0.60, "q4_0": 0.40}
ANSWER = "the capital of Oria is Fibi"
DRIFTED = "something else entirely said"


def planted_figures(knobs: dict[str, Any]) -> tuple[float, float, int]:
    """(output tok/s, exact-answer rate, answers drifted) of the planted server with ``knobs``."""
    quant = str(knobs.get("quantization", "none"))
    kv8 = knobs.get("kv_cache_dtype") == "q8_0"
    tok_s = SPEED[quant] * (0.9 if kv8 else 1.0) * (1.1 if knobs.get("max_num_seqs") == 8 else 1.0)
    exact = round(EXACT[quant] - (0.01 if kv8 else 0.0), 6)
    return tok_s, exact, 3 if quant == "q4_0" else 0


def planted_cells(
    cells: list[Cell], out: Path, failures: list[str], progress: CampaignProgress, spec: CampaignSpec
) -> None:
    """``execute._run_cells``' place: each cell's folder as a measured cell leaves it."""
    for cell in cells:
        knobs = dict(cell.server.knobs)
        cell_dir = out / "cells" / cell.cell_id
        info = {
            "server": cell.server.model_dump(mode="json"),
            "backend": cell.backend.name,
            "workload": cell.workload.label,
            "repeat": cell.repeat,
            "status": "ok",
        }
        if knobs.get("speculative", "none") != "none":
            failures.append(cell.cell_id)
            write_json(cell_dir / "cell.json", {**info, "status": "failed"})
            continue
        tok_s, exact, drifted = planted_figures(knobs)
        weights = "BF16 x16" if knobs.get("quantization", "none") == "none" else "Q8_0 x15"
        kv = "q8_0" if knobs.get("kv_cache_dtype") == "q8_0" else "f16"
        info["effort"] = {"server": {"dtypes": {"weights": weights, "kv_cache": kv}}}
        write_json(cell_dir / "cell.json", info)
        run = cell_dir / "runs" / "c1"
        write_summary(run / "summary.json", summary(1000 / tok_s, tok_s, repeat=cell.repeat))
        write_series(run / SERIES_FILE, [{"t_s": float(t), "rss_bytes": 40.0 * 2**20} for t in range(3)])
        answers = [{"id": f"q{k}", "output": DRIFTED if k < drifted else ANSWER, "error": None} for k in range(10)]
        scores = {
            "rates": {"exact": exact},
            "exact_by_group": {"trained-phrasing": exact, "held-out-phrasing": exact / 2},
            "answers": answers,
        }
        write_json(cell_dir / "quality.json", scores)


def run_planted_ladder(
    folder: Path, model: Path, ladder: dict[str, Any]
) -> tuple[Path, list[dict[str, Any]], list[Path]]:
    """Run a ladder campaign on ``model`` (baseline: the planted server unquantized) into ``folder/out``.

    Returns the campaign folder, the knobs of every cell measured in order, and the folders a
    report was asked for.
    """
    (folder / "backends").mkdir(parents=True)
    (folder / "backends" / "planted.yaml").write_text(BACKEND)
    (folder / "q.jsonl").write_text(QUALITY_SET)
    campaign = {
        "name": "ladder-planted",
        "model": {"path": str(model), "served_name": "m"},
        "servers": [{"backend": "planted", "label": "bf16"}],
        "workloads": [
            {"kind": "concurrency", "name": "w", "levels": [1], "requests_per_level": 4, "warmup_requests": 0,
             "input_len": 8, "output_len": 8, "min_duration_s": 0}
        ],
        "repeats": 1,
        "measure_warm_restart": False,
        "quality": {"prompts": str(folder / "q.jsonl")},
        "ladder": ladder,
    }  # fmt: skip
    path = folder / "ladder.yaml"
    path.write_text(yaml.safe_dump(campaign, sort_keys=False))
    measured: list[dict[str, Any]] = []
    reports: list[Path] = []

    def run_cells(
        cells: list[Cell],
        out: Path,
        failures: list[str],
        progress: CampaignProgress,
        spec: Any,
        *,
        in_process: bool = False,
    ) -> None:
        measured.extend(dict(c.server.knobs) for c in cells)
        planted_cells(cells, out, failures, progress, spec)

    def render(out: Path, failures: list[str] | None = None) -> Path:
        reports.append(out)
        return out / "report.html"

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BAKEOFF_BACKENDS_DIR", str(folder / "backends"))
        patch.setattr(execute, "_run_cells", run_cells)
        patch.setattr(execute, "render_report", render)
        run_campaign(path, folder / "out")
    return folder / "out", measured, reports
