"""The `training` tier: the trained presets' recipes still produce the weights bakeoff ships.

Training the draft takes about a minute of one core and the target five, so this tier is not
part of `make test`: it runs with `make ship-trained`, the step a recipe change requires (the
unit test that the shipped weights carry the current recipe key fails until it is taken).
Float rounding differs between hosts (AVX2 and AVX-512 builds of torch), so the comparison is
of what the card measures, not of the bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakeoff.models import training

pytestmark = pytest.mark.training


@pytest.mark.parametrize("recipe", list(training.TRAINED_RECIPES.values()), ids=list(training.TRAINED_RECIPES))
def test_the_recipe_trains_the_model_it_ships(recipe: training.TrainRecipe, tmp_path: Path) -> None:
    folder = training.shipped_weights(recipe)
    assert folder is not None, f"no shipped weights for {training.recipe_key(recipe)}: run `make ship-trained`"
    shipped = json.loads((folder / "bakeoff-model.json").read_text())
    card = training.train(recipe, tmp_path / recipe.name)
    assert card["recipe_key"] == shipped["recipe_key"]
    assert card["training"]["final_loss"] == pytest.approx(shipped["training"]["final_loss"], rel=0.05)
    assert card["held_out_perplexity"] == pytest.approx(shipped["held_out_perplexity"], rel=0.05)
    assert card["exact_rate"] == pytest.approx(shipped["exact_rate"], abs=0.1)
