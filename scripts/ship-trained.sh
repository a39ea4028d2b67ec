#!/usr/bin/env bash
# Retrain the trained presets (trained, trained-draft) from their recipes and ship the weights in
# pretrained/<recipe key>/ with a SHA256SUMS manifest: the step a recipe change needs (the unit
# test that the shipped weights carry the current recipe key fails until it is taken). Then the
# `training` tier checks that the recipes train what is shipped. About 7 min on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/bakeoff model make --preset trained --retrain
.venv/bin/python - <<'PY'
from pathlib import Path

from bakeoff.models.training import TRAINED_RECIPES, ship
from bakeoff.paths import user_cache_dir

for recipe in TRAINED_RECIPES.values():
    print(f"ship-trained: {ship(recipe, user_cache_dir(), Path('pretrained'))}")
PY
.venv/bin/pytest -m training -p no:randomly -q
echo "ship-trained: commit pretrained/ (git add -A pretrained)"
