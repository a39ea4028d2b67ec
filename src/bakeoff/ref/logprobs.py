"""Prompt logprobs and token ids as vLLM's ``/v1/completions`` returns them, with a planted logprob.

What vLLM 0.32 does (``entrypoints/openai/completion/protocol.py`` ``check_logprobs`` and
``completion/serving.py`` ``request_output_to_completion_response``, read from the released
wheel):

- ``prompt_logprobs: k`` on a non-streamed request answers ``choices[0].prompt_logprobs``: one
  entry per prompt token, the first ``null`` (nothing precedes it), each later one
  ``{"<token id>": {"logprob": float, "rank": int, "decoded_token": str}}`` holding that prompt
  token (and, for ``k`` above 0, the ``k`` most likely tokens at that place);
- ``return_token_ids: true`` adds ``choices[0].prompt_token_ids`` (the prompt's ids) and
  ``choices[0].token_ids`` (the answer's);
- a value that is not a number is a 400 (``must be an integer``), one below 0 other than -1
  too; streamed, ``prompt_logprobs`` above 0 or -1 is a 400 ("`prompt_logprobs` are not
  available when `stream=True`."), while 0 is accepted and the stream carries none.

The reference server's tokens are its whitespace-separated words (what its usage and prefix
cache count), so a prompt of ``n`` words has ``n`` ids and ``n - 1`` logprobs. The ids are
synthetic but stable across processes and runs (CRC-32 of the word, modulo :data:`VOCAB`); the
``decoded_token`` is the word with the whitespace before it, as a BPE token decodes. Every
prompt token gets the same planted logprob (``RefOptions.prompt_logprob``) at rank 1, so a
perplexity computed from the answer is ``exp(-prompt_logprob)`` exactly. Only ``k = 0`` is
served: the reference server has no distribution to rank other tokens from, and a list it
made up would be presented as vLLM's; ``k`` above 0 (or -1, the whole vocabulary) is refused
with a 400 that says so. Streamed ``return_token_ids`` ids are not reproduced.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

VOCAB = 32000  # the synthetic ids' range (a Llama 2 vocabulary)
PLANTED_RANK = 1  # the rank every prompt token is given: the model's first choice there
_PIECE = re.compile(r"\s*\S+")


class Refused(ValueError):
    """A request vLLM (or the reference server's reproduction of it) answers with HTTP 400."""


def token_id(word: str) -> int:
    """The stable synthetic id of one reference-server token (a whitespace-separated word)."""
    return zlib.crc32(word.encode()) % VOCAB


def token_ids(text: str) -> list[int]:
    return [token_id(word) for word in text.split()]


@dataclass(frozen=True)
class Asked:
    """What one completions request asked to get back about its prompt."""

    prompt: str
    logprobs: bool
    ids: bool

    def fields(self, answer: str, logprob: float) -> dict[str, Any]:
        """The fields the answer's choice gains: ``prompt_logprobs``, then the token ids."""
        out: dict[str, Any] = {}
        if self.logprobs:
            pieces = _PIECE.findall(self.prompt)
            entries: list[dict[str, dict[str, Any]] | None] = [None] if pieces else []
            for piece in pieces[1:]:
                stat = {"logprob": logprob, "rank": PLANTED_RANK, "decoded_token": piece}
                entries.append({str(token_id(piece.strip())): stat})
            out["prompt_logprobs"] = entries
        if self.ids:
            out["prompt_token_ids"] = token_ids(self.prompt)
            out["token_ids"] = token_ids(answer)
        return out


def asked(body: dict[str, Any], prompt: str) -> Asked | None:
    """What a completions body asks about its prompt (None: nothing); :class:`Refused` as vLLM refuses."""
    value = body.get("prompt_logprobs")
    ids = bool(body.get("return_token_ids"))
    if value is None:
        return Asked(prompt, logprobs=False, ids=True) if ids and not body.get("stream") else None
    if not isinstance(value, int | float):
        raise Refused("`prompt_logprobs` must be an integer.")
    if body.get("stream") and (value > 0 or value == -1):
        raise Refused("`prompt_logprobs` are not available when `stream=True`.")
    if value < 0 and value != -1:
        raise Refused("`prompt_logprobs` must be a positive value or -1.")
    if value != 0:
        raise Refused(
            f"reference server: prompt_logprobs {value} asks for other tokens' logprobs, which it has no "
            "distribution for; it serves prompt_logprobs 0 (each prompt token's own logprob) only"
        )
    if body.get("stream"):
        return None  # accepted; a stream carries no prompt logprobs
    return Asked(prompt, logprobs=True, ids=ids)
