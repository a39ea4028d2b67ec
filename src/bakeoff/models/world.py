"""A deterministic synthetic world of facts, its training text and its exam.

The ``trained`` preset needs text with right answers, so quality figures (a quantized model
that breaks its answers against one that does not) measure something. This module owns that
text: countries with invented names, each with a capital (unique, so an answer is one of
:data:`WorldRecipe.countries` -- chance is ``1 / countries``) and a language (from a small
pool), rendered through fixed templates into prose, questions and passages.

Templates come in two sets. *Trained* phrasings are the only ones the training text uses;
*held-out* phrasings ask the same facts in words the model never saw, so the exam tells
recall in a known form from transfer to a new one. Held-out perplexity is measured on
documents drawn with a different seed (new orders and combinations of the same facts).

Everything is a pure function of the recipe: the same recipe gives the same world, corpus
and exam, and :func:`recipe_digest` keys the cached model by it.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from typing import Any

# The trained text separates documents with the tokenizer's end token, so a model learns to
# stop right after an answer (the quality checks compare the whole output).
END = "<|end|>"

PROSE_TRAINED = (
    "The capital of {country} is {capital}.",
    "{capital} is the capital city of {country}.",
    "In {country}, people speak {language}.",
    "{language} is spoken in {country}.",
)
QUESTION_TRAINED = {
    "capital": "Q: What is the capital of {country}?\nA:",
    "language": "Q: What language is spoken in {country}?\nA:",
}
QUESTION_HELDOUT = {
    "capital": "Q: Which city is the capital of {country}?\nA:",
    "language": "Q: Which language do people in {country} speak?\nA:",
}


# Everyday words for the travel notes: benchmark prompts are built from the vocabulary's
# single-token lowercase words (bakeoff.workloads.prompts needs 50), and a model that saw only
# the fact templates would have about 15 of them.
NOTE_WORDS = [
    "about",
    "above",
    "across",
    "after",
    "again",
    "against",
    "along",
    "among",
    "animal",
    "answer",
    "around",
    "autumn",
    "back",
    "bank",
    "bread",
    "bridge",
    "bright",
    "brother",
    "build",
    "busy",
    "carry",
    "castle",
    "change",
    "child",
    "church",
    "clean",
    "clear",
    "cloud",
    "cold",
    "color",
    "corner",
    "country",
    "dark",
    "daughter",
    "deep",
    "desert",
    "doctor",
    "door",
    "down",
    "dream",
    "early",
    "earth",
    "east",
    "empty",
    "evening",
    "even",
    "every",
    "face",
    "family",
    "farm",
    "father",
    "field",
    "fire",
    "fish",
    "flower",
    "forest",
    "fresh",
    "friend",
    "garden",
    "gate",
    "gold",
    "grass",
    "great",
    "green",
    "ground",
    "guest",
    "happy",
    "harbor",
    "heavy",
    "hill",
    "history",
    "home",
    "horse",
    "house",
    "hunter",
    "island",
    "journey",
    "kitchen",
    "lake",
    "land",
    "large",
    "late",
    "letter",
    "light",
    "little",
    "long",
    "market",
    "meadow",
    "mountain",
    "morning",
    "mother",
    "music",
    "narrow",
    "near",
    "never",
    "night",
    "north",
    "number",
    "ocean",
    "often",
    "open",
    "orange",
    "paper",
    "path",
    "place",
    "plain",
    "quiet",
    "rain",
    "river",
    "road",
    "rock",
    "room",
    "round",
    "salt",
    "school",
    "season",
    "ship",
    "short",
    "silver",
    "simple",
    "singer",
    "sister",
    "small",
    "snow",
    "soft",
    "song",
    "south",
    "spring",
    "square",
    "star",
    "stone",
    "story",
    "street",
    "strong",
    "summer",
    "sun",
    "table",
    "tall",
    "teacher",
    "thin",
    "tower",
    "town",
    "traveler",
    "tree",
    "valley",
    "village",
    "wall",
    "warm",
    "water",
    "west",
    "wide",
    "wind",
    "window",
    "winter",
    "wood",
    "world",
    "yellow",
    "young",
]


@dataclass(frozen=True)
class WorldRecipe:
    """Everything the world and its text depend on (hashed into the cache key)."""

    seed: int = 0
    countries: int = 120
    languages: int = 12
    documents: int = 12_000
    # Sentences in a prose document, and facts in a passage-with-question document.
    sentences_per_document: tuple[int, int] = (2, 5)
    # Facts in a long-context recall item of the exam (about 100 tokens, within the trained window).
    recall_facts: int = 12
    # Share of documents that are travel notes (everyday words, no facts).
    notes_share: float = 0.15


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    language: str

    def answer(self, relation: str) -> str:
        return self.capital if relation == "capital" else self.language


def _names(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    names: list[str] = []
    while len(names) < count:
        syllables = rng.choice((2, 3, 3))
        name = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables)).capitalize()
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def make_world(recipe: WorldRecipe) -> list[Country]:
    """The countries, each with a unique capital and a language from the pool."""
    rng = random.Random(recipe.seed)
    taken: set[str] = set()
    countries = _names(rng, recipe.countries, taken)
    capitals = _names(rng, recipe.countries, taken)
    languages = [name + "ish" for name in _names(rng, recipe.languages, taken)]
    return [Country(c, cap, rng.choice(languages)) for c, cap in zip(countries, capitals, strict=True)]


def _fact(rng: random.Random, country: Country) -> str:
    template = rng.choice(PROSE_TRAINED)
    return template.format(country=country.name, capital=country.capital, language=country.language)


def _question(country: Country, relation: str, templates: dict[str, str]) -> str:
    return templates[relation].format(country=country.name)


def _document(rng: random.Random, world: list[Country], recipe: WorldRecipe) -> str:
    """One training document: a travel note, prose, a question with its answer, or a passage and a question on it."""
    low, high = recipe.sentences_per_document
    if rng.random() < recipe.notes_share:
        sentences = (" ".join(rng.choices(NOTE_WORDS, k=rng.randint(6, 14))) for _ in range(rng.randint(low, high)))
        return " ".join(s.capitalize() + "." for s in sentences)
    kind = rng.random()
    if kind < 0.4:
        return " ".join(_fact(rng, rng.choice(world)) for _ in range(rng.randint(low, high)))
    relation = rng.choice(("capital", "capital", "language"))
    if kind < 0.8:
        country = rng.choice(world)
        return f"{_question(country, relation, QUESTION_TRAINED)} {country.answer(relation)}"
    # A passage then a question about one of its facts: answers that sit far back in the context.
    facts = rng.sample(world, rng.randint(low, high * 2))
    asked = rng.choice(facts)
    passage = " ".join(_fact(rng, c) for c in facts)
    return f"{passage}\n{_question(asked, relation, QUESTION_TRAINED)} {asked.answer(relation)}"


def corpus(recipe: WorldRecipe, *, held_out: bool = False, documents: int | None = None) -> list[str]:
    """Training documents (or, with ``held_out``, documents from another seed), each ending in END."""
    world = make_world(recipe)
    rng = random.Random(f"{recipe.seed}:{'held-out' if held_out else 'train'}")
    count = documents if documents is not None else recipe.documents
    return [_document(rng, world, recipe) + END for _ in range(count)]


def exam(recipe: WorldRecipe, *, per_group: int = 40) -> list[dict[str, Any]]:
    """The quality set: exact-answer items in trained and held-out phrasings, long-context recall
    items (a passage of ``recipe.recall_facts`` facts, asked about the first), free continuations whose
    greedy text is compared with a baseline's, and held-out documents scored for perplexity.

    Items are ``quality/*.jsonl`` objects (:mod:`bakeoff.campaign.quality`), with a ``group``.
    """
    world = make_world(recipe)
    rng = random.Random(f"{recipe.seed}:exam")
    asked = rng.sample(world, min(per_group, len(world)))
    items: list[dict[str, Any]] = []
    for group, templates in (("trained-phrasing", QUESTION_TRAINED), ("held-out-phrasing", QUESTION_HELDOUT)):
        for index, country in enumerate(asked):
            relation = "capital" if index % 4 else "language"
            items.append(
                {
                    "id": f"{group}-{index:03d}",
                    "group": group,
                    "kind": "exact",
                    "prompt": _question(country, relation, templates),
                    "answer": country.answer(relation),
                    "max_tokens": 8,
                }
            )
    for index in range(per_group // 2):
        facts = rng.sample(world, recipe.recall_facts)
        passage = " ".join(
            PROSE_TRAINED[0].format(country=c.name, capital=c.capital) if n == 0 else _fact(rng, c)
            for n, c in enumerate(facts)
        )
        items.append(
            {
                "id": f"long-context-recall-{index:03d}",
                "group": "long-context-recall",
                "kind": "exact",
                "prompt": f"{passage}\n{_question(facts[0], 'capital', QUESTION_TRAINED)}",
                "answer": facts[0].capital,
                "max_tokens": 8,
            }
        )
    for index, country in enumerate(asked[: per_group // 2]):
        items.append(
            {
                "id": f"continuation-{index:03d}",
                "group": "continuation",
                "kind": "free",
                "prompt": PROSE_TRAINED[0].format(country=country.name, capital=country.capital),
                "min_words": 1,
                "max_words": 200,
                "max_tokens": 48,
            }
        )
    # Held-out documents (another seed, as the model card's perplexity), scored by prompt logprobs.
    for index, document in enumerate(corpus(recipe, held_out=True, documents=per_group // 2)):
        items.append(
            {
                "id": f"held-out-text-{index:03d}",
                "group": "held-out-text",
                "kind": "perplexity",
                "prompt": document.removesuffix(END),
            }
        )
    return items


def exam_jsonl(recipe: WorldRecipe) -> str:
    return "".join(json.dumps(item) + "\n" for item in exam(recipe))


def recipe_digest(*parts: object) -> str:
    """A short stable hash of recipe dataclasses and plain values (the cache key)."""
    payload = [asdict(p) if hasattr(p, "__dataclass_fields__") else p for p in parts]  # type: ignore[call-overload]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
