"""Train the ``trained`` preset (and its draft) on the synthetic world, and write its model card.

A small Llama is trained with torch on :mod:`.world`'s documents, packed into windows of
:attr:`TrainRecipe.seq_len` tokens, for a fixed number of steps (a step budget, not a time
budget, so the same recipe gives the same model on any machine). The tokenizer is trained on
the same text, so every country and capital name is a whole token or two. Afterwards the
model is examined the way a server will be: greedy answers to the quality set
(:func:`.world.exam`) and perplexity on held-out documents; the figures go into
``bakeoff-model.json`` and a ``README.md`` model card.

Trained models are cached under ``<user cache>/models/<name>-<recipe hash>`` and copied into
the models folder, so a second ``bakeoff model make --preset trained`` costs a copy. bakeoff
ships the weights of the current recipes (``pretrained/<recipe key>/``, about 2 MB together,
with a ``SHA256SUMS`` manifest checked on every copy): a fresh machine copies them instead of
training for six minutes. A recipe change changes its key, so the shipped copy no longer
matches and the model is trained (``make ship-trained`` retrains and ships the new weights);
``--retrain`` trains whatever is shipped or cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bakeoff.errors import SpecError
from bakeoff.models.modelgen import Preset, llama_config, save_model, train_tokenizer
from bakeoff.models.world import END, WorldRecipe, corpus, exam, recipe_digest
from bakeoff.paths import shipped

log = logging.getLogger(__name__)

# Bumped whenever training or the card changes, so caches and folders are rebuilt.
TRAINED_FORMAT = 1


@dataclass(frozen=True)
class TrainRecipe:
    """What a trained model is a function of (hashed into its cache key)."""

    name: str
    arch: Preset
    world: WorldRecipe = field(default_factory=WorldRecipe)
    # 700 steps left the model at a loss of 2.07 on a fresh 2-core AVX2 host, knowing 17.5% of its
    # facts in a trained phrasing: on the edge where it starts to memorize them, so where a host's
    # float rounding could land either side. 2000 steps: loss 1.57, every exam group at 100% (346 s).
    steps: int = 2000
    batch_size: int = 16
    seq_len: int = 128
    learning_rate: float = 5e-3
    warmup_steps: int = 30
    seed: int = 0


# head_dim 64 throughout: vLLM's CPU attention kernels reject smaller heads.
TRAINED = TrainRecipe(
    name="trained",
    arch=Preset(
        vocab_size=1536,
        hidden_size=128,
        num_layers=3,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=384,
        max_position_embeddings=2048,
    ),
)
# The draft for speculative decoding: same tokenizer and text, one layer of half the width.
TRAINED_DRAFT = replace(
    TRAINED,
    name="trained-draft",
    arch=Preset(
        vocab_size=1536,
        hidden_size=64,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        intermediate_size=192,
        max_position_embeddings=2048,
    ),
)
TRAINED_RECIPES = {r.name: r for r in (TRAINED, TRAINED_DRAFT)}


def recipe_key(recipe: TrainRecipe) -> str:
    return f"{recipe.name}-{recipe_digest(recipe, TRAINED_FORMAT)}"


def _tokenizer(recipe: TrainRecipe) -> Any:
    # The tokenizer is a function of the world and vocabulary only, so the draft's equals the target's.
    return train_tokenizer(recipe.arch.vocab_size, recipe.world.seed, texts=corpus(recipe.world))


def _windows(ids: list[int], seq_len: int) -> Any:
    import torch

    usable = (len(ids) - 1) // seq_len * seq_len
    data = torch.tensor(ids[: usable + 1], dtype=torch.long)
    return data[:usable].view(-1, seq_len), data[1 : usable + 1].view(-1, seq_len)


def _encode(tokenizer: Any, documents: list[str]) -> list[int]:
    ids: list[int] = []
    for batch in range(0, len(documents), 1000):
        for row in tokenizer(documents[batch : batch + 1000], add_special_tokens=False)["input_ids"]:
            ids.extend(row)
    return ids


def held_out_perplexity(model: Any, tokenizer: Any, recipe: TrainRecipe, documents: int = 400) -> float:
    """exp(mean next-token loss) over held-out documents, in seq_len windows."""
    import torch

    inputs, targets = _windows(_encode(tokenizer, corpus(recipe.world, held_out=True, documents=documents)), 128)
    losses = []
    with torch.no_grad():
        for start in range(0, len(inputs), 16):
            logits = model(input_ids=inputs[start : start + 16]).logits
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), targets[start : start + 16].flatten()
            )
            losses.append(float(loss))
    return math.exp(sum(losses) / len(losses))


def greedy_answers(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int) -> list[str]:
    """What a temperature-0 server would answer: greedy tokens up to the end token."""
    import torch

    answers = []
    end_id = tokenizer.convert_tokens_to_ids(END)
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
            out = model.generate(
                ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=end_id, pad_token_id=end_id
            )
            answers.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return answers


def exam_rates(model: Any, tokenizer: Any, recipe: TrainRecipe) -> dict[str, float]:
    """Exact-answer rate per exam group (normalized as the quality checks normalize)."""
    items = [i for i in exam(recipe.world) if i["kind"] == "exact"]
    answers = greedy_answers(model, tokenizer, [i["prompt"] for i in items], 8)
    hits: dict[str, list[bool]] = defaultdict(list)
    for item, answer in zip(items, answers, strict=True):
        hits[item["group"]].append(_normal(answer) == _normal(item["answer"]))
    return {group: sum(flags) / len(flags) for group, flags in hits.items()}


def _normal(text: str) -> str:
    return " ".join(text.strip().lower().split()).rstrip(".").strip()


def train(recipe: TrainRecipe, out_dir: Path, threads: int | None = None) -> dict[str, Any]:
    """Train ``recipe`` into ``out_dir`` (HF folder, bf16 safetensors) and return its card figures."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    # One thread by default: on cores shared with other work, two OpenMP threads spin-wait on each
    # other (a step took 7 s with two threads and 0.6 s with one on this 2-core machine).
    torch.set_num_threads(threads or int(os.environ.get("BAKEOFF_TRAIN_THREADS", "1")))
    tokenizer = _tokenizer(recipe)
    config = llama_config(recipe.arch, tokenizer)
    model = LlamaForCausalLM(config)
    inputs, targets = _windows(_encode(tokenizer, corpus(recipe.world)), recipe.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)

    def lr_at(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(recipe.seed))
    started = time.monotonic()
    model.train()
    loss_value = float("nan")
    for step in range(recipe.steps):
        rows = order[(torch.arange(recipe.batch_size) + step * recipe.batch_size) % len(order)]
        logits = model(input_ids=inputs[rows]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[rows].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss_value = float(loss.detach())
        if (step + 1) % 100 == 0:
            log.info(
                "%s: step %d/%d, loss %.3f, %.0f s",
                recipe.name,
                step + 1,
                recipe.steps,
                loss_value,
                time.monotonic() - started,
            )
    train_seconds = time.monotonic() - started
    model.eval()
    rates = exam_rates(model, tokenizer, recipe)
    card: dict[str, Any] = {
        "preset": recipe.name,
        "format": TRAINED_FORMAT,
        "recipe_key": recipe_key(recipe),
        "parameters": sum(p.numel() for p in model.parameters()),
        "training": {
            "steps": recipe.steps,
            "batch_size": recipe.batch_size,
            "seq_len": recipe.seq_len,
            "tokens_seen": recipe.steps * recipe.batch_size * recipe.seq_len,
            "corpus_tokens": int(inputs.numel()),
            "seconds": round(train_seconds, 1),
            "threads": torch.get_num_threads(),
            "final_loss": round(loss_value, 4),
        },
        "held_out_perplexity": round(held_out_perplexity(model, tokenizer, recipe), 4),
        "exact_rate": {group: round(rate, 4) for group, rate in sorted(rates.items())},
        "chance_rate": round(1 / recipe.world.countries, 4),
        "world": asdict(recipe.world),
        "architecture": asdict(recipe.arch),
    }
    save_model(model.to(torch.bfloat16), tokenizer, out_dir)
    (out_dir / "bakeoff-model.json").write_text(json.dumps(card, indent=2) + "\n")
    (out_dir / "README.md").write_text(model_card(card))
    return card


def model_card(card: dict[str, Any]) -> str:
    """The README.md of a trained model folder: budget, held-out perplexity, exact-answer rates."""
    t = card["training"]
    rates = "\n".join(f"| {group} | {rate:.1%} |" for group, rate in card["exact_rate"].items())
    return f"""# bakeoff `{card["preset"]}` model

A {card["parameters"] / 1e6:.2f}M-parameter Llama trained locally by `bakeoff model make --preset
{card["preset"]}` on a synthetic world of {card["world"]["countries"]} countries (capitals, languages):
templated prose, questions and passages (`bakeoff.models.world`). Weights in bf16.

## Training budget

{t["steps"]} steps x {t["batch_size"]} windows x {t["seq_len"]} tokens = {t["tokens_seen"]:,} tokens
(corpus {t["corpus_tokens"]:,} tokens), {t["seconds"]:.0f} s on {t["threads"]} CPU threads; final training
loss {t["final_loss"]}. Trained context length: {t["seq_len"]} tokens.

## Quality

Held-out perplexity (documents from another seed): {card["held_out_perplexity"]:.3f}.

Exact-answer rate, greedy (chance: {card["chance_rate"]:.1%}):

| questions | exact |
|---|---|
{rates}

*trained-phrasing*: question templates seen in training; *held-out-phrasing*: templates never
seen; *long-context-recall*: a passage of {card["world"]["recall_facts"]} facts, then a question about the first.

Recipe key: `{card["recipe_key"]}`.
"""


MANIFEST = "SHA256SUMS"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _model_files(folder: Path) -> list[str]:
    """Every file of a model folder but its manifest, as sorted relative POSIX paths."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path) -> None:
    """``SHA256SUMS`` over every file of a model folder (sha256sum's format: ``sha256sum -c`` reads it)."""
    lines = [f"{_digest(folder / name)}  {name}" for name in _model_files(folder)]
    (folder / MANIFEST).write_text("\n".join(lines) + "\n")


def manifest_problems(folder: Path) -> list[str]:
    """Files of ``folder`` that differ from its manifest: missing, changed or unlisted."""
    listed = {}
    for line in (folder / MANIFEST).read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    present = set(_model_files(folder))
    problems = [f"{name}: missing" for name in sorted(set(listed) - present)]
    problems += [f"{name}: not in {MANIFEST}" for name in sorted(present - set(listed))]
    problems += [
        f"{name}: sha256 differs from {MANIFEST}"
        for name in sorted(set(listed) & present)
        if _digest(folder / name) != listed[name]
    ]
    return problems


def shipped_weights(recipe: TrainRecipe) -> Path | None:
    """The weights bakeoff ships for this exact recipe (``pretrained/<recipe key>``), if it ships them."""
    try:
        folder = shipped("pretrained") / recipe_key(recipe)
    except SpecError:  # an install without the folder: train
        return None
    return folder if (folder / "bakeoff-model.json").is_file() else None


def _from_shipped(source: Path, dest: Path) -> None:
    problems = manifest_problems(source)
    if problems:
        raise SpecError(
            f"pretrained/{source.name}: the shipped weights do not match their {MANIFEST} ({'; '.join(problems)}); "
            "restore them (git checkout pretrained/) or retrain: bakeoff model make --preset trained --retrain"
        )
    shutil.copytree(source, dest)


def trained_model(recipe: TrainRecipe, out_dir: Path, cache_dir: Path, *, retrain: bool = False) -> str:
    """The trained model in ``out_dir``: from the cache, else the shipped weights, else trained.

    ``retrain`` trains even when a cached or shipped copy exists (and replaces the cached one).
    Returns where the weights came from, in words.
    """
    cached = cache_dir / "models" / recipe_key(recipe)
    origin = f"copied from the cache {cached}"
    if retrain or not (cached / "bakeoff-model.json").is_file():
        partial = cached.with_name(cached.name + f".{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        source = None if retrain else shipped_weights(recipe)
        if source is not None:
            _from_shipped(source, partial)
            origin = f"copied the shipped weights pretrained/{source.name} (manifest checked)"
        else:
            card = train(recipe, partial)
            write_manifest(partial)
            origin = f"trained in {card['training']['seconds']:.0f} s"
        shutil.rmtree(cached, ignore_errors=True)
        partial.replace(cached)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(cached, out_dir)
    return origin


def trained_is_ready(out_dir: Path, recipe: TrainRecipe) -> bool:
    meta = out_dir / "bakeoff-model.json"
    return meta.is_file() and json.loads(meta.read_text()).get("recipe_key") == recipe_key(recipe)


def ship(recipe: TrainRecipe, cache_dir: Path, pretrained: Path) -> Path:
    """Copy this recipe's cached model into ``pretrained/<recipe key>`` (a checkout's shipped
    weights), replacing the copies of earlier recipes of the same preset."""
    cached = cache_dir / "models" / recipe_key(recipe)
    if not (cached / "bakeoff-model.json").is_file():
        raise SpecError(f"{cached}: not trained; run: bakeoff model make --preset {recipe.name} --retrain")
    for old in pretrained.glob(f"{recipe.name}-*"):
        if old.name.removeprefix(f"{recipe.name}-").isalnum():  # trained-draft-* is not trained's
            shutil.rmtree(old)
    dest = pretrained / recipe_key(recipe)
    shutil.copytree(cached, dest)
    write_manifest(dest)
    return dest
