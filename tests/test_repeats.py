"""Repeats: every cell measured several times, interleaved so drift favours no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.analysis.verdict import auto_repeats_note, verdicts
from bakeoff.campaign.cells import expand
from bakeoff.campaign.execute import auto_stop
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.errors import SpecError
from bakeoff.results.layout import AUTO_REPEATS
from bakeoff.results.store import read_json
from verdict_planted import campaign

BASE = {
    "name": "r",
    "model": {"preset": "tiny"},
    "servers": [{"backend": "llamacpp", "label": "a"}, {"backend": "llamacpp", "label": "b"}],
    "workloads": [{"kind": "concurrency", "name": "w", "levels": [1], "input_len": 8, "output_len": 4}],
}


def order(**extra: object) -> list[str]:
    return [c.cell_id for c in expand(CampaignSpec.model_validate({**BASE, **extra}), None)]


def test_repeats_interleave_across_servers_by_default_in_counterbalanced_order() -> None:
    assert CampaignSpec.model_validate(BASE).repeats == 3
    # a b / b a / a b: no server always runs first in its round.
    assert order() == ["a__w", "b__w", "b__w__r2", "a__w__r2", "a__w__r3", "b__w__r3"]


def test_repeats_back_to_back_when_interleaving_is_off() -> None:
    assert order(repeats=2, interleave=False) == ["a__w", "a__w__r2", "b__w", "b__w__r2"]
    assert order(repeats=1) == ["a__w", "b__w"]  # one repeat keeps the plain folder names


def test_repeats_out_of_range_are_refused_naming_the_field(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "repeats": 0}))
    with pytest.raises(SpecError, match="repeats"):
        load_campaign(path)


def test_auto_repeats_plan_up_to_max_repeats_and_refuse_what_cannot_work() -> None:
    auto = CampaignSpec.model_validate({**BASE, "repeats": "auto", "max_repeats": 4})
    assert auto.planned_repeats == 4 and auto.min_repeats == 2
    assert order(repeats="auto", max_repeats=4)[-2:] == ["b__w__r4", "a__w__r4"]
    for extra, message in (
        ({"repeats": "auto"}, "repeats: auto needs max_repeats"),
        ({"repeats": 3, "max_repeats": 5}, "max_repeats applies to repeats: auto"),
        ({"repeats": "auto", "max_repeats": 3, "min_repeats": 4}, r"max_repeats \(3\) must be at least min_repeats"),
        ({"repeats": "auto", "max_repeats": 4, "interleave": False}, "needs interleave: true"),
        ({"min_effect": "150%"}, "min_effect"),
    ):
        with pytest.raises(ValueError, match=message):
            CampaignSpec.model_validate({**BASE, **extra})
    assert CampaignSpec.model_validate({**BASE, "min_effect": "3%"}).min_effect == pytest.approx(0.03)


AUTO = {"repeats": "auto", "min_repeats": 2, "max_repeats": 6}


def rounds(tmp_path: Path, a: list[float], b: list[float]) -> int:
    """Feed planted rounds to the auto-repeat rule as a campaign would; the round it stops after."""
    spec = CampaignSpec.model_validate({**BASE, **AUTO})
    for done in range(1, len(a) + 1):
        folder = campaign(tmp_path, {"a": {4: a[:done]}, "b": {4: b[:done]}}, **AUTO)
        if auto_stop(folder, spec, done):
            return done
    raise AssertionError("never stopped")


def test_auto_repeats_stop_once_a_30_percent_difference_is_decided(tmp_path: Path) -> None:
    a = [130.0, 127.0, 133.0, 129.0, 131.0, 128.0]
    b = [100.0, 102.0, 98.0, 101.0, 99.0, 100.5]
    stopped = rounds(tmp_path, a, b)
    assert stopped < 6
    assert read_json(tmp_path / AUTO_REPEATS) == {
        "rounds": stopped, "max_repeats": 6, "why": "every verdict decided", "undecided": []
    }  # fmt: skip
    (found,) = verdicts(tmp_path)
    assert found.levels[4.0].winner == "a"
    note = auto_repeats_note(tmp_path)
    assert note is not None and f"{stopped} round(s) of at most 6: every verdict decided" in note


def test_auto_repeats_never_call_a_win_between_identical_noisy_servers(tmp_path: Path) -> None:
    a = [100.0, 112.0, 91.0, 104.0, 96.0, 109.0]
    b = [103.0, 94.0, 109.0, 99.0, 111.0, 92.0]
    assert rounds(tmp_path, a, b) == 6
    found = read_json(tmp_path / AUTO_REPEATS)
    assert found["why"] == "max_repeats reached" and found["undecided"] == ["sweep at concurrency 4: b vs a"]
    (verdict,) = verdicts(tmp_path)
    other = verdict.levels[4.0].standings[1].against_best
    # Noise about 11% per round: the interval spans far more than the ±5% margin, so neither a win
    # nor equivalence can be claimed after six rounds; undecided, as auto-repeats recorded.
    assert other is not None and other.outcome == "undecided", other
    assert other.lo < 0.95 and other.hi > 1.05
    assert other.alpha == pytest.approx(0.05 / 5)  # five planned looks (rounds 2..6) share the 5%
