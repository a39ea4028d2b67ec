"""The model presets by name: which are generated (random weights) and which are trained.

``tiny`` and ``small`` come from :mod:`.modelgen` (random weights, seconds to make);
``trained`` and its speculative-decoding draft ``trained-draft`` from :mod:`.training`
(minutes, cached by recipe). This module is the one place that tells them apart: making a
preset, telling whether a folder holds it, and finding a campaign's model folder.
"""

from __future__ import annotations

from pathlib import Path

from bakeoff.errors import SpecError
from bakeoff.models.modelgen import PRESETS, make_model, model_is_ready
from bakeoff.models.training import TRAINED_RECIPES, trained_is_ready, trained_model
from bakeoff.paths import models_dir as default_models_dir
from bakeoff.paths import user_cache_dir

PRESET_NAMES = (*PRESETS, *TRAINED_RECIPES)
# Making the trained preset also makes its draft, so speculative decoding has one.
COMPANIONS = {"trained": ("trained-draft",)}


def preset_is_ready(folder: Path, preset: str, seed: int = 0) -> bool:
    if preset in TRAINED_RECIPES:
        return trained_is_ready(folder, TRAINED_RECIPES[preset])
    return model_is_ready(folder, preset, seed)


def make_preset(preset: str, out_dir: Path, seed: int = 0, *, retrain: bool = False) -> str:
    """Generate or train ``preset`` into ``out_dir`` and say how: a trained one comes from the
    cache or the shipped weights when it can (``retrain``: trained all the same)."""
    if preset in TRAINED_RECIPES:
        if seed != 0:
            raise SpecError(f"--seed: the {preset!r} preset is trained from a fixed recipe; leave --seed at 0")
        return trained_model(TRAINED_RECIPES[preset], out_dir, user_cache_dir(), retrain=retrain)
    if retrain:
        raise SpecError(f"--retrain: the {preset!r} preset has random weights, nothing to train; leave --retrain out")
    make_model(preset, out_dir, seed)
    return f"generated (seed {seed})"


def resolve_model_dir(
    preset: str | None, path: Path | None, models_dir: Path | None = None, field: str = "model.path"
) -> Path:
    """The folder a campaign's model lives in; a missing one is an error naming the fix."""
    if path is not None:
        if not (path / "config.json").is_file():
            raise SpecError(f"{field}: {path} has no config.json; point it at a model folder")
        return path
    assert preset is not None
    folder = (models_dir or default_models_dir()) / preset
    if not preset_is_ready(folder, preset):
        raise SpecError(
            f"model.preset: {preset!r} not generated yet at {folder}; run: bakeoff model make --preset {preset}"
        )
    return folder
