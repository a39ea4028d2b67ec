"""Rehearsals: a GPU campaign run end to end on any machine, with nothing presented as measured.

``bakeoff campaign run CAMPAIGN --rehearse`` keeps every part of bakeoff real (validation,
request plans, launch rendering, health probes, metric scrapes, cache resets, notebooks,
report) and replaces only each GPU framework's container with the reference server in that
framework's wire profile (:mod:`bakeoff.serving.launchers`). To keep it quick, the campaign is
scaled down (:meth:`for_rehearsal` of each workload kind: a few requests per level, short
outputs; of a ``tune:`` section: two trials, one finalist) and planned with the generated
``tiny`` model's tokenizer, since the GPU checkpoint is not on this machine.

With a ``quality:`` section, each stand-in answers the prompt set with answers made to pass
its checks (:func:`stand_in_answers`: an ``exact`` item its answer, a ``json`` item an object
with its required keys, a ``free`` item a word count inside its bounds), and a stand-in for a
lossy launch (quantized weights or KV cache) answers a planted share of them wrong
(:mod:`bakeoff.serving.stand_in_quality`), so the quality-drop path runs end to end too.

A rehearsal's campaign folder holds :data:`MARKER`; every run summary it produces carries
``"rehearsal": true`` and the report says REHEARSAL on every section, so its figures can
never be mistaken for a measurement of the frameworks.
"""

from __future__ import annotations

import json
from pathlib import Path

from bakeoff.backends.server_config import ServerConfig
from bakeoff.campaign.gpu_host import gpu_host_steps
from bakeoff.campaign.quality import QualityItem, load_prompt_set, normalize
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.models.model_source import ModelRef
from bakeoff.results.layout import REHEARSAL_MARKER, REHEARSAL_TAG, rehearsal_marker
from bakeoff.results.store import write_json
from bakeoff.serving.stand_in_quality import StandIn, StandInAnswer

REHEARSAL_PRESET = "tiny"
# The words of a stand-in's free-text answers: right ones read as text, wrong ones as garble,
# so a wrong answer also disagrees with a clean baseline's word by word.
FREE_WORDS = ("the", "stand-in", "answers", "this", "item", "with", "planted", "words", "inside", "its", "bounds")
GARBLED_WORD = "garbled"


def rehearsal_spec(spec: CampaignSpec) -> CampaignSpec:
    """The campaign scaled down for a rehearsal, planned with the generated tiny tokenizer, its servers
    on the rehearsal launcher (:meth:`ServerConfig.for_rehearsal`)."""
    # Same served name, context length and draft model; only the source of the tokenizer changes.
    fields = spec.model.model_dump()
    fields.update({key: None for key in ("path", "hf_id") if key in fields})
    model = ModelRef.model_validate({**fields, "preset": REHEARSAL_PRESET})
    workloads = [wl.for_rehearsal() for wl in spec.workloads]
    # Every server on the rehearsal launcher: the campaign copy carries it, so each cell, trial and
    # ladder step made from it starts its GPU backend's stand-in with no flag passed along.
    servers = [s.for_rehearsal() for s in spec.servers]
    # One repeat: a rehearsal proves the path, it has no noise worth an interval.
    update = {
        "model": model,
        "workloads": workloads,
        "servers": servers,
        "measure_warm_restart": True,
        "repeats": 1,
        "max_repeats": None,
    }
    if spec.tune is not None:  # bakeoff tune --rehearse: a budget that runs each step of the tune once
        update["tune"] = spec.tune.for_rehearsal()
    return spec.model_copy(update=update)


def write_marker(out_dir: Path, source: Path, spec: CampaignSpec, command: str = "campaign run") -> None:
    """The marker that makes a folder a rehearsal, with the steps that run ``spec`` for real on a GPU host.

    ``command``: what the rehearsal stood in for (``campaign run``; ``tune`` for ``bakeoff tune --rehearse``).
    """
    steps = gpu_host_steps(spec, source, out_dir, command)
    write_json(
        out_dir / REHEARSAL_MARKER,
        {
            "rehearsal": True,
            "source_campaign": str(source),
            "command": command,
            "original_model": spec.model.model_dump(mode="json", exclude_none=True),
            "note": "reference-server stand-ins for GPU containers; no figure here is a measurement",
            "gpu_host": {"text": steps.text(REHEARSAL_TAG), "markdown": steps.markdown()},
        },
    )


def gpu_host_text(out_dir: Path) -> str | None:
    """The console form of a rehearsal's "on the GPU host" steps, as its marker recorded them."""
    marker = rehearsal_marker(out_dir)
    steps = marker.get("gpu_host") if marker else None
    return str(steps["text"]) if isinstance(steps, dict) and "text" in steps else None


def _free_text(words: int, vocabulary: tuple[str, ...]) -> str:
    return " ".join(vocabulary[n % len(vocabulary)] for n in range(words))


def _right(item: QualityItem) -> str:
    """An answer that passes every check of ``item`` (within its ``max_tokens`` where the set allows)."""
    if item.kind == "exact":
        return str(item.answer)
    if item.kind == "json":
        # Without spaces: one reference-server token, so no max_tokens can cut it.
        return json.dumps({key: "rehearsal" for key in item.required_keys or ["answer"]}, separators=(",", ":"))
    low = item.min_words or 0
    high = item.max_words if item.max_words is not None else low + len(FREE_WORDS)
    words = min(max(1, (low + high) // 2, low), high, max(item.max_tokens, low))
    return _free_text(words, FREE_WORDS)


def _wrong(item: QualityItem) -> str:
    """An answer that fails ``item``'s check: another exact answer, an unclosed JSON object, a length out of range."""
    right = _right(item)
    if item.kind == "exact":
        flipped = right[::-1]
        return flipped if normalize(flipped) != normalize(right) else right + right
    if item.kind == "json":
        return right[:-1]  # the object is never closed
    if item.min_words:  # too short, else too long (a max_tokens below max_words then cuts it into range)
        return _free_text(item.min_words - 1, (GARBLED_WORD,))
    return _free_text((item.max_words or 0) + 1, (GARBLED_WORD,))


def stand_in_answers(items: list[QualityItem]) -> tuple[StandInAnswer, ...]:
    """Each asked item of a prompt set with an answer that passes its checks and one that fails them
    (``perplexity`` items are scored by prompt logprobs, not answered: none for them)."""
    return tuple(StandInAnswer(i.id, i.kind, i.prompt, _right(i), _wrong(i)) for i in items if i.kind != "perplexity")


def stand_in_for(spec: CampaignSpec, campaign_dir: Path, server: ServerConfig) -> StandIn:
    """What ``server``'s stand-in in this rehearsal answers, and the checkpoint it serves on a real run.

    The checkpoint is the server's ``model_path``, else the campaign's model before the
    rehearsal swapped it for the tiny one (the marker keeps it).
    """
    original = (rehearsal_marker(campaign_dir) or {}).get("original_model") or {}
    checkpoint = server.model_path or original.get("path") or original.get("hf_id")
    answers = stand_in_answers(load_prompt_set(spec.quality.prompts)) if spec.quality is not None else ()
    return StandIn(answers=answers, checkpoint=str(checkpoint) if checkpoint else None)
