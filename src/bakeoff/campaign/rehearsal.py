"""Rehearsals: a GPU campaign run end to end on any machine, with nothing presented as measured.

``bakeoff campaign run CAMPAIGN --rehearse`` keeps every part of bakeoff real (validation,
request plans, launch rendering, health probes, metric scrapes, cache resets, notebooks,
report) and replaces only each GPU framework's container with the reference server in that
framework's wire profile (:mod:`bakeoff.serving.launchers`). To keep it quick, the campaign is
scaled down (:meth:`for_rehearsal` of each workload kind: a few requests per level, short
outputs; of a ``tune:`` section: two trials, one finalist) and planned with the generated
``tiny`` model's tokenizer, since the GPU checkpoint is not on this machine.

A rehearsal's campaign folder holds :data:`MARKER`; every run summary it produces carries
``"rehearsal": true`` and the report says REHEARSAL on every section, so its figures can
never be mistaken for a measurement of the frameworks.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.campaign.gpu_host import gpu_host_steps
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.models.model_source import ModelRef
from bakeoff.results.layout import REHEARSAL_MARKER, REHEARSAL_TAG, rehearsal_marker
from bakeoff.results.store import write_json

REHEARSAL_PRESET = "tiny"


def rehearsal_spec(spec: CampaignSpec) -> CampaignSpec:
    """The campaign scaled down for a rehearsal, planned with the generated tiny tokenizer."""
    # Same served name, context length and draft model; only the source of the tokenizer changes.
    fields = spec.model.model_dump()
    fields.update({key: None for key in ("path", "hf_id") if key in fields})
    model = ModelRef.model_validate({**fields, "preset": REHEARSAL_PRESET})
    workloads = [wl.for_rehearsal() for wl in spec.workloads]
    # One repeat: a rehearsal proves the path, it has no noise worth an interval.
    update = {"model": model, "workloads": workloads, "measure_warm_restart": True, "repeats": 1, "max_repeats": None}
    if spec.tune is not None:  # bakeoff tune --rehearse: a budget that runs each step of the tune once
        update["tune"] = spec.tune.for_rehearsal()
    return spec.model_copy(update=update)


def write_marker(out_dir: Path, source: Path, spec: CampaignSpec, command: str = "campaign run") -> None:
    """The marker that makes a folder a rehearsal, with the steps that run ``spec`` for real on a GPU host.

    ``command``: what the rehearsal stood in for (``campaign run``; ``tune`` for ``bakeoff tune --rehearse``).
    """
    steps = gpu_host_steps(spec, source, out_dir, command)
    write_json(
        out_dir / REHEARSAL_MARKER,
        {
            "rehearsal": True,
            "source_campaign": str(source),
            "command": command,
            "original_model": spec.model.model_dump(mode="json", exclude_none=True),
            "note": "reference-server stand-ins for GPU containers; no figure here is a measurement",
            "gpu_host": {"text": steps.text(REHEARSAL_TAG), "markdown": steps.markdown()},
        },
    )


def gpu_host_text(out_dir: Path) -> str | None:
    """The console form of a rehearsal's "on the GPU host" steps, as its marker recorded them."""
    marker = rehearsal_marker(out_dir)
    steps = marker.get("gpu_host") if marker else None
    return str(steps["text"]) if isinstance(steps, dict) and "text" in steps else None
