"""What a rehearsal's stand-in answers to the quality checks, and the breakage it plants.

A rehearsal replaces each GPU container by the reference server (:mod:`bakeoff.serving.launchers`),
which on its own answers every prompt with filler. When the campaign has ``quality:``, the
campaign layer hands the launcher a :class:`StandIn`: one :class:`StandInAnswer` per item of
the prompt set, holding an answer that passes the item's checks and one that fails them
(:func:`bakeoff.campaign.rehearsal.stand_in_for`), and :func:`canned_answers` turns them into
the server's ``--canned`` file (prompt -> answer):

- a server without a lossy setting answers every item right: exact 100%, no invalid JSON,
  every free answer's length in range, full agreement with a clean baseline;
- a server with one (:func:`lossy_settings`: weights quantized by a knob or served from a
  pre-quantized checkpoint, a KV cache stored in another type than the model's) answers
  every :data:`BROKEN_EVERY`-th item of each kind wrong, so its exact and length rates drop,
  its invalid-JSON rate rises and its agreement with a clean run falls, each by that share
  of the kind's items; and its prompt logprobs are planted lower
  (:data:`LOSSY_PROMPT_LOGPROB` against :data:`PROMPT_LOGPROB`), so a perplexity read from
  them rises by ``exp(PROMPT_LOGPROB - LOSSY_PROMPT_LOGPROB)``.

Every figure this plants walks the quality-drop path of the harness end to end (scoring,
baselines, the report's quality table); none of it says anything about what quantization does
to a real model. Which settings count as lossy is recorded beside the canned file
(:data:`PLANTED_FILE`), and the report says REHEARSAL on every table it reaches.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bakeoff.backends.spec import KnobValue
from bakeoff.host.gpu_checks import QUANT_CONFIG, checkpoint_dtype, checkpoint_kv_dtype, normalize_kv_dtype

# Planted breakage: a lossy stand-in answers the 4th, 8th, ... item of each kind (json, exact,
# free) wrong, a share of 1/4 of every kind with at least 4 items. Counted per kind so that
# every rate the quality table shows moves, not only the kind the set happens to end with.
BROKEN_EVERY = 4
# Planted prompt logprobs (bakeoff.ref.logprobs): every prompt token of a clean stand-in at
# -1.5 (perplexity e^1.5, about 4.48), of a lossy one 0.1 lower (perplexity 10.5% higher).
PROMPT_LOGPROB = -1.5
LOSSY_PROMPT_LOGPROB = -1.6
CANNED_FILE = "rehearsal-canned.json"  # in the cell's run folder: what the stand-in was told to answer
PLANTED_FILE = "rehearsal-planted.json"  # beside it: the lossy settings seen and the items broken

# A checkpoint folder not on this machine (a rehearsal's /models/...) is judged by its name:
# the quantization formats a published checkpoint's name carries, as a word of their own.
_QUANTIZED_NAME = re.compile(
    r"(?<![a-z0-9])(awq|gptq|w4a16|w4a8|w8a8|w8a16|int4|int8|fp8|nvfp4|mxfp4|fp4|bnb|4bit|8bit)(?![a-z0-9])"
)


@dataclass(frozen=True)
class StandInAnswer:
    """One quality item as a stand-in answers it: ``right`` passes its checks, ``wrong`` fails them."""

    item_id: str
    kind: str  # json, exact or free: breakage is planted per kind
    prompt: str  # what the canned answer is looked up by (the chat's last message, or the prompt)
    right: str
    wrong: str


@dataclass(frozen=True)
class StandIn:
    """What a rehearsal's stand-in needs beyond the launch itself."""

    answers: tuple[StandInAnswer, ...] = ()
    # The checkpoint the server serves on a real run: its model_path, else the campaign's model
    # (a path or a Hugging Face id). The rehearsal serves the tiny model instead, so only this
    # says whether the real weights are pre-quantized.
    checkpoint: str | None = None


def canned_answers(answers: tuple[StandInAnswer, ...], lossy: bool) -> tuple[dict[str, str], list[str]]:
    """The ``--canned`` map (prompt -> answer) and the ids of the items answered wrong (lossy only)."""
    seen: Counter[str] = Counter()
    canned: dict[str, str] = {}
    broken: list[str] = []
    for answer in answers:
        seen[answer.kind] += 1
        wrong = lossy and seen[answer.kind] % BROKEN_EVERY == 0
        canned[answer.prompt] = answer.wrong if wrong else answer.right
        if wrong:
            broken.append(answer.item_id)
    return canned, broken


# Where a checkpoint declares its weight quantization: ModelOpt's export, else Hugging Face's config.
_DECLARED = ((QUANT_CONFIG, "quantization", "quant_algo"), ("config.json", "quantization_config", "quant_method"))


def _declared_quantization(folder: Path) -> str | None:
    """The weight quantization a checkpoint folder declares, or None."""
    for name, section, key in _DECLARED:
        path = folder / name
        try:
            data = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError):
            continue
        value = data.get(section) if isinstance(data, dict) else None
        method = value.get(key) if isinstance(value, dict) else None
        if method:
            return f"{method} ({path})"
    return None


def checkpoint_quantization(checkpoint: str | None) -> str | None:
    """How a checkpoint's weights are quantized, or None: from its files when the folder is on this
    machine, else from its name (a rehearsal's ``/models/...``, or a Hugging Face id)."""
    if checkpoint is None:
        return None
    folder = Path(checkpoint).expanduser()
    if folder.is_dir():
        return _declared_quantization(folder)
    match = _QUANTIZED_NAME.search(checkpoint.lower().rstrip("/").rsplit("/", 1)[-1])
    return f"{match.group(1)}, by the name {checkpoint}" if match else None


def lossy_settings(knobs: Mapping[str, KnobValue | None], checkpoint: str | None) -> list[str]:
    """What makes a server's answers differ from the model's own precision; empty when nothing does.

    ``knobs``: the launch's effective knobs; ``checkpoint``: what it serves on a real run
    (:attr:`StandIn.checkpoint`). Weights are lossy with a ``quantization`` knob other than
    none, or a checkpoint that is quantized already (TensorRT-LLM reads the method from a
    ModelOpt export). The KV cache is lossy when ``kv_cache_dtype`` (or a ModelOpt export's KV
    setting) names a type other than the model's dtype (the ``dtype`` knob, else the
    checkpoint's ``config.json``); a model dtype that cannot be read counts as other.
    """
    found = []
    quant = knobs.get("quantization")
    if quant is not None and str(quant) != "none":
        found.append(f"weights: quantization {quant}")
    else:
        declared = checkpoint_quantization(checkpoint)
        if declared is not None:
            found.append(f"weights: pre-quantized checkpoint ({declared})")
    folder = Path(checkpoint).expanduser() if checkpoint is not None else None
    here = folder if folder is not None and folder.is_dir() else None
    dtype = knobs.get("dtype")
    model_dtype = normalize_kv_dtype(str(dtype)) if dtype not in (None, "auto") else checkpoint_dtype(here)
    kv = knobs.get("kv_cache_dtype")
    if kv is not None and str(kv) != "auto":
        if normalize_kv_dtype(str(kv)) != model_dtype:
            found.append(f"KV cache: kv_cache_dtype {kv} (model dtype {model_dtype or 'unknown'})")
    elif here is not None:
        from_checkpoint = checkpoint_kv_dtype(here)
        if from_checkpoint is not None and from_checkpoint != model_dtype:
            found.append(f"KV cache: {from_checkpoint} ({here / QUANT_CONFIG})")
    return found
