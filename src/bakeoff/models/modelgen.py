"""Generate a local Llama-architecture model: random weights plus a locally trained tokenizer.

No model can be downloaded on the machines bakeoff runs on, so it makes its own: a
byte-level BPE tokenizer trained on a synthetic corpus (its vocabulary is the model's, so
generated ids decode to text), a chat template, and random safetensors weights. Everything
is deterministic from the seed. ``small`` is sized so CPU decode is memory-bandwidth-bound,
the way GPU decode is; ``tiny`` is for fast tests. For tests of the other tokenizer family, it
also trains SentencePiece-style tokenizers shaped like Llama 2's and Mistral's files.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bakeoff.errors import SpecError

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Bumped whenever generation changes, so `model make` rebuilds stale folders.
MODEL_FORMAT = 2
SPECIAL_TOKENS = ["<|begin|>", "<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]


@dataclass(frozen=True)
class Preset:
    """A Llama's shape (random-weight presets here; the trained ones' architecture too)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    # Positions the server accepts (a trained model uses its recipe's seq_len of them).
    max_position_embeddings: int


PRESETS: dict[str, Preset] = {
    # head_dim 64: vLLM's CPU attention kernels reject smaller heads (16 failed at run time).
    "tiny": Preset(2048, 128, 2, 2, 1, 256, 4096),
    # ~88M parameters, 176 MB in bf16: decode reads all weights per step, like a GPU does.
    "small": Preset(8192, 768, 12, 12, 4, 2048, 8192),
}


def _syllable_words(rng: random.Random, count: int) -> list[str]:
    consonants = "bcdfghjklmnprstvwz"
    vowels = "aeiou"
    words: set[str] = set()
    while len(words) < count:
        n = rng.choice((1, 2, 2, 3, 3, 4))
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(n)))
    return sorted(words)


def synthetic_corpus(seed: int, words: int = 300_000) -> list[str]:
    """Zipf-distributed pseudo-words in sentences: enough structure for BPE to learn merges."""
    rng = random.Random(seed)
    lexicon = _syllable_words(rng, 12_000)
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    drawn = rng.choices(lexicon, weights=weights, k=words)
    lines = []
    for start in range(0, len(drawn), 12):
        sentence = " ".join(drawn[start : start + 12])
        lines.append(sentence.capitalize() + ".")
    return lines


def train_tokenizer(vocab_size: int, seed: int, texts: list[str] | None = None) -> object:
    """A byte-level BPE tokenizer with exactly ``vocab_size`` entries, wrapped for transformers.

    Trained on ``texts`` when given (the ``trained`` preset's own corpus), else on the
    synthetic Zipf corpus of ``seed``.
    """
    from transformers import PreTrainedTokenizerFast  # deferred: the modelgen extra, heavy to import

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts if texts is not None else synthetic_corpus(seed), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise SpecError(
            f"tokenizer training gave {tok.get_vocab_size()} tokens, wanted {vocab_size}; grow the synthetic corpus"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=1_000_000,
    )


SP_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
# Control tokens a chat template can use, the way Mistral's later tokenizers hold [INST] as one token.
SP_CONTROL_TOKENS = ["[INST]", "[/INST]"]
# Llama 2's chat template, shortened: messages trimmed, the system block inside the first [INST].
SP_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = '<<SYS>>\\n' + messages[0]['content'] | trim + '\\n<</SYS>>\\n\\n' %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}[INST] {% if loop.first %}{{ system }}{% endif %}"
    "{{ message['content'] | trim }} [/INST]"
    "{% else %} {{ message['content'] | trim }} {{ eos_token }}{% endif %}{% endfor %}"
)


def train_sentencepiece_style_tokenizer(
    folder: Path,
    seed: int,
    *,
    model: Literal["bpe", "unigram"] = "bpe",
    legacy: bool = False,
    prepend_scheme: Literal["first", "always", "never"] = "first",
    split: bool = False,
    vocab_size: int = 2048,
) -> Path:
    """Write a Llama-2-style ``tokenizer.json`` (and ``tokenizer_config.json``) into ``folder``.

    Shaped like what transformers' converter writes for SentencePiece models: '▁' marks a
    leading space, byte fallback (``<0x00>``..``<0xFF>`` right after the specials), and a
    post-processor that adds BOS. ``legacy`` picks the layout of Llama 2's and Mistral 7B
    v0.1's published files (a Prepend('▁') + Replace(' ', '▁') normalizer, no
    pre-tokenizer); otherwise a Metaspace pre-tokenizer with ``prepend_scheme`` and ``split``
    (what the converter writes with ``legacy=False``). Deterministic from the seed; trained
    on a shorter corpus than the model tokenizer, since tests build several.
    """
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    trainer_vocab = vocab_size - len(byte_pieces) - len(SP_CONTROL_TOKENS)
    draft = Tokenizer(models.BPE(unk_token="<unk>") if model == "bpe" else models.Unigram())
    draft.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainer: trainers.Trainer = (
        trainers.BpeTrainer(vocab_size=trainer_vocab, special_tokens=SP_SPECIAL_TOKENS, show_progress=False)
        if model == "bpe"
        else trainers.UnigramTrainer(
            vocab_size=trainer_vocab, special_tokens=SP_SPECIAL_TOKENS, unk_token="<unk>", show_progress=False
        )
    )
    draft.train_from_iterator(synthetic_corpus(seed, words=120_000), trainer=trainer)
    trained = json.loads(draft.to_str())["model"]
    # Rebuild with the byte pieces as ordinary vocabulary entries, as SentencePiece stores them.
    tok: Tokenizer
    if model == "bpe":
        pieces = sorted(trained["vocab"], key=trained["vocab"].__getitem__)
        ordered = pieces[:3] + byte_pieces + pieces[3:]
        # tokenizers writes merges as [left, right] pairs; older files as "left right" strings.
        pairs = (m.split(" ", 1) if isinstance(m, str) else m for m in trained["merges"])
        merges = [(str(left), str(right)) for left, right in pairs]
        vocab = {piece: index for index, piece in enumerate(ordered)}
        tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    else:
        scored = [(piece, float(score)) for piece, score in trained["vocab"]]
        ordered_scores = scored[:3] + [(piece, 0.0) for piece in byte_pieces] + scored[3:]
        tok = Tokenizer(models.Unigram(ordered_scores, unk_id=0, byte_fallback=True))
    tok.add_special_tokens(SP_SPECIAL_TOKENS + SP_CONTROL_TOKENS)
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme, split=split)
    # The converter's decoder in both layouts: a Metaspace decoder would leave byte pieces undecoded.
    strip = [decoders.Strip(" ", 1, 0)] if legacy or prepend_scheme != "never" else []
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    if tok.get_vocab_size() != vocab_size:
        raise SpecError(f"sentencepiece-style training gave {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "LlamaTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "legacy": legacy,
        "chat_template": SP_CHAT_TEMPLATE,
        "model_max_length": 1_000_000,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def silent_token_ids(tokenizer: object) -> list[int]:
    """Ids of special tokens and of single bytes that are not valid UTF-8 alone."""
    vocab: dict[str, int] = tokenizer.get_vocab()  # type: ignore[attr-defined]
    ids = [vocab[t] for t in SPECIAL_TOKENS]
    for piece, index in vocab.items():
        text = tokenizer.convert_tokens_to_string([piece])  # type: ignore[attr-defined]
        if not text or "\ufffd" in text:
            ids.append(index)
    return sorted(set(ids))


def save_model(model: Any, tokenizer: Any, out_dir: Path) -> None:
    """Write a model and its tokenizer as safetensors into ``out_dir``, without a progress bar.

    transformers draws a "Writing model shards" bar per save; for a one-shard model it is
    only noise in ``make``'s output.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def llama_config(spec: Preset, tokenizer: Any, dtype: str | None = None) -> Any:
    """The transformers ``LlamaConfig`` of ``spec``, with ``tokenizer``'s special-token ids."""
    from transformers import LlamaConfig  # deferred: the modelgen extra

    extra = {"dtype": dtype} if dtype else {}
    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def make_model(preset: str, out_dir: Path, seed: int = 0) -> Path:
    """Write config, random bf16 safetensors weights and the tokenizer into ``out_dir``."""
    if preset not in PRESETS:
        raise SpecError(f"preset {preset!r} unknown; choose one of: {', '.join(PRESETS)}")
    import torch  # deferred: the modelgen extra (torch loads in seconds)
    from transformers import LlamaForCausalLM

    spec = PRESETS[preset]
    tokenizer = train_tokenizer(spec.vocab_size, seed)
    config = llama_config(spec, tokenizer, dtype="bfloat16")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        # Zero logits for tokens that decode to no text on their own (special tokens, and the
        # lone non-ASCII bytes of byte-level BPE): random logits of every other token beat 0,
        # so greedy decoding never picks them and each generated token streams visible text,
        # as a trained model's would. Without this, TTFT would wait for printable text.
        model.lm_head.weight[silent_token_ids(tokenizer)] = 0
    save_model(model, tokenizer, out_dir)
    params = sum(p.numel() for p in model.parameters())
    meta = {"preset": preset, "seed": seed, "format": MODEL_FORMAT, "parameters": params, **asdict(spec)}
    (out_dir / "bakeoff-model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out_dir


def model_is_ready(out_dir: Path, preset: str, seed: int = 0) -> bool:
    """True when ``out_dir`` already holds this preset from this seed (make is idempotent)."""
    meta = out_dir / "bakeoff-model.json"
    if not (meta.is_file() and (out_dir / "model.safetensors").is_file()):
        return False
    recorded = json.loads(meta.read_text())
    return bool(
        recorded.get("preset") == preset and recorded.get("seed") == seed and recorded.get("format") == MODEL_FORMAT
    )
