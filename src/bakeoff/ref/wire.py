"""The generic wire profile of the reference server, and the base every framework profile extends.

A profile decides everything a client or bakeoff's probes can observe apart from timing and
injected faults (those stay :class:`bakeoff.ref.options.RefOptions`): health semantics, request
validation, the shape of every stream chunk, where usage goes, which metric names and types
are exported at which paths, how the prefix cache is reset, and whether prompt logprobs are
answered. The generic profile is
bakeoff's own server, every quirk switchable per request; :mod:`bakeoff.ref.profiles` says
what each framework profile reproduces and where each fact comes from.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol

import orjson
from aiohttp import web

from bakeoff.ref.cache import Counters, PrefixCache

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Served(Protocol):
    """What a profile's endpoints read from the running reference server."""

    model: str
    counters: Counters

    def own_metrics(self) -> str: ...


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def json_response(obj: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")


def exposition(rows: list[tuple[str, str, str, str, float]]) -> str:
    """Prometheus text as prometheus_client writes it: HELP and TYPE carry the sample name.

    ``rows`` are (sample name, type, help, rendered labels, value); a name repeated with
    other labels is one metric with several samples.
    """
    out: list[str] = []
    seen: set[str] = set()
    for name, kind, doc, labels, value in rows:
        if name not in seen:
            seen.add(name)
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        out.append(f"{name}{{{labels}}} {float(value)!r}\n" if labels else f"{name} {float(value)!r}\n")
    return "".join(out)


class WireProfile:
    """The generic profile: bakeoff's own quirk-switchable server; the base of the others."""

    name: ClassVar[str] = "generic"
    owner: ClassVar[str] = "bakeoff"
    block: ClassVar[int] = 16
    keep_last: ClassVar[bool] = False
    # Non-streamed completions answer prompt_logprobs and return_token_ids as vLLM does
    # (bakeoff.ref.logprobs); a profile whose framework does not return them this way says False.
    prompt_logprobs: ClassVar[bool] = True

    def __init__(self, warmup_s: float = 0.0) -> None:
        self.warmup_s = warmup_s
        self.started = time.monotonic()

    def startup_log(self, port: int) -> list[str]:
        """What the framework writes to its log while it starts, before serving (bakeoff reads some of it)."""
        return []

    def new_cache(self) -> PrefixCache:
        return PrefixCache(self.block, keep_last=self.keep_last)

    def routes(self, served: Served) -> list[tuple[str, str, Handler]]:
        """Health, metrics and cache-reset endpoints, as (method, path, handler)."""

        async def health(request: web.Request) -> web.StreamResponse:
            return web.Response(text="ok")

        async def metrics(request: web.Request) -> web.StreamResponse:
            return web.Response(text=served.own_metrics(), content_type="text/plain")

        async def reset(request: web.Request) -> web.StreamResponse:
            served.counters.cache.clear()
            return web.Response(text="ok")

        return [("GET", "/health", health), ("GET", "/metrics", metrics), ("POST", "/reset_prefix_cache", reset)]

    # --- requests -------------------------------------------------------------------

    def check_request(self, body: dict[str, Any], *, chat: bool, model: str) -> web.Response | None:
        """An error answer for a request this framework refuses, else None."""
        return None

    def wants_usage(self, stream_options: object) -> bool:
        return isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))

    def error(self, status: int, message: str) -> web.Response:
        body = {
            "object": "error",
            "message": message,
            "type": "BadRequestError" if status == 400 else "InternalServerError",
            "code": status,
        }
        return json_response(body, status)

    # --- answers --------------------------------------------------------------------

    def chunk_sizes(self, max_tokens: int, per_chunk: int) -> list[int]:
        sizes = [per_chunk] * (max_tokens // per_chunk)
        return [*sizes, max_tokens % per_chunk] if max_tokens % per_chunk else sizes

    def usage(self, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def opening(self, head: dict[str, Any], *, chat: bool, role_chunk: bool, no_content_key: bool) -> bytes:
        """What goes out at once, before the first content chunk."""
        if not (role_chunk or no_content_key):
            return b""
        if not chat:
            return sse({**head, "choices": [{"index": 0, "text": "", "finish_reason": None}]})
        delta = {"role": "assistant"} if no_content_key else {"role": "assistant", "content": ""}
        return sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})

    def content(self, head: dict[str, Any], *, chat: bool, text: str, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        return {**head, "choices": [choice]}

    def reasoning(self, head: dict[str, Any], *, text: str) -> dict[str, Any]:
        """A chat chunk of reasoning tokens: OpenAI-style ``reasoning_content`` in the generic profile."""
        return {**head, "choices": [{"index": 0, "delta": {"reasoning_content": text}, "finish_reason": None}]}

    def reasoning_usage(self, usage: dict[str, Any], reasoning: int) -> dict[str, Any]:
        """``usage`` of a reasoning answer: OpenAI's ``completion_tokens_details.reasoning_tokens`` here."""
        return {**usage, "completion_tokens_details": {"reasoning_tokens": reasoning}}

    def closing(self, head: dict[str, Any], *, chat: bool, finish: str = "length") -> bytes:
        """What follows the last content chunk, before the usage chunk (``finish``: the answer's finish reason)."""
        return b""

    def usage_chunk(self, head: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        return {**head, "choices": [], "usage": usage}

    def on_prefill(self, counters: Counters) -> None:
        """An engine iteration ran a request's prefill (TensorRT-LLM logs iteration stats)."""

    def on_finish(self, counters: Counters) -> None:
        """A request left the engine."""


def usage_info(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """``usage`` in the field order of vLLM's and TensorRT-LLM's ``UsageInfo`` models."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
