"""The trained preset's cache, shipped weights, readiness and model card.

Training itself is the `training` tier (tests/test_training_tier.py, `make ship-trained`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bakeoff.errors import SpecError
from bakeoff.models import training
from bakeoff.models.model_source import PRESET_CHOICES
from bakeoff.models.presets import PRESET_NAMES, make_preset, preset_is_ready, resolve_model_dir

CARD: dict[str, Any] = {
    "preset": "trained",
    "parameters": 852_864,
    "recipe_key": "trained-abc",
    "training": {
        "steps": 800,
        "batch_size": 16,
        "seq_len": 128,
        "tokens_seen": 1_638_400,
        "corpus_tokens": 330_368,
        "seconds": 512.3,
        "threads": 1,
        "final_loss": 0.91,
    },
    "held_out_perplexity": 3.217,
    "exact_rate": {"held-out-phrasing": 0.05, "long-context-recall": 0.4, "trained-phrasing": 0.625},
    "chance_rate": 1 / 120,
    "world": {"countries": 120, "recall_facts": 12},
}


def test_the_card_states_budget_perplexity_and_rates() -> None:
    text = training.model_card(CARD)
    assert "800 steps x 16 windows x 128 tokens = 1,638,400 tokens" in text
    assert "512 s on 1 CPU threads" in text
    assert "Held-out perplexity (documents from another seed): 3.217" in text
    assert "| trained-phrasing | 62.5% |" in text and "| held-out-phrasing | 5.0% |" in text
    assert "(chance: 0.8%)" in text and "0.85M-parameter" in text
    assert "a passage of 12 facts" in text


def test_every_recipe_field_changes_the_cache_key() -> None:
    key = training.recipe_key(training.TRAINED)
    assert training.recipe_key(replace(training.TRAINED, steps=801)) != key
    assert training.recipe_key(replace(training.TRAINED, world=replace(training.TRAINED.world, seed=1))) != key
    assert training.recipe_key(training.TRAINED_DRAFT) != key


def test_a_trained_model_is_trained_once_then_copied_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained: list[str] = []

    def fake_train(recipe: training.TrainRecipe, out_dir: Path, threads: int | None = None) -> dict[str, Any]:
        trained.append(recipe.name)
        out_dir.mkdir(parents=True)
        card = {**CARD, "preset": recipe.name, "recipe_key": training.recipe_key(recipe)}
        (out_dir / "bakeoff-model.json").write_text(json.dumps(card))
        (out_dir / "config.json").write_text("{}")
        return card

    monkeypatch.setattr(training, "train", fake_train)
    monkeypatch.setattr(training, "shipped_weights", lambda recipe: None)  # a recipe bakeoff ships no weights for
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(tmp_path / "cache"))
    models = tmp_path / "models"
    assert not preset_is_ready(models / "trained", "trained")
    with pytest.raises(SpecError, match="bakeoff model make --preset trained"):
        resolve_model_dir("trained", None, models)
    make_preset("trained", models / "trained")
    make_preset("trained", tmp_path / "elsewhere")
    assert trained == ["trained"]
    assert preset_is_ready(models / "trained", "trained")
    assert resolve_model_dir("trained", None, models) == models / "trained"
    assert not list((tmp_path / "cache" / "models").glob("*.partial"))
    with pytest.raises(SpecError, match="--seed"):
        make_preset("trained", models / "x", seed=3)


def test_a_campaign_accepts_every_preset_model_make_makes() -> None:
    assert set(PRESET_CHOICES) == set(PRESET_NAMES)


def test_the_trained_tokenizer_has_the_words_benchmark_prompts_are_built_from(tmp_path: Path) -> None:
    from bakeoff.workloads.prompts import MIN_WORDS, PromptFactory, load_tokenizer

    tokenizer = training._tokenizer(training.TRAINED)
    tokenizer.save_pretrained(tmp_path)
    assert len(PromptFactory(load_tokenizer(tmp_path)).words) >= MIN_WORDS
    # Names are whole tokens (what lets a small model learn facts fast).
    assert tokenizer.tokenize(" Duri Fibi") == ["ĠDuri", "ĠFibi"]


def test_the_shipped_weights_are_the_current_recipes_and_match_their_manifest() -> None:
    for recipe in training.TRAINED_RECIPES.values():
        folder = training.shipped_weights(recipe)
        assert folder is not None, (
            f"pretrained/ has no weights for {training.recipe_key(recipe)}: the recipe changed; "
            "retrain and ship them with `make ship-trained`"
        )
        card = json.loads((folder / "bakeoff-model.json").read_text())
        assert card["recipe_key"] == training.recipe_key(recipe) == folder.name
        assert training.manifest_problems(folder) == []


def test_a_fresh_machine_copies_the_shipped_weights_instead_of_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_training(*args: object, **kwargs: object) -> dict[str, Any]:
        raise AssertionError("trained although the shipped weights fit the recipe")

    monkeypatch.setattr(training, "train", no_training)
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(tmp_path / "cache"))
    how = make_preset("trained-draft", tmp_path / "models" / "trained-draft")
    assert how.startswith("copied the shipped weights pretrained/trained-draft-")
    assert preset_is_ready(tmp_path / "models" / "trained-draft", "trained-draft")
    assert make_preset("trained-draft", tmp_path / "again").startswith("copied from the cache")


def test_shipped_weights_that_differ_from_their_manifest_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = training.shipped_weights(training.TRAINED_DRAFT)
    assert source is not None
    broken = tmp_path / "pretrained" / source.name
    shutil.copytree(source, broken)
    weights = broken / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(training, "shipped_weights", lambda recipe: broken)
    monkeypatch.setenv("BAKEOFF_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(SpecError, match=r"model.safetensors: sha256 differs from SHA256SUMS.*--retrain"):
        make_preset("trained-draft", tmp_path / "models" / "trained-draft")
    assert not (tmp_path / "cache" / "models" / source.name).exists()


def test_the_shipped_target_answers_its_exam_as_its_card_says() -> None:
    """The shipped files are the model the card describes: greedy answers score the card's rates."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = training.shipped_weights(training.TRAINED)
    assert folder is not None
    card = json.loads((folder / "bakeoff-model.json").read_text())
    model = LlamaForCausalLM.from_pretrained(folder).float().eval()
    rates = training.exam_rates(model, AutoTokenizer.from_pretrained(folder), training.TRAINED)
    assert rates == pytest.approx(card["exact_rate"], abs=0.05)
    assert min(rates.values()) > 10 * card["chance_rate"]
