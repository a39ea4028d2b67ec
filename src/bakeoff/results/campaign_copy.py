"""The campaign as run, as the readers below the campaign stage see it: :class:`CampaignCopy`.

A campaign folder keeps its ``campaign.yaml`` (the user's file, comments and all, or the
validated spec where paths had to be made absolute), and report, analysis and history read it
back. They sit below :mod:`bakeoff.campaign`, so they cannot use its spec
(:class:`bakeoff.campaign.specs.CampaignSpec`, which composes sections owned by the stages
above them), and an archived folder may hold a campaign an older bakeoff wrote, which today's
strict spec could refuse. This view names every field those readers use, typed as the file may
spell it (``min_effect: 5%``, a model as a shorthand string or a mapping), with the spec's
defaults; every other key is kept as written, so a reader that writes a new campaign from it
(``bakeoff advise``) copies sections unchanged. :func:`bakeoff.results.layout.read_campaign_copy`
is its one loader.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ServerCopy(BaseModel):
    """One ``servers:`` entry as written."""

    model_config = ConfigDict(extra="allow")

    backend: str
    label: str | None = None
    url: str | None = None  # an external server: not launched by bakeoff
    knobs: dict[str, Any] = Field(default_factory=dict)
    model_path: str | None = None

    @property
    def name(self) -> str:
        """The server's label in every table (its backend where the campaign gave none)."""
        return self.label or self.backend

    def written(self) -> dict[str, Any]:
        """The entry as the file wrote it (keys it left out stay out)."""
        return self.model_dump(exclude_unset=True)


class CampaignCopy(BaseModel):
    """A campaign folder's ``campaign.yaml``: the fields its readers use, the rest kept as written."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    description: str = ""
    model: str | dict[str, Any] | None = None  # a preset or path shorthand, or the model's mapping
    servers: list[ServerCopy] = Field(default_factory=list)
    # Workload kinds are modelled above this layer (bakeoff.workloads.kinds): their entries as written.
    workloads: list[dict[str, Any]] = Field(default_factory=list)
    slo: dict[str, Any] | None = None
    gpu: bool = False
    kv_pool: dict[str, Any] | None = None
    memory_bandwidth_gbs: float | None = None
    repeats: int | Literal["auto"] = 3
    min_repeats: int = 2
    max_repeats: int | None = None
    min_effect: float | str | None = None  # None: the verdict's default margin; "5%" as a file may spell it
    interleave: bool = True
    warm_repeats: bool = False
    regression: dict[str, float | str] | None = None  # bakeoff compare's gate, as written

    def sections(self, keys: tuple[str, ...]) -> dict[str, Any]:
        """Those of ``keys`` the file wrote, as written: what a campaign written from this one carries over."""
        written = self.model_dump(exclude_unset=True)
        return {k: written[k] for k in keys if k in written}

    def workload_name(self, entry: dict[str, Any]) -> str:
        """A workload entry's name in cell folders and tables (its kind where it has no name)."""
        return str(entry.get("name") or entry.get("kind"))

    def model_label(self) -> str | None:
        """The campaign's model as history lists it: its hub id, preset or path."""
        model = self.model
        if isinstance(model, dict):
            return str(model.get("hf_id") or model.get("preset") or model.get("path") or "") or None
        return str(model) if model else None
