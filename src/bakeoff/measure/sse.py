"""Server-sent events: split a byte stream into events and read OpenAI stream chunks.

Kept free of I/O so every quirk seen on real servers is unit-tested here: role-only or
empty first chunks, TensorRT-LLM's first chunk without a ``content`` key, several tokens
per chunk, usage in its own ``choices: []`` chunk or inside the finish chunk, SSE comments,
CRLF line ends, and lines far longer than any default read buffer.

Reasoning models stream their thinking in a delta field of its own, not in ``content``
(the server's reasoning parser splits it off). Which field, read from each framework's
released code:

- vLLM: ``reasoning_content`` until the rename of late 2025 (vllm-project/vllm#27752),
  ``reasoning`` after it; ``vllm/entrypoints/openai/engine/protocol.py`` ``DeltaMessage``
  (read at commit 040a2cc) carries both, ``reasoning_content`` a deprecated copy of
  ``reasoning``; releases in between sent ``reasoning`` alone.
- SGLang: ``reasoning_content`` (``srt/entrypoints/openai/protocol.py`` ``DeltaMessage``),
  and its ``UsageInfo`` has a top-level ``reasoning_tokens`` (0 unless counted).
- TensorRT-LLM: ``reasoning_content`` (``serve/openai_protocol.py`` ``DeltaMessage``,
  dumped with ``exclude_none``, so ``""`` shows in answer chunks); no reasoning count in usage.
- llama.cpp: ``reasoning_content`` with ``--reasoning-format deepseek`` (``common/chat.cpp``
  ``common_chat_msg_diff``); with ``none`` the thinking stays inside ``content``.

Both names are read; when a delta carries both (vLLM's copy) ``reasoning`` is taken, once.
The OpenAI usage field ``completion_tokens_details.reasoning_tokens`` is read where sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson

DONE = b"[DONE]"


class SSEDecoder:
    """Incremental SSE parser: feed raw bytes, get back the data payload of each event."""

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        if not self._buffer and not self._data and chunk.startswith(b"data:") and chunk.endswith(b"\n\n"):
            # Fast path for the usual read, exactly one single-line event: no line loop.
            end = len(chunk) - 2
            if chunk.find(b"\n") == end and chunk[end - 1] != 0x0D:
                value = chunk[5:end]
                return [value[1:] if value.startswith(b" ") else value]
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[bytes] = []
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = buffer[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # Lines starting with ':' are comments (keep-alives); event:/id:/retry: carry
            # nothing bakeoff needs.
        self._buffer = buffer[start:]
        return events

    def single_events(self, chunks: list[bytes]) -> list[bytes] | None:
        """The payload of each of ``chunks`` when each is exactly one one-line ``data: `` event; else None.

        The batch form of :meth:`feed`'s fast path, for chunks parsed after they arrived;
        with None nothing was consumed and the chunks go through :meth:`feed` one by one.
        """
        if self._buffer or self._data:
            return None
        blob = b"".join(chunks)
        # Every chunk ends in a blank line and there is no other newline (two a chunk in all):
        # each chunk is one one-line event, so the payloads split at the chunk ends. No loop
        # of Python a chunk: these run over every event of a stream.
        if (
            blob.count(b"\n") != 2 * len(chunks)
            or b"\r" in blob
            or not all(map(bytes.endswith, chunks, repeat(b"\n\n")))
            or not all(map(bytes.startswith, chunks, repeat(b"data: ")))
        ):
            return None
        return (b"\n\n" + blob[:-2]).split(b"\n\ndata: ")[1:]

    def flush(self) -> list[bytes]:
        """Events left when the stream closed without a final blank line."""
        tail = self.feed(b"\n\n") if self._buffer or self._data else []
        self._buffer = b""
        return tail


@dataclass(slots=True)
class ChunkInfo:
    """What one stream chunk tells the client."""

    text: str | None  # generated content, None when the chunk carries none
    finish_reason: str | None
    usage: dict[str, Any] | None
    error: str | None
    reasoning: str | None = None  # reasoning (thinking) text, None when the chunk carries none


# What one payload tells, in ChunkInfo's field order: text, finish_reason, usage, error, reasoning.
ChunkFields = tuple[str | None, str | None, dict[str, Any] | None, str | None, str | None]


def read_chunk(payload: bytes) -> ChunkInfo:
    """Interpret one ``data:`` payload of a completions or chat-completions stream."""
    return ChunkInfo(*next(read_chunks((payload,))))


def read_chunks(payloads: Iterable[bytes]) -> Iterator[ChunkFields]:
    """:func:`read_chunk` over a stream's payloads, each as a plain tuple.

    The form the end of a stream reads its events in (a few dozen to thousands a request): one
    generator step an event, no object and no call of its own, where the per-event cost of
    the run is paid.
    """
    loads, bad_json = orjson.loads, orjson.JSONDecodeError
    for payload in payloads:
        try:
            obj = loads(payload)
        except bad_json:
            yield None, None, None, f"unparseable chunk: {payload[:200]!r}", None
            continue
        if not isinstance(obj, dict):
            yield None, None, None, f"unexpected chunk: {payload[:200]!r}", None
            continue
        error = obj.get("error")
        if error is not None or obj.get("object") == "error":
            message = error.get("message", error) if isinstance(error, dict) else (error or obj)
            yield None, None, None, str(message)[:500], None
            continue
        text = None
        finish = None
        reasoning = None
        choices = obj.get("choices")
        if choices:
            choice = choices[0]
            finish = choice.get("finish_reason")
            delta = choice.get("delta")
            # Chat streams put text in delta.content (absent on TensorRT-LLM's role chunk);
            # completions streams put it in text.
            if delta is not None:
                text = delta.get("content")
                # vLLM's newer name first: where both are sent, one is a copy of the other. Only
                # text counts (some gateways put an object under "reasoning").
                reasoning = delta.get("reasoning")
                if not isinstance(reasoning, str) or not reasoning:
                    reasoning = delta.get("reasoning_content")
                    if not isinstance(reasoning, str) or not reasoning:
                        reasoning = None
            else:
                text = choice.get("text")
            if not text:
                text = None
        yield text, finish, obj.get("usage"), None, reasoning


def reasoning_tokens_of(usage: dict[str, Any]) -> int | None:
    """Reasoning tokens the server counted: OpenAI's ``completion_tokens_details`` or SGLang's top-level field."""
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict) and details.get("reasoning_tokens") is not None:
        return int(details["reasoning_tokens"])
    if usage.get("reasoning_tokens") is not None:
        return int(usage["reasoning_tokens"])
    return None


def cached_tokens_of(usage: dict[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        return int(details["cached_tokens"])
    return None


def split_tokens(total: int, weights: list[int]) -> list[int]:
    """Share ``total`` tokens over chunks in proportion to ``weights`` (largest remainder).

    Used when a server sends several tokens per chunk: usage gives the total, chunk text
    lengths (or per-chunk tokenizer counts) give the shares.
    """
    if not weights:
        return []
    if total == len(weights):
        return [1] * len(weights)
    weight_sum = sum(weights)
    if weight_sum <= 0:
        base, extra = divmod(total, len(weights))
        return [base + (1 if i < extra else 0) for i in range(len(weights))]
    exact = [total * w / weight_sum for w in weights]
    shares = [int(x) for x in exact]
    remainder = total - sum(shares)
    order = sorted(range(len(weights)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in order[:remainder]:
        shares[i] += 1
    return shares
