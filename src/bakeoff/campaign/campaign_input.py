"""The campaign a run executes: the file the user named, and the spec that runs from it.

A rehearsal is a transform of the spec, made once here (:func:`load_input` with ``rehearse``):
the spec that runs is the scaled-down copy whose servers carry the rehearsal launcher
(:func:`bakeoff.campaign.rehearsal.rehearsal_spec`), and the spec as written is kept as the one
stood in for. Everything below the entry points reads the rehearsal from this object or from
the servers it runs, never from a flag handed down.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bakeoff.campaign.rehearsal import rehearsal_spec
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.errors import SpecError
from bakeoff.results.layout import REHEARSAL_TAG


@dataclass(frozen=True)
class CampaignInput:
    """One campaign file and the spec a run of it executes."""

    path: Path  # the campaign file as the user named it (a ladder's: the step campaign it derived)
    spec: CampaignSpec  # what runs: the file's spec, or its rehearsal copy
    stood_in: CampaignSpec | None = None  # a rehearsal: the spec as written, which it stands in for

    @property
    def rehearsal(self) -> bool:
        """Reference-server stand-ins for the GPU containers: nothing of this run is a measurement."""
        return self.stood_in is not None

    @property
    def written(self) -> CampaignSpec:
        """The spec as the file says (a rehearsal's original, before scaling down)."""
        return self.stood_in if self.stood_in is not None else self.spec

    @property
    def tag(self) -> str:
        """The console tag of this run's lines: REHEARSAL, or nothing."""
        return REHEARSAL_TAG if self.rehearsal else ""

    @property
    def suffix(self) -> str:
        """What a default report folder's name ends with, so a rehearsal never lands beside real runs."""
        return "-rehearsal" if self.rehearsal else ""

    def derived(self, path: Path) -> CampaignInput:
        """Another campaign file made from this one (a ladder's steps so far), run the same way."""
        return load_input(path, rehearse=self.rehearsal)


def load_input(path: Path, *, rehearse: bool = False) -> CampaignInput:
    """The campaign at ``path`` as a run executes it; with ``rehearse``, its rehearsal copy.

    The rehearsal launcher is set here alone: a campaign file that writes it is refused, since
    its run would serve stand-ins without the marker that says so on every page.
    """
    spec = load_campaign(path)
    for i, server in enumerate(spec.servers):
        if server.launcher is not None:
            raise SpecError(
                f"{path}: servers[{i}].launcher: set by --rehearse, never in a campaign file; remove it "
                "(and add --rehearse to run the stand-ins)"
            )
    return CampaignInput(path, rehearsal_spec(spec), spec) if rehearse else CampaignInput(path, spec)


def as_input(campaign: Path | CampaignInput) -> CampaignInput:
    """A path as the campaign it names, run as written; a :class:`CampaignInput` as it is."""
    return campaign if isinstance(campaign, CampaignInput) else load_input(campaign)
