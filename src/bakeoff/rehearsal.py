"""Rehearsals: a GPU campaign run end to end on any machine, with nothing presented as measured.

``bakeoff campaign run CAMPAIGN --rehearse`` keeps every part of bakeoff real (validation,
request plans, launch rendering, health probes, metric scrapes, cache resets, notebooks,
report) and replaces only each GPU framework's container with the reference server in that
framework's wire profile (:mod:`bakeoff.launchers`). To keep it quick, the campaign is
scaled down (:meth:`for_rehearsal` of each workload kind: a few requests per level, short
outputs) and planned with the generated ``tiny`` model's tokenizer, since the GPU checkpoint
is not on this machine.

A rehearsal's campaign folder holds :data:`MARKER`; every run summary it produces carries
``"rehearsal": true`` and the report says REHEARSAL on every section, so its figures can
never be mistaken for a measurement of the frameworks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bakeoff.specs import CampaignSpec, ModelRef
from bakeoff.store import read_json, write_json

MARKER = "rehearsal.json"
REHEARSAL_PRESET = "tiny"
BANNER = (
    "**REHEARSAL — not a measurement.** Every server in this report is the reference server "
    "emulating a framework's wire protocol, not the framework: the figures test bakeoff's GPU path "
    "(commands, probes, scrapes, cache resets, report) and say nothing about vLLM, SGLang or TensorRT-LLM."
)


def rehearsal_spec(spec: CampaignSpec) -> CampaignSpec:
    """The campaign scaled down for a rehearsal, planned with the generated tiny tokenizer."""
    # Same served name, context length and draft model; only the source of the tokenizer changes.
    fields = spec.model.model_dump()
    fields.update({key: None for key in ("path", "hf_id") if key in fields})
    model = ModelRef.model_validate({**fields, "preset": REHEARSAL_PRESET})
    workloads = [wl.for_rehearsal() for wl in spec.workloads]
    # One repeat: a rehearsal proves the path, it has no noise worth an interval.
    return spec.model_copy(update={"model": model, "workloads": workloads, "measure_warm_restart": True, "repeats": 1})


def write_marker(out_dir: Path, source: Path, spec: CampaignSpec) -> None:
    write_json(
        out_dir / MARKER,
        {
            "rehearsal": True,
            "source_campaign": str(source),
            "original_model": spec.model.model_dump(mode="json", exclude_none=True),
            "note": "reference-server stand-ins for GPU containers; no figure here is a measurement",
        },
    )


def is_rehearsal(campaign_dir: Path) -> bool:
    return (campaign_dir / MARKER).is_file()


def marker(campaign_dir: Path) -> dict[str, Any] | None:
    path = campaign_dir / MARKER
    return read_json(path) if path.is_file() else None
