"""Repeats: every cell measured several times, interleaved so drift favours no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.campaign.cells import expand
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.errors import SpecError

BASE = {
    "name": "r",
    "model": {"preset": "tiny"},
    "servers": [{"backend": "llamacpp", "label": "a"}, {"backend": "llamacpp", "label": "b"}],
    "workloads": [{"kind": "concurrency", "name": "w", "levels": [1], "input_len": 8, "output_len": 4}],
}


def order(**extra: object) -> list[str]:
    return [c.cell_id for c in expand(CampaignSpec.model_validate({**BASE, **extra}), None)]


def test_repeats_interleave_across_servers_by_default() -> None:
    assert CampaignSpec.model_validate(BASE).repeats == 3
    assert order() == ["a__w", "b__w", "a__w__r2", "b__w__r2", "a__w__r3", "b__w__r3"]


def test_repeats_back_to_back_when_interleaving_is_off() -> None:
    assert order(repeats=2, interleave=False) == ["a__w", "a__w__r2", "b__w", "b__w__r2"]
    assert order(repeats=1) == ["a__w", "b__w"]  # one repeat keeps the plain folder names


def test_repeats_out_of_range_are_refused_naming_the_field(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "repeats": 0}))
    with pytest.raises(SpecError, match="repeats"):
        load_campaign(path)
