"""Held-out perplexity of a served model, from the server's own prompt logprobs.

A quality set's ``perplexity`` items (:mod:`bakeoff.campaign.quality`) are texts the model is
scored on rather than asked about: for each, one non-streaming ``/v1/completions`` request with
vLLM's ``prompt_logprobs: 0`` (the logprob of each prompt token given the ones before it, and
no alternatives) and ``return_token_ids: true`` (the prompt's token ids, to pick each token's
entry out of a position that could also list others), ``max_tokens: 1``. Over all the items'
scored tokens (every prompt token but the first, which has no context)::

    perplexity = exp(-sum(logprob) / tokens)

the same figure as the model card's held-out perplexity, but as the configuration serves it:
a quantized weight or KV cache that degrades the model raises it, where the exact-answer rate
may not move. It is measured only on backends that return prompt logprobs this way
(``prompt_logprobs: true`` in the backend YAML: vLLM; llama.cpp's server returns logprobs of
generated tokens only, SGLang and TensorRT-LLM not in this form); elsewhere the result says why
it was not measured, and the rate is None, never a guess.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from bakeoff.measure.client import ENDPOINT_PATHS, ClientSettings
from bakeoff.measure.control import call


def token_logprobs(choice: dict[str, Any]) -> list[float]:
    """The logprob of each prompt token after the first, from one completions choice.

    A position's entry is keyed by token id (a string in JSON); with ``prompt_token_ids`` the
    prompt's own token is looked up, otherwise a position must hold exactly one entry.
    """
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) < 2:
        raise ValueError("the answer has no prompt_logprobs (a list with an entry per prompt token)")
    ids = choice.get("prompt_token_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) != len(entries)):
        count = len(ids) if isinstance(ids, list) else "?"
        raise ValueError(f"prompt_token_ids has {count} ids for {len(entries)} positions")
    found = []
    for position, entry in enumerate(entries[1:], start=1):
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"prompt_logprobs[{position}] is {entry!r}, not a token -> logprob object")
        if ids is not None:
            key = str(ids[position])
            if key not in entry:
                raise ValueError(f"prompt_logprobs[{position}] does not hold the prompt's token {key}")
            value = entry[key]
        elif len(entry) == 1:
            value = next(iter(entry.values()))
        else:
            raise ValueError(f"prompt_logprobs[{position}] lists {len(entry)} tokens and no prompt_token_ids say which")
        logprob = value.get("logprob") if isinstance(value, dict) else None
        if not isinstance(logprob, int | float) or logprob > 0 or math.isnan(logprob):
            raise ValueError(f"prompt_logprobs[{position}]: {logprob!r} is not a log-probability")
        found.append(float(logprob))
    return found


def request_body(model: str, text: str) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "prompt": text,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        }
    )


def score_text(settings: ClientSettings, text: str) -> list[float]:
    """One text's prompt-token logprobs from the server; a ValueError says what went wrong."""
    answer = call(
        settings.base_url.rstrip("/") + ENDPOINT_PATHS["completions"],
        method="POST",
        headers=settings.headers,
        timeout_s=settings.request_timeout_s,
        data=request_body(settings.model, text),
        content_type="application/json",
    )
    if answer.status != 200:
        detail = answer.body[:300].decode(errors="replace") or answer.reason
        raise ValueError(f"HTTP {answer.status if answer.status is not None else 'no answer'}: {detail}")
    payload = orjson.loads(answer.body)
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices")
    return token_logprobs(choices[0])


def measure(settings: ClientSettings, texts: list[str], *, supported: bool, backend: str) -> dict[str, Any]:
    """Perplexity over ``texts`` on the server, or why it is not measured (``perplexity`` None)."""
    result: dict[str, Any] = {"perplexity": None, "documents": len(texts), "tokens": 0, "why_not": None}
    if not texts:
        result["why_not"] = "the quality set has no perplexity items"
        return result
    if not supported:
        result["why_not"] = f"{backend} does not return prompt logprobs (prompt_logprobs in its backend YAML)"
        return result
    logprobs: list[float] = []
    for number, text in enumerate(texts):
        try:
            logprobs += score_text(settings, text)
        except ValueError as exc:
            result["why_not"] = f"perplexity item {number}: {exc}"
            return result
    result.update(tokens=len(logprobs), perplexity=math.exp(-sum(logprobs) / len(logprobs)) if logprobs else None)
    if not logprobs:
        result["why_not"] = "every perplexity text was a single token"
    return result
