"""Token-exact prompt text: N tokens in means exactly N tokens to the model's tokenizer.

The trick: keep a lexicon of words that, with their leading space, are a single token of
the tokenizer. Byte-level pre-tokenization splits text at spaces, so a string of N such
words encodes to exactly N tokens, whatever else surrounds it. Without a tokenizer, bakeoff
falls back to a fixed word list and says the lengths are approximate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from bakeoff.errors import SpecError

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


@dataclass
class TokenizerInfo:
    """A loaded tokenizer plus whether lengths made with it are exact."""

    exact: bool
    encode: object | None = None  # tokenizers.Tokenizer when exact

    def count(self, text: str) -> int:
        if self.encode is None:
            return len(text.split())
        return len(self.encode.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]


def load_tokenizer(path: Path | None) -> TokenizerInfo:
    """Load ``tokenizer.json`` from a model folder (or the file itself); None -> approximate."""
    if path is None:
        return TokenizerInfo(exact=False)
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise SpecError(f"--tokenizer: no tokenizer.json at {path}; point it at the model folder")
    return TokenizerInfo(exact=True, encode=Tokenizer.from_file(str(file)))


class PromptFactory:
    """Makes random text of an exact token length, deterministic from a seed."""

    def __init__(self, tokenizer: TokenizerInfo) -> None:
        self.tokenizer = tokenizer
        self.words = self._single_token_words(tokenizer)

    @staticmethod
    def _single_token_words(tokenizer: TokenizerInfo) -> list[str]:
        if tokenizer.encode is None:
            return [" " + word for word in _FALLBACK_WORDS]
        vocab: dict[str, int] = tokenizer.encode.get_vocab()  # type: ignore[attr-defined]
        words = []
        for piece in vocab:
            # 'Ġ' is the byte-level BPE marker for a leading space.
            if piece.startswith("Ġ") and len(piece) > 2 and piece[1:].isalpha() and piece[1:].islower():
                word = " " + piece[1:]
                if tokenizer.count(word) == 1:
                    words.append(word)
        if len(words) < 50:
            raise SpecError("tokenizer has too few single-token words to build exact prompts")
        return sorted(words)

    def text(self, tokens: int, rng: random.Random) -> str:
        """Exactly ``tokens`` tokens (approximately, without a tokenizer)."""
        if tokens <= 0:
            return ""
        return "".join(rng.choices(self.words, k=tokens))
