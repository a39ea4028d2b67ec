"""The synthetic world the trained preset learns: deterministic facts, split phrasings, its exam."""

from __future__ import annotations

from dataclasses import replace

from bakeoff.campaign.quality import load_prompt_set
from bakeoff.models.world import (
    END,
    QUESTION_HELDOUT,
    QUESTION_TRAINED,
    WorldRecipe,
    corpus,
    exam,
    exam_jsonl,
    make_world,
    recipe_digest,
)
from bakeoff.paths import shipped

SMALL = WorldRecipe(countries=30, languages=5, documents=400)


def test_the_world_is_a_function_of_its_recipe() -> None:
    assert make_world(SMALL) == make_world(SMALL)
    assert make_world(SMALL) != make_world(replace(SMALL, seed=1))
    assert corpus(SMALL) == corpus(SMALL)


def test_every_capital_names_one_country_so_an_answer_is_one_of_many() -> None:
    world = make_world(SMALL)
    capitals = [c.capital for c in world]
    assert len(set(capitals)) == len(world) == SMALL.countries
    names = {c.name for c in world}
    assert not names & set(capitals)
    assert len({c.language for c in world}) <= SMALL.languages


def test_training_text_uses_trained_phrasings_only() -> None:
    text = "\n".join(corpus(SMALL))
    for template in QUESTION_HELDOUT.values():
        assert template.split("{country}")[0] not in text
    assert QUESTION_TRAINED["capital"].split("{country}")[0] in text
    assert all(doc.endswith(END) for doc in corpus(SMALL))


def test_held_out_documents_differ_from_training_documents() -> None:
    train = set(corpus(SMALL))
    held = corpus(SMALL, held_out=True, documents=200)
    # Same facts and templates, so short documents may coincide; most must be new.
    assert sum(doc not in train for doc in held) > len(held) / 2


def test_exam_answers_are_the_world_facts() -> None:
    world = {c.name: c for c in make_world(SMALL)}
    items = exam(SMALL, per_group=12)
    groups = {i["group"] for i in items}
    assert groups == {"trained-phrasing", "held-out-phrasing", "long-context-recall", "continuation", "held-out-text"}
    # The perplexity texts are held-out documents (the model card's seed), never training ones.
    texts = [i["prompt"] for i in items if i["kind"] == "perplexity"]
    assert len(texts) == 6 and [t + END for t in texts] == corpus(SMALL, held_out=True, documents=len(texts))
    for item in items:
        if item["group"] in ("trained-phrasing", "held-out-phrasing"):
            (country,) = [name for name in world if f" {name}?" in item["prompt"] or f" {name} " in item["prompt"]]
            assert item["answer"] in (world[country].capital, world[country].language)
        if item["group"] == "long-context-recall":
            first = item["prompt"].split(".")[0]  # "The capital of X is Y"
            assert first.endswith(item["answer"])
            assert item["prompt"].count(".") >= SMALL.recall_facts


def test_the_shipped_quality_set_is_the_trained_presets_exam() -> None:
    assert (shipped("quality") / "trained.jsonl").read_text() == exam_jsonl(WorldRecipe())
    assert len(load_prompt_set("trained")) == len(exam(WorldRecipe()))


def test_recipe_digest_follows_every_field() -> None:
    assert recipe_digest(SMALL) == recipe_digest(SMALL)
    assert recipe_digest(SMALL) != recipe_digest(replace(SMALL, documents=401))
