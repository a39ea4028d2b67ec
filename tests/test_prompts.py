"""Exact-length prompts for both tokenizer families: byte-level BPE and SentencePiece-style.

Every tokenizer here is trained locally (no downloads): the byte-level one the way
``bakeoff model make`` builds the model tokenizer, the SentencePiece-style ones shaped like
Llama 2's and Mistral's ``tokenizer.json`` (Metaspace or the legacy dummy-prefix normalizer,
byte fallback, an added BOS).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from bakeoff.errors import SpecError
from bakeoff.models.modelgen import train_sentencepiece_style_tokenizer, train_tokenizer
from bakeoff.workloads.prompts import PromptFactory, TokenizerInfo, load_tokenizer

SP_STYLES: dict[str, dict[str, Any]] = {
    # transformers' converter with legacy=False: Metaspace, prepend_scheme first, one unsplit piece.
    "metaspace-first": {"model": "bpe", "prepend_scheme": "first", "split": False},
    "metaspace-always-split": {"model": "unigram", "prepend_scheme": "always", "split": True},
    "metaspace-never": {"model": "bpe", "prepend_scheme": "never", "split": True},
    # Llama 2's and Mistral 7B v0.1's published files: Prepend('▁') + Replace normalizer.
    "legacy-bpe": {"model": "bpe", "legacy": True},
    "legacy-unigram": {"model": "unigram", "legacy": True},
}
FAMILIES = ["byte-level", *SP_STYLES]
SIZES = [1, 2, 3, 5, 17, 100, 511, 2048]


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    dirs = {name: train_sentencepiece_style_tokenizer(root / name, 3, **kw) for name, kw in SP_STYLES.items()}
    train_tokenizer(2048, 3).save_pretrained(root / "byte-level")  # type: ignore[attr-defined]
    dirs["byte-level"] = root / "byte-level"
    return dirs


@pytest.fixture(scope="module")
def factories(tokenizer_dirs: dict[str, Path]) -> dict[str, PromptFactory]:
    return {name: PromptFactory(load_tokenizer(path)) for name, path in tokenizer_dirs.items()}


def _server_tokenizer(factory: PromptFactory) -> Tokenizer:
    assert factory.tokenizer.encode is not None
    return factory.tokenizer.encode


def body_tokens(tok: Tokenizer, rendered: str, body: str) -> int:
    """Tokens a server's encoding of ``rendered`` (BOS added) spends on ``body``, found by offsets."""
    start = rendered.index(body)
    end = start + len(body)
    inside = [(s, e) for s, e in tok.encode(rendered).offsets if s < end and e > start]
    for s, e in inside:
        # Only the separating space the template puts before the body may share a token with it.
        assert s >= start - (rendered[start - 1 : start] == " ") and e <= end, (rendered[s:e], body[:40])
    return len(inside)


@pytest.mark.parametrize(
    ("name", "family", "dummy", "evidence"),
    [
        ("byte-level", "byte_level", False, "ByteLevel pre-tokenizer"),
        ("metaspace-first", "sentencepiece", False, "prepend_scheme first"),
        ("metaspace-always-split", "sentencepiece", False, "prepend_scheme always"),
        ("legacy-bpe", "sentencepiece", True, "dummy prefix"),
    ],
)
def test_family_is_read_from_tokenizer_json(
    tokenizer_dirs: dict[str, Path], name: str, family: str, dummy: bool, evidence: str
) -> None:
    info = load_tokenizer(tokenizer_dirs[name])
    assert info.family is not None
    assert (info.family.name, info.family.dummy_prefix) == (family, dummy)
    assert evidence in info.family.describe()
    assert info.family.marker == ("Ġ" if family == "byte_level" else "▁")


@pytest.mark.parametrize("name", FAMILIES)
def test_texts_have_exact_token_counts_for_many_sizes_and_seeds(factories: dict[str, PromptFactory], name: str) -> None:
    factory = factories[name]
    assert len(factory.words) >= 500 and len(factory.lead_words) >= 16
    for seed in range(6):
        rng = random.Random(seed)
        texts = [factory.text(n, rng) for n in SIZES]
        assert factory.tokenizer.counts(texts) == SIZES
        assert [factory.tokenizer.count(t) for t in texts] == SIZES


@pytest.mark.parametrize("name", FAMILIES)
def test_a_text_appended_to_another_keeps_both_counts(factories: dict[str, PromptFactory], name: str) -> None:
    factory = factories[name]
    rng = random.Random(11)
    for first, second in [(1, 1), (7, 30), (256, 3)]:
        a, b = factory.text(first, rng), factory.text(second, rng)
        assert factory.tokenizer.count(a + factory.joiner + b) == first + second


@pytest.mark.parametrize("name", FAMILIES)
def test_body_counts_the_same_inside_chat_templates(factories: dict[str, PromptFactory], name: str) -> None:
    factory = factories[name]
    tok = _server_tokenizer(factory)
    # A special token right before the body: Metaspace 'first' adds no '▁' there, the legacy normalizer does.
    opener, closer = ("<|user|>", "<|end|>") if name == "byte-level" else ("[INST]", "[/INST]")
    rng = random.Random(5)
    for n in (1, 2, 9, 300):
        body, system = factory.text(n, rng), factory.text(n + 4, rng)
        contexts = {
            "completions": (body, [body]),
            "after a special token": (f"{opener}{body}{closer}", [body]),
            "after a newline": (f"<|user|>\n{body}<|end|>\n", [body]),
            # Llama 2's template trims the message and puts one space (or the system block) before it.
            "llama-2 trimmed": (f"<s>[INST] {body.strip()} [/INST]", [body.strip()]),
            "llama-2 system": (
                f"<s>[INST] <<SYS>>\n{system.strip()}\n<</SYS>>\n\n{body.strip()} [/INST]",
                [system.strip(), body.strip()],
            ),
        }
        for context, (rendered, bodies) in contexts.items():
            got = [body_tokens(tok, rendered, b) for b in bodies]
            assert got == [factory.tokenizer.count(b) for b in bodies], context
            assert got[-1] == n, context


def test_dummy_prefix_texts_start_bare_because_a_space_costs_a_token(factories: dict[str, PromptFactory]) -> None:
    legacy, metaspace = factories["legacy-bpe"], factories["metaspace-first"]
    text = legacy.text(40, random.Random(2))
    assert not text.startswith(" ") and legacy.joiner == " "
    # The trap the bare start avoids: Prepend('▁') then ' '->'▁' gives '▁▁word', one token too many.
    assert legacy.tokenizer.count(" " + text) == 41
    spaced = metaspace.text(40, random.Random(2))
    assert spaced.startswith(" ") and metaspace.joiner == ""
    # Metaspace never doubles a '▁' the text already has, whatever its prepend_scheme.
    assert metaspace.tokenizer.count(spaced) == 40


def test_first_words_survive_a_template_that_trims_them(factories: dict[str, PromptFactory]) -> None:
    for name, factory in factories.items():
        firsts = {factory.text(3, random.Random(seed)).split()[0] for seed in range(200)}
        assert firsts <= {w.strip() for w in factory.lead_words}, name
        # Bare after a newline (a trimmed message under '<<SYS>>\n') each is still one token.
        newline = factory.tokenizer.count("\n")
        assert {factory.tokenizer.count("\n" + w) - newline for w in firsts} == {1}, name


def test_pieces_joining_two_words_are_left_out(tokenizer_dirs: dict[str, Path], tmp_path: Path) -> None:
    plain = PromptFactory(load_tokenizer(tokenizer_dirs["legacy-bpe"]))
    left, right = plain.words[0], plain.words[1]
    config = json.loads((tokenizer_dirs["legacy-bpe"] / "tokenizer.json").read_text())
    vocab = config["model"]["vocab"]
    joined = f"▁{left[1:]}▁{right[1:]}"  # a piece spanning a space, as an unsplit model could hold
    vocab[joined] = max(vocab.values()) + 100
    config["model"]["merges"].append([f"▁{left[1:]}", f"▁{right[1:]}"])
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    info = load_tokenizer(tmp_path)
    assert info.count(f"{left[1:]}{right}") == 1  # the trap: two words, one token
    factory = PromptFactory(info)
    assert left not in factory.words and right in factory.words
    rng = random.Random(9)
    texts = [factory.text(n, rng) for n in SIZES * 4]
    assert info.counts(texts) == SIZES * 4


def test_sentencepiece_style_generator_is_deterministic_and_llama_shaped(tmp_path: Path) -> None:
    first = train_sentencepiece_style_tokenizer(tmp_path / "a", 4, legacy=True)
    again = train_sentencepiece_style_tokenizer(tmp_path / "b", 4, legacy=True)
    assert (first / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
    tok = Tokenizer.from_file(str(first / "tokenizer.json"))
    assert tok.token_to_id("<s>") == 1 and tok.token_to_id("<0x00>") == 3  # Llama's id layout
    encoding = tok.encode("héllo wörld")
    assert encoding.tokens[0] == "<s>" and "<0xC3>" in encoding.tokens  # BOS added, bytes fall back
    assert tok.decode(encoding.ids) == "héllo wörld"


def _metaspace_tokenizer(folder: Path, pieces: list[str], normalizer: normalizers.Normalizer | None = None) -> Path:
    scored = [("<unk>", 0.0)] + [(f"<0x{b:02X}>", 0.0) for b in range(256)] + [(p, -1.0) for p in pieces]
    tok = Tokenizer(models.Unigram(scored, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    if normalizer is not None:
        tok.normalizer = normalizer
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_too_few_words_names_the_family_and_the_reason(tmp_path: Path) -> None:
    letters = [*"▁abcdefghijklmnopqrstuvwxyz"]
    small = _metaspace_tokenizer(tmp_path / "small", [*letters, "▁ba", "▁ke", "▁lo"])
    with pytest.raises(SpecError, match=r"SentencePiece-style.*Metaspace.*3 vocabulary pieces.*few whole words"):
        PromptFactory(load_tokenizer(small))
    words = [f"▁{a}{b}" for a in "bdfgk" for b in "aeiou"]
    words += [f"▁{a}{b}{c}" for a in "lm" for b in "aeiou" for c in "nrst"]
    # A normalizer that rewrites every letter: the pieces exist but no word encodes to one token.
    scrambled = _metaspace_tokenizer(
        tmp_path / "scrambled", [*letters, *words], normalizers.Replace(Regex("[a-z]"), "q")
    )
    with pytest.raises(SpecError, match=r"SentencePiece-style.*65 vocabulary pieces.*0 of them.*splits them again"):
        PromptFactory(load_tokenizer(scrambled))
    # The approximate fallback still works where no tokenizer is given.
    assert PromptFactory(TokenizerInfo(exact=False)).text(4, random.Random(0)).count(" ") == 4


def test_unknown_family_is_refused_with_what_was_found(tmp_path: Path) -> None:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(SpecError, match=r"unknown tokenizer family \(pre_tokenizer Whitespace.*SentencePiece-style"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_tokenizer(tmp_path)
