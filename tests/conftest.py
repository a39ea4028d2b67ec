"""Shared fixtures: the generated models the real-engine and plan tests use."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.modelgen import DEFAULT_MODELS_DIR, model_is_ready

REPO = Path(__file__).resolve().parents[1]


def _generated(preset: str) -> Path:
    folder = DEFAULT_MODELS_DIR / preset
    if not model_is_ready(folder, preset):
        pytest.fail(f"models/{preset} missing: run `make models` (make test does it)")
    return folder


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return _generated("tiny")


@pytest.fixture(scope="session")
def small_model() -> Path:
    return _generated("small")
