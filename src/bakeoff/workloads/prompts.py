"""Token-exact prompt text: N tokens in means exactly N tokens to the model's tokenizer.

The trick: keep a lexicon of words that, with their leading space, are a single token of
the tokenizer, so a string of N such words encodes to exactly N tokens
(``add_special_tokens=False``: BOS and the chat template are the server's, not the body's).
Two tokenizer families spell that leading space in their vocabulary, told apart by
``tokenizer.json``'s pre-tokenizer and normalizer:

- byte-level BPE (GPT-2, Llama 3, Qwen): a ByteLevel pre-tokenizer, 'Ġword' is " word".
  It splits text before each space, so the words never merge with their neighbours.
- SentencePiece-style (Llama 2, Mistral, Gemma): '▁word' is " word", spaces become '▁'
  in a Metaspace pre-tokenizer or a Replace normalizer. Two traps at a text's start:
  Metaspace adds a '▁' to a first word that lacks one (``prepend_scheme`` first/always)
  but not after a special token (first), so every word carries its own space and never
  gets a second one; the legacy layout of Llama 2's and Mistral 7B v0.1's files prepends
  '▁' to every text in its normalizer (a "dummy prefix"), so there a text starts bare and
  the normalizer supplies its first word's '▁'.

The first word of a text comes from the words that are also one token without their
space (when the vocabulary has enough), so a chat template that trims the message
(Llama 2's, Llama 3's) or puts it after a newline still sees N tokens. Each word is
checked by encoding it with the tokenizer itself, and words that a vocabulary piece could
join to their neighbour are left out. Without a tokenizer, bakeoff falls back to a fixed
word list and says the lengths are approximate.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tokenizers import Tokenizer

from bakeoff.errors import SpecError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Used only without a tokenizer: common words that most BPE vocabularies hold as one token.
_FALLBACK_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "that",
    "with",
    "as",
    "on",
    "by",
    "at",
    "from",
    "his",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "has",
    "had",
    "not",
    "but",
    "one",
    "they",
    "all",
    "new",
    "more",
    "time",
    "year",
    "when",
    "two",
    "there",
    "can",
    "been",
    "other",
    "first",
    "would",
    "after",
    "who",
    "its",
    "also",
    "up",
    "out",
    "into",
    "only",
    "than",
    "most",
    "over",
    "some",
    "these",
    "such",
    "between",
]


# Fewer words than this make prompts too repetitive to stand for text (and prefix caches notice).
MIN_WORDS = 50
# Fewer lead words than this and any word may start a text: variety beats the trimming templates.
MIN_LEAD_WORDS = 16
BYTE_LEVEL_MARKER = "Ġ"
SENTENCEPIECE_MARKER = "▁"


@dataclass(frozen=True)
class TokenizerFamily:
    """How a tokenizer spells a leading space, read from its ``tokenizer.json``."""

    name: Literal["byte_level", "sentencepiece"]
    marker: str  # the vocabulary's spelling of a leading space: 'Ġ' or '▁'
    dummy_prefix: bool  # the normalizer prepends the marker to every text (legacy SentencePiece layout)
    evidence: str  # what in tokenizer.json decided it, for messages

    def describe(self) -> str:
        label = "byte-level BPE" if self.name == "byte_level" else "SentencePiece-style"
        return f"{label} tokenizer ({self.evidence}; {self.marker!r} marks a leading space)"


def _nodes(component: dict[str, Any] | None, children: str) -> list[dict[str, Any]]:
    """A tokenizer.json component and, for a Sequence, every component nested in it."""
    if not component:
        return []
    found = [component]
    for child in component.get(children) or []:
        found += _nodes(child, children)
    return found


def _types(nodes: list[dict[str, Any]]) -> str:
    return "+".join(str(n.get("type")) for n in nodes) or "none"


def detect_family(config: dict[str, Any], source: str = "tokenizer.json") -> TokenizerFamily:
    """The family of a parsed ``tokenizer.json``; an error naming what was found when neither."""
    pre = _nodes(config.get("pre_tokenizer"), "pretokenizers")
    norm = _nodes(config.get("normalizer"), "normalizers")
    if any(n.get("type") == "ByteLevel" for n in pre):
        return TokenizerFamily("byte_level", BYTE_LEVEL_MARKER, False, "ByteLevel pre-tokenizer")
    for node in pre:
        if node.get("type") == "Metaspace":
            scheme = node.get("prepend_scheme") or ("always" if node.get("add_prefix_space", True) else "never")
            marker = str(node.get("replacement") or SENTENCEPIECE_MARKER)
            return TokenizerFamily("sentencepiece", marker, False, f"Metaspace pre-tokenizer, prepend_scheme {scheme}")
    for node in norm:
        if node.get("type") == "Replace" and (node.get("pattern") or {}).get("String") == " ":
            marker = str(node.get("content") or SENTENCEPIECE_MARKER)
            dummy = any(n.get("type") == "Prepend" and n.get("prepend") == marker for n in norm)
            evidence = "normalizer replaces ' '" + (f" and prepends {marker!r} (dummy prefix)" if dummy else "")
            return TokenizerFamily("sentencepiece", marker, dummy, evidence)
    decoder = _nodes(config.get("decoder"), "decoders")
    raise SpecError(
        f"{source}: unknown tokenizer family (pre_tokenizer {_types(pre)}, normalizer {_types(norm)}, "
        f"decoder {_types(decoder)}): exact prompts need a byte-level BPE tokenizer (ByteLevel pre-tokenizer, "
        "GPT-2 / Llama 3 style) or a SentencePiece-style one (Metaspace pre-tokenizer or a normalizer replacing "
        "' ' with '▁', Llama 2 / Mistral / Gemma style); leave the tokenizer out for approximate lengths"
    )


@dataclass
class TokenizerInfo:
    """A loaded tokenizer, its family, and whether lengths made with it are exact."""

    exact: bool
    encode: Tokenizer | None = None
    family: TokenizerFamily | None = None

    def count(self, text: str) -> int:
        """Tokens in ``text`` alone, without BOS (a server adds that to the prompt, not the body)."""
        if self.encode is None:
            return len(text.split())
        return len(self.encode.encode(text, add_special_tokens=False).ids)

    def counts(self, texts: list[str]) -> list[int]:
        """``count`` of many texts at once (the tokenizer encodes a batch in parallel)."""
        if self.encode is None:
            return [len(text.split()) for text in texts]
        return [len(e.ids) for e in self.encode.encode_batch(texts, add_special_tokens=False)]


def load_tokenizer(path: Path | None) -> TokenizerInfo:
    """Load ``tokenizer.json`` from a model folder (or the file itself); None -> approximate."""
    if path is None:
        return TokenizerInfo(exact=False)

    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise SpecError(f"--tokenizer: no tokenizer.json at {path}; point it at the model folder")
    raw = file.read_text(encoding="utf-8")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{file}: not valid JSON ({exc}); point the tokenizer at a model's tokenizer.json") from exc
    family = detect_family(config, str(file))
    return TokenizerInfo(exact=True, encode=Tokenizer.from_str(raw), family=family)


class PromptFactory:
    """Makes random text of an exact token length, deterministic from a seed."""

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self.tokenizer = tokenizer
        self.words = self._single_token_words(tokenizer)
        family = tokenizer.family
        # With a dummy prefix the normalizer supplies the first word's space; one of ours would be a token more.
        self.bare_start = family is not None and family.dummy_prefix
        # How to append one text to another and keep both counts: the second text's own space, or one given.
        self.joiner = " " if self.bare_start else ""
        self.lead_words = self._lead_words() if tokenizer.encode is not None else self.words

    @staticmethod
    def _single_token_words(tokenizer: TokenizerInfo) -> list[str]:
        if tokenizer.encode is None:
            return [" " + word for word in _FALLBACK_WORDS]
        family = tokenizer.family
        if family is None:
            raise SpecError("exact prompts need the tokenizer's family: load it with load_tokenizer()")
        marker = family.marker
        candidates = sorted(
            " " + piece[len(marker) :]
            for piece in tokenizer.encode.get_vocab()
            if piece.startswith(marker) and _is_plain_word(piece[len(marker) :])
        )
        # A dummy prefix adds the marker itself: a word is checked bare there, as a text's first word is sent.
        probes = [w[1:] for w in candidates] if family.dummy_prefix else candidates
        words = [w for w, n in zip(candidates, tokenizer.counts(probes), strict=True) if n == 1]
        words = _drop_words_that_merge(list(tokenizer.encode.get_vocab()), marker, words)
        if len(words) < MIN_WORDS:
            why = (
                "the vocabulary holds few whole words (too small, or not for Latin-script text)"
                if len(candidates) < MIN_WORDS
                else "the tokenizer splits them again when it encodes them (its normalizer or pre-tokenizer)"
            )
            raise SpecError(
                f"{family.describe()}: too few single-token words to build exact prompts: "
                f"{len(candidates)} vocabulary pieces are {marker!r} + lowercase ASCII letters, {len(words)} of them "
                f"encode to exactly one token (need {MIN_WORDS}): {why}"
            )
        return words

    def _lead_words(self) -> list[str]:
        """Words that are one token with or without their space, even after a newline."""
        bare = [w[1:] for w in self.words]
        after_newline = self.tokenizer.counts(["\n" + b for b in bare])
        newline = self.tokenizer.count("\n")
        alone = self.tokenizer.counts(bare)
        lead = [w for w, n, a in zip(self.words, after_newline, alone, strict=True) if n == newline + 1 and a == 1]
        return lead if len(lead) >= MIN_LEAD_WORDS else self.words

    def text(self, tokens: int, rng: random.Random) -> str:
        """Exactly ``tokens`` tokens (approximately, without a tokenizer), starting with a lead word.

        Join two texts with ``joiner`` between them to keep both counts exact.
        """
        if tokens <= 0:
            return ""
        text = rng.choice(self.lead_words) + "".join(rng.choices(self.words, k=tokens - 1))
        return text[1:] if self.bare_start else text


def _is_plain_word(rest: str) -> bool:
    return len(rest) > 1 and rest.isascii() and rest.isalpha() and rest.islower()


def _drop_words_that_merge(vocab: list[str], marker: str, words: list[str]) -> list[str]:
    """``words`` less those a vocabulary piece could join to the next word.

    Splitting pre-tokenizers cut text before each space, but an unsplit SentencePiece model
    (Metaspace ``split: false``, the legacy normalizer layout) sees a whole text at once. A
    token can then cross from one word into the next only through a piece holding the marker
    after some other character ('ki▁ce', 'a▁'): BPE builds its tokens from such pieces and
    Unigram picks among them. Without those pieces the text tokenizes word by word, and
    each word was checked to be one token. Each such piece needs a particular word before
    its marker (exactly ``ki`` when the piece starts '▁ki', any word ending in ``a``
    otherwise): drop those words, and no piece can ever match.
    """
    exact: set[str] = set()
    suffixes: set[str] = set()
    for piece in vocab:
        if marker not in piece[1:]:
            continue
        for i in range(1, len(piece)):
            if piece[i] != marker or piece[i - 1] == marker:
                continue
            before = piece[:i]
            anchor = before.rfind(marker)
            if anchor >= 0:
                exact.add(before[anchor + 1 :])
            else:
                suffixes.add(before)
    if not exact and not suffixes:
        return words
    ends = tuple(suffixes)
    return [w for w in words if w[1:] not in exact and not w[1:].endswith(ends)]
