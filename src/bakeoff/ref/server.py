"""A reference OpenAI-compatible streaming server with exactly known timing and faults.

bakeoff's numbers are only as good as its measurement, so this server exists to test the
measurement: it streams ``max_tokens`` tokens on a fixed schedule (first content chunk at
``t0 + ttft``, content chunk ``i`` at ``t0 + ttft + i * itl``, ``t0`` being the arrival of
the request) and reproduces the protocol quirks and failures seen on real servers:

- a role-only first chunk, or TensorRT-LLM's first chunk without a ``content`` key;
- several tokens per chunk (``itl`` is then the gap between chunks, not between tokens);
- usage in its own ``choices: []`` chunk, inside the finish chunk, or absent;
- SSE comment lines, and one very long line;
- faults on every Nth request: HTTP 500, an error object mid-stream, a cut connection,
  a stall, or the whole process dying mid-stream;
- canned answers (``--canned FILE``, prompt -> text): the quality checks' planted outputs,
  ending with ``finish_reason: stop``, or ``length`` where ``max_tokens`` cuts them;
- speculative decoding (``spec_tokens``, ``spec_accept``): each decode step sends its own
  token and the drafts it accepted in one chunk, counted for the profile's metrics
  (:mod:`bakeoff.ref.speculation`);
- a reasoning phase (chat, ``reasoning_tokens``): the first tokens of the answer go out in
  the profile's reasoning delta field, then the answer after ``answer_gap_ms``, with the
  profile's reasoning count (or none) in usage;
- prompt logprobs (non-streamed completions with ``prompt_logprobs: 0``, and
  ``return_token_ids``), as vLLM returns them, every prompt token at the planted
  ``prompt_logprob``; the ids are the server's tokens (whitespace-separated words, as usage
  counts them) under stable synthetic ids (:mod:`bakeoff.ref.logprobs`).

Options are set on the command line and can be overridden per request with a JSON object
in the ``x-bakeoff-ref`` header or a ``ref`` field of the request body. Sleeping until each
deadline, rather than for each gap, keeps scheduling delays from accumulating; how late
each write went out is exposed on ``/metrics`` (and ``/ref/metrics``) so a benchmark can
tell whether the server itself was the bottleneck. Run it with
``python -m bakeoff.ref.server --port P``. Its options and clock are :mod:`bakeoff.ref.options`.

``--profile vllm|sglang|trtllm`` makes it answer as that framework does on the wire (health,
validation, chunk shapes, metric names, cache reset: :mod:`bakeoff.ref.profiles`), for
rehearsals of the GPU path; ``generic``, the default, is the quirk-switchable server above.
In a framework profile the timing, fault and ``usage`` options still apply (``separate``,
the default, is what all three do), the first-chunk options (``role_chunk``,
``content_key_missing``) are the framework's own, and a ``ref`` body field is an unknown
field like any other (TensorRT-LLM refuses it: use the header). Prompt logprobs are answered
in the vLLM profile (and the generic one) only: SGLang's stand-in ignores the fields,
TensorRT-LLM's refuses them as unknown, as those servers do not return them this way.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, get_args

import orjson
from aiohttp import web

from bakeoff.ref.batching import Slots, first_token_ms, gap_ms
from bakeoff.ref.cache import Counters
from bakeoff.ref.logprobs import Asked, Refused, asked
from bakeoff.ref.options import MODEL, Fault, RefOptions, ServerStats, UsageMode, canned_key, load_canned
from bakeoff.ref.profiles import PROFILES, make_profile
from bakeoff.ref.speculation import Drafts, split_at, step_sizes
from bakeoff.ref.wire import WireProfile, sse

KEEP_ALIVE = b": keep-alive\n\n"
DONE_EVENT = b"data: [DONE]\n\n"


class ReferenceServer:
    """The aiohttp application and its per-process state."""

    def __init__(
        self,
        options: RefOptions,
        model: str = MODEL,
        api_key: str | None = None,
        profile: WireProfile | None = None,
        prefix_cache: bool = True,
        canned: dict[str, str] | None = None,
    ) -> None:
        self.options = options
        self.canned = canned or {}  # prompt -> the answer to give it (see canned_key)
        self.model = model
        self.profile = profile or WireProfile()
        cache = self.profile.new_cache()
        cache.enabled = prefix_cache
        self.counters = Counters(cache, speculating=options.spec_tokens > 0)
        self._next_key = 0
        self.api_key = api_key  # then every route, health and metrics too, wants it as a bearer token
        self.stats = ServerStats()
        self.slots = Slots(options.slots)  # one scheduler: the server's own option, never a request's
        self._fault_counts: dict[RefOptions, int] = {}
        self._created = int(time.time())
        self._up_since = time.monotonic()  # the planted drift grows from here (RefOptions.ttft_growth_ms_per_s)

    def app(self) -> web.Application:
        middlewares = [self._require_key] if self.api_key else []
        app = web.Application(client_max_size=64 << 20, middlewares=middlewares)
        # Health, metrics and cache reset are the profile's: paths and answers differ per framework.
        for method, path, handler in self.profile.routes(self):
            app.router.add_route(method, path, handler)
        app.router.add_get("/ref/metrics", self._own_metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    @web.middleware
    async def _require_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error_response(401, "missing or wrong API key")
        response: web.StreamResponse = await handler(request)
        return response

    async def _models(self, request: web.Request) -> web.Response:
        data = {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "owned_by": self.profile.owner}],
        }
        return web.json_response(data, dumps=lambda v: orjson.dumps(v).decode())

    def own_metrics(self) -> str:
        return self.stats.prometheus(self.model, self.counters)

    async def _own_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.own_metrics(), content_type="text/plain")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _is_faulty(self, opts: RefOptions) -> bool:
        if opts.fault == "none":
            return False
        count = self._fault_counts[opts] = self._fault_counts.get(opts, 0) + 1
        return count % opts.fault_every == 0

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        # The schedule starts when the request arrives. time.monotonic, not loop.time:
        # uvloop's clock is cached per loop iteration and has millisecond resolution.
        t0 = time.monotonic()
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise TypeError("the request body must be a JSON object")
            refused = self.profile.check_request(body, chat=chat, model=self.model)
            if refused is not None:
                return refused
            opts = self.options
            if "x-bakeoff-ref" in request.headers:
                opts = opts.override(orjson.loads(request.headers["x-bakeoff-ref"]))
            if "ref" in body:
                opts = opts.override(body["ref"])
            max_tokens = int(body.get("max_tokens") or 16)
            if max_tokens < 1:
                raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
            if opts.eos_after:
                max_tokens = min(max_tokens, max(opts.eos_after, int(body.get("min_tokens") or 0)))
            prompt = " ".join(str(m.get("content", "")) for m in body["messages"]) if chat else str(body["prompt"])
            # Prompt logprobs and token ids: vLLM's completions fields (bakeoff.ref.logprobs).
            about = asked(body, prompt) if self.profile.prompt_logprobs and not chat else None
        except Refused as exc:
            return self.profile.error(400, str(exc))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self.profile.error(400, f"bad request: {exc}")
        # A canned answer (--canned) ends on its own ("stop") unless max_tokens cuts it ("length").
        canned = self.canned.get(canned_key(body, chat=chat))
        pieces = re.findall(r"\s*\S+", canned) if canned is not None else None
        if pieces is not None and opts.garble:
            pieces = [" garbled"] * len(pieces)  # a broken configuration: same length, wrong text
        finish = "length"
        if pieces is not None:
            finish = "stop" if len(pieces) <= max_tokens else "length"
            max_tokens = max(min(max_tokens, len(pieces)), 1)
        faulty = self._is_faulty(opts)
        if faulty and opts.fault == "http500":
            return self.profile.error(500, "injected fault: internal server error")
        words = prompt.split()
        async with self.slots.held(self.counters) as waited:
            # The schedule starts once the request holds a slot (on arrival when it did not wait).
            start = time.monotonic() if waited else t0
            return await self._serve(request, body, opts, chat, start, words, max_tokens, pieces, finish, faulty, about)

    async def _serve(
        self,
        request: web.Request,
        body: dict[str, Any],
        opts: RefOptions,
        chat: bool,
        t0: float,
        words: list[str],
        max_tokens: int,
        pieces: list[str] | None,
        finish: str,
        faulty: bool,
        about: Asked | None = None,
    ) -> web.StreamResponse:
        key = self._next_key = self._next_key + 1
        cached = self.counters.admit(key, words, max_tokens)
        self.profile.on_prefill(self.counters)
        usage = self.profile.usage(len(words), max_tokens, cached)
        include_usage = self.profile.wants_usage(body.get("stream_options")) and opts.usage != "none"
        reasoning = min(opts.reasoning_tokens, max_tokens) if chat else 0
        if reasoning:
            usage = self.profile.reasoning_usage(usage, reasoning)
        # Equal-width tokens (reasoning " r3", answer " w3"): clients that share usage tokens
        # over chunks by text length then get the exact split back. Each phase is chunked on
        # its own, so no chunk straddles the two.
        texts: list[str] = []
        thinking, answering, drafts = self._chunk_sizes(opts, max_tokens, reasoning)
        start = 0
        for size in thinking:
            texts.append("".join(f" r{t % 10}" for t in range(start, start + size)))
            start += size
        start = 0
        for size in answering:
            if pieces is not None:
                texts.append("".join(pieces[start : start + size]))
            else:
                texts.append("".join(f" w{t % 10}" for t in range(start, start + size)))
            start += size
        finished = False
        first_ms = first_token_ms(opts, len(words)) + opts.ttft_growth_ms_per_s * (t0 - self._up_since)
        try:
            if not body.get("stream"):
                gaps = (len(texts) - 1) * gap_ms(opts, self.counters.running)
                await self.stats.pacer.until(t0 + (first_ms + gaps) / 1e3)
                finished = True
                text = "".join(texts)
                extra = about.fields(text, opts.prompt_logprob) if about is not None else {}
                return self._whole(chat, text, usage, finish, extra)
            tail = usage if include_usage else None
            resp, finished = await self._stream(
                request, opts, chat, t0, first_ms, texts, tail, faulty, finish, len(thinking)
            )
            return resp
        finally:
            self.counters.release(key, generated=max_tokens, finished=finished, drafts=drafts)
            self.profile.on_finish(self.counters)

    def _chunk_sizes(self, opts: RefOptions, max_tokens: int, reasoning: int) -> tuple[list[int], list[int], Drafts]:
        """Tokens per chunk of the reasoning and of the answer, and what speculation drafted for them.

        Speculating, a chunk is a decode step (bakeoff.ref.speculation) and the profile's own
        chunking does not apply; a step across the reasoning's end is sent as two chunks.
        """
        if opts.spec_tokens:
            sizes, drafts = step_sizes(max_tokens, opts.spec_tokens, opts.spec_accept)
            thinking, answering = split_at(sizes, reasoning)
            return thinking, answering, drafts
        answer = max_tokens - reasoning
        thinking = self.profile.chunk_sizes(reasoning, opts.tokens_per_chunk) if reasoning else []
        answering = self.profile.chunk_sizes(answer, opts.tokens_per_chunk) if answer else []
        return thinking, answering, Drafts()

    def _whole(
        self, chat: bool, text: str, usage: dict[str, Any], finish: str = "length", extra: dict[str, Any] | None = None
    ) -> web.Response:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(extra or {})  # prompt logprobs and token ids, where asked for
        obj = {
            "id": "ref",
            "object": "chat.completion" if chat else "text_completion",
            "created": self._created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }
        return web.Response(body=orjson.dumps(obj), content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        opts: RefOptions,
        chat: bool,
        t0: float,
        first_ms: float,
        texts: list[str],
        usage: dict[str, Any] | None,
        faulty: bool,
        finish: str = "length",
        thinking: int = 0,
    ) -> tuple[web.StreamResponse, bool]:
        """Stream the answer; also say whether it went out whole (no fault cut it short).

        The first ``thinking`` texts are reasoning chunks; the answer's follow ``answer_gap_ms`` later.
        """
        stats, profile = self.stats, self.profile
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head = {
            "id": "ref",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self._created,
            "model": self.model,
        }
        prefix = KEEP_ALIVE if opts.comments else b""
        if opts.comments:
            await resp.write(KEEP_ALIVE)
        opening = profile.opening(head, chat=chat, role_chunk=opts.role_chunk, no_content_key=opts.content_key_missing)
        if opening:
            await resp.write(prefix + opening)
        fault_at = len(texts) // 2 if opts.fault_after < 0 else opts.fault_after
        last = len(texts) - 1
        offset_ms = first_ms
        for i, text in enumerate(texts):
            if faulty and i == fault_at:
                return await self._mid_stream_fault(request, resp, opts), False
            if i < thinking:
                chunk = profile.reasoning(head, text=text)
            else:
                chunk = profile.content(head, chat=chat, text=text, finish=finish if i == last else None)
            if i == 0 and opts.long_line_bytes:
                chunk["pad"] = "x" * opts.long_line_bytes
            if i == last and usage is not None and opts.usage == "finish":
                chunk["usage"] = usage
            data = prefix + sse(chunk)
            if i == last:
                # The tail goes out in the same write: real servers flush it back to back.
                data += profile.closing(head, chat=chat, finish=finish)
                if usage is not None and opts.usage == "separate":
                    data += sse(profile.usage_chunk(head, usage))
                data += DONE_EVENT
            if i:  # each gap as long as the batch in flight makes it now (bakeoff.ref.batching)
                offset_ms += gap_ms(opts, self.counters.running)
            if thinking and i == thinking:  # the pause between the reasoning and the answer
                offset_ms += opts.answer_gap_ms
            await stats.pacer.until(t0 + offset_ms / 1e3)
            stats.chunks += 1
            await resp.write(data)
        await resp.write_eof()
        return resp, True

    async def _mid_stream_fault(
        self, request: web.Request, resp: web.StreamResponse, opts: RefOptions
    ) -> web.StreamResponse:
        if opts.fault == "error":
            error = {
                "error": {
                    "message": "injected fault: engine error",
                    "type": "InternalServerError",
                    "code": 500,
                }
            }
            await resp.write(sse(error) + DONE_EVENT)
            await resp.write_eof()
        elif opts.fault == "cut":
            # Closing the socket before the terminating zero-length chunk: a truncated body.
            if request.transport is not None:
                request.transport.close()
        elif opts.fault == "stall":
            await asyncio.sleep(opts.stall_s)
        elif opts.fault == "die":
            os._exit(3)  # no cleanup, like a crashed engine
        return resp


def _error_response(status: int, message: str) -> web.Response:
    body = {
        "object": "error",
        "message": message,
        "type": "BadRequestError" if status == 400 else "InternalServerError",
        "code": status,
    }
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bakeoff.ref.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=MODEL, help="served model name")
    parser.add_argument("--api-key-env", metavar="NAME", help="require the key in this variable as a bearer token")
    parser.add_argument("--profile", choices=PROFILES, default="generic", help="whose wire protocol to reproduce")
    parser.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="simulate a prefix cache (off: a server started with prefix caching disabled)",
    )
    parser.add_argument(
        "--warmup-s", type=float, default=None, help="seconds /health answers 503 after start (sglang: 0.5)"
    )
    parser.add_argument(
        "--startup-log",
        action="store_true",
        help="write the framework's start-up log lines (trtllm: the PyTorch flow's build markers) before serving",
    )
    parser.add_argument(
        "--canned", type=Path, help="JSON object: prompt (a chat's last message) -> the answer to give it"
    )
    defaults = RefOptions()
    for f in fields(RefOptions):
        default = getattr(defaults, f.name)
        flag = option_flag(f.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif f.name in ("usage", "fault"):
            parser.add_argument(flag, choices=get_args(UsageMode if f.name == "usage" else Fault), default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = vars(build_parser().parse_args(argv))
    host, port, model = args.pop("host"), args.pop("port"), args.pop("model")
    profile_name, warmup_s = args.pop("profile"), args.pop("warmup_s")
    prefix_cache = args.pop("prefix_cache")
    canned_path = args.pop("canned")
    startup_log = args.pop("startup_log")
    key_env = args.pop("api_key_env")
    api_key = os.environ.get(key_env, "") if key_env else None
    if key_env and not api_key:
        sys.exit(f"refserver: --api-key-env {key_env}: that variable is not set")
    try:
        options = RefOptions(**args)
        profile = make_profile(profile_name, warmup_s)
        canned = load_canned(canned_path) if canned_path is not None else None
    except (ValueError, OSError) as exc:
        sys.exit(f"refserver: {exc}")
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    app = ReferenceServer(options, model, api_key, profile, prefix_cache, canned).app()
    for line in profile.startup_log(port) if startup_log else []:
        print(line, flush=True)
    # A short shutdown timeout: stalled handlers would otherwise hold the exit for a minute.
    web.run_app(app, host=host, port=port, print=None, access_log=None, shutdown_timeout=0.5, loop=loop)


if __name__ == "__main__":
    main()
