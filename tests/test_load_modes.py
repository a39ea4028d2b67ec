"""Load modes: every plan mode has one registered object, and what the readers ask of it."""

from __future__ import annotations

from typing import ClassVar, get_args

import pytest

from bakeoff.measure.load_modes import (
    LoadMode,
    load_axis,
    load_level,
    load_mode,
    load_text,
    prefix_sharing_modes,
    register,
    swept_modes,
)
from bakeoff.workloads.plans import Mode


def test_every_plan_mode_has_a_registered_load_mode() -> None:
    assert {load_mode(name).name for name in get_args(Mode)} == set(get_args(Mode))


def test_levels_and_verdict_axes_by_mode() -> None:
    assert load_level("closed", 8, None) == ("concurrency", 8.0)
    assert load_level("open", 4, 2.5) == ("rate", 2.5)
    assert load_level("sessions", 4, None) is None
    assert load_level("tasks", 2, None) is None  # the sweep never stops early on task trees
    assert load_level(None, 8, 2.0) is None  # a summary without a mode
    assert load_axis("tasks", 2, None) == ("tasks in flight", 2.0)
    assert load_axis("tasks", None, 0.5) == ("task rate", 0.5)
    assert load_axis("open", None, None) is None


def test_a_load_reads_as_its_axis_says() -> None:
    assert load_text("concurrency", 8) == "concurrency 8"
    assert load_text("rate", 2.5) == "2.5 req/s"
    assert load_text("tasks in flight", 3) == "3 tasks in flight"
    assert load_text("task rate", 0.5) == "0.5 tasks/s"
    with pytest.raises(KeyError, match="axis"):
        load_text("nonsense", 1)


def test_the_registry_refuses_unknown_and_duplicate_modes() -> None:
    with pytest.raises(KeyError, match="known: closed, open, sessions, tasks"):
        load_mode("bursty")

    class Again(LoadMode):
        name: ClassVar[str] = "closed"

    with pytest.raises(ValueError, match="registered twice"):
        register(Again)
    assert swept_modes() == [("closed", "concurrency"), ("open", "rate")]
    assert prefix_sharing_modes() == ["sessions", "tasks"]
