"""Shared fixtures: the generated models and small helpers for real-engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakeoff.modelgen import DEFAULT_MODELS_DIR, model_is_ready

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    folder = DEFAULT_MODELS_DIR / "tiny"
    if not model_is_ready(folder, "tiny"):
        pytest.fail("models/tiny missing: run `make models` (make test does it)")
    return folder


@pytest.fixture(scope="session")
def small_model() -> Path:
    folder = DEFAULT_MODELS_DIR / "small"
    if not model_is_ready(folder, "small"):
        pytest.fail("models/small missing: run `make models` (make test does it)")
    return folder
