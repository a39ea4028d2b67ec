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
  a stall, or the whole process dying mid-stream.

Options are set on the command line and can be overridden per request with a JSON object
in the ``x-bakeoff-ref`` header or a ``ref`` field of the request body. Sleeping until each
deadline, rather than for each gap, keeps scheduling delays from accumulating; how late
each write went out is exposed on ``/metrics`` so a benchmark can tell whether the server
itself was the bottleneck. Run it with ``python -m bakeoff.refserver --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
from aiohttp import web

from bakeoff.launch import free_port, wait_ready

UsageMode = Literal["separate", "finish", "none"]
Fault = Literal["none", "http500", "error", "cut", "stall", "die"]
CACHE_BLOCK = 16  # words per prefix-cache block, like a KV-cache page
MODEL = "bakeoff-ref"


@dataclass(frozen=True)
class RefOptions:
    """How one request is answered; every field can be overridden per request."""

    ttft_ms: float = 100.0
    itl_ms: float = 20.0  # gap between content chunks
    tokens_per_chunk: int = 1
    role_chunk: bool = True  # send a role-only first chunk at once, before any content
    content_key_missing: bool = False  # that first chunk has no content key (TensorRT-LLM)
    usage: UsageMode = "separate"
    comments: bool = False  # SSE ': keep-alive' comment lines between events
    fault: Fault = "none"
    fault_every: int = 1  # the fault hits requests N, 2N, 3N... counted per option set
    fault_after: int = -1  # content chunks sent before a mid-stream fault; -1: half of them
    stall_s: float = 3600.0
    long_line_bytes: int = 0  # pad the first content chunk's line to at least this size

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0 or self.stall_s < 0:
            raise ValueError("ttft_ms, itl_ms and stall_s must be 0 or more")
        if self.tokens_per_chunk < 1 or self.fault_every < 1:
            raise ValueError("tokens_per_chunk and fault_every must be at least 1")
        if self.usage not in get_args(UsageMode):
            raise ValueError(f"usage must be one of {get_args(UsageMode)}, got {self.usage!r}")
        if self.fault not in get_args(Fault):
            raise ValueError(f"fault must be one of {get_args(Fault)}, got {self.fault!r}")

    def override(self, changes: object) -> RefOptions:
        if not isinstance(changes, dict):
            raise ValueError("reference-server overrides must be a JSON object")
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown reference-server options: {sorted(unknown)}")
        return replace(self, **changes)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


KEEP_ALIVE = b": keep-alive\n\n"
DONE_EVENT = b"data: [DONE]\n\n"


class Pacer:
    """Sleeps until absolute deadlines, learning the event loop's timer error.

    Event-loop timers have millisecond granularity (asyncio rounds epoll timeouts up,
    uvloop truncates against a cached clock), so a plain sleep lands up to a millisecond
    off. Aiming each sleep ``bias`` early, ``bias`` being the running mean of that error,
    centres the writes on their deadlines; what remains is reported as lateness.
    """

    GAIN = 0.02
    CLAMP_S = 0.005  # one long deschedule must not swing the mean

    def __init__(self) -> None:
        self.bias_s = 0.0
        self.late_sum_s = 0.0
        self.late_max_s = 0.0

    async def until(self, deadline: float) -> None:
        target = deadline - self.bias_s
        delay = target - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
            error = min(max(time.monotonic() - target, -self.CLAMP_S), self.CLAMP_S)
            self.bias_s += self.GAIN * (error - self.bias_s)
        late = time.monotonic() - deadline
        self.late_sum_s += late
        self.late_max_s = max(self.late_max_s, late)


class _Stats:
    """Counters for ``/metrics``: vLLM-named serving counters plus schedule lateness."""

    def __init__(self) -> None:
        self.pacer = Pacer()
        self.running = 0
        self.requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.chunks = 0
        self.cache_queries = 0
        self.cache_hits = 0
        self.cache_blocks: set[int] = set()

    def account_prompt(self, words: list[str]) -> int:
        """Simulated prefix cache: hit tokens are leading full blocks seen before."""
        hits, key, leading = 0, 0, True
        for start in range(0, len(words) - CACHE_BLOCK + 1, CACHE_BLOCK):
            # Chained hashes: a block only hits when everything before it matched too.
            key = hash((key, *words[start : start + CACHE_BLOCK]))
            if leading and key in self.cache_blocks:
                hits += CACHE_BLOCK
            else:
                leading = False
                self.cache_blocks.add(key)
        self.cache_queries += len(words)
        self.cache_hits += hits
        self.prompt_tokens += len(words)
        return hits

    def prometheus(self, model: str) -> str:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        label = f'{{model_name="{model}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", label, self.running),
            ("vllm:request_success_total", "counter", label, self.requests),
            ("vllm:prompt_tokens_total", "counter", label, self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", label, self.generation_tokens),
            ("vllm:prefix_cache_queries_total", "counter", label, self.cache_queries),
            ("vllm:prefix_cache_hits_total", "counter", label, self.cache_hits),
            ("bakeoff_ref_chunks_total", "counter", "", self.chunks),
            ("bakeoff_ref_late_seconds_sum", "counter", "", self.pacer.late_sum_s),
            ("bakeoff_ref_late_seconds_max", "gauge", "", self.pacer.late_max_s),
            ("bakeoff_ref_timer_bias_seconds", "gauge", "", self.pacer.bias_s),
            ("process_cpu_seconds_total", "counter", "", usage.ru_utime + usage.ru_stime),
        ]
        return "".join(f"# TYPE {n} {t}\n{n}{lab} {v}\n" for n, t, lab, v in rows)


class ReferenceServer:
    """The aiohttp application and its per-process state."""

    def __init__(self, options: RefOptions, model: str = MODEL) -> None:
        self.options = options
        self.model = model
        self.stats = _Stats()
        self._fault_counts: dict[RefOptions, int] = {}
        self._created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/reset_prefix_cache", self._reset_cache)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        data = {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "owned_by": "bakeoff"}],
        }
        return web.json_response(data, dumps=lambda v: orjson.dumps(v).decode())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.stats.prometheus(self.model), content_type="text/plain")

    async def _reset_cache(self, request: web.Request) -> web.Response:
        self.stats.cache_blocks.clear()
        return web.Response(text="ok")

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
            opts = self.options
            if "x-bakeoff-ref" in request.headers:
                opts = opts.override(orjson.loads(request.headers["x-bakeoff-ref"]))
            if "ref" in body:
                opts = opts.override(body["ref"])
            max_tokens = int(body.get("max_tokens") or 16)
            if max_tokens < 1:
                raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
            prompt = " ".join(str(m.get("content", "")) for m in body["messages"]) if chat else str(body["prompt"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return _error_response(400, f"bad request: {exc}")
        faulty = self._is_faulty(opts)
        if faulty and opts.fault == "http500":
            return _error_response(500, "injected fault: internal server error")
        words = prompt.split()
        cached = self.stats.account_prompt(words)
        usage = {
            "prompt_tokens": len(words),
            "completion_tokens": max_tokens,
            "total_tokens": len(words) + max_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        stream_options = body.get("stream_options") or {}
        include_usage = bool(stream_options.get("include_usage")) and opts.usage != "none"
        k = opts.tokens_per_chunk
        # Equal-width tokens: clients that share usage tokens over chunks by text length
        # then get the exact split back.
        texts = ["".join(f" w{t % 10}" for t in range(i, min(i + k, max_tokens))) for i in range(0, max_tokens, k)]
        self.stats.running += 1
        try:
            if not body.get("stream"):
                await self.stats.pacer.until(t0 + (opts.ttft_ms + (len(texts) - 1) * opts.itl_ms) / 1e3)
                return self._whole(chat, "".join(texts), usage)
            return await self._stream(request, opts, chat, t0, texts, usage if include_usage else None, faulty)
        finally:
            self.stats.running -= 1

    def _whole(self, chat: bool, text: str, usage: dict[str, Any]) -> web.Response:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self.stats.requests += 1
        self.stats.generation_tokens += usage["completion_tokens"]
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
        texts: list[str],
        usage: dict[str, Any] | None,
        faulty: bool,
    ) -> web.StreamResponse:
        stats = self.stats
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
        if opts.role_chunk or opts.content_key_missing:
            if chat:
                delta = {"role": "assistant"} if opts.content_key_missing else {"role": "assistant", "content": ""}
                first: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
            else:
                first = {"index": 0, "text": "", "finish_reason": None}
            await resp.write(prefix + _sse({**head, "choices": [first]}))
        fault_at = len(texts) // 2 if opts.fault_after < 0 else opts.fault_after
        last = len(texts) - 1
        for i, text in enumerate(texts):
            if faulty and i == fault_at:
                return await self._mid_stream_fault(request, resp, opts)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if i == last else None}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if i == 0 and opts.long_line_bytes:
                chunk["pad"] = "x" * opts.long_line_bytes
            if i == last and usage is not None and opts.usage == "finish":
                chunk["usage"] = usage
            data = prefix + _sse(chunk)
            if i == last:
                # The tail goes out in the same write: real servers flush it back to back.
                if usage is not None and opts.usage == "separate":
                    data += _sse({**head, "choices": [], "usage": usage})
                data += DONE_EVENT
            await stats.pacer.until(t0 + (opts.ttft_ms + i * opts.itl_ms) / 1e3)
            stats.chunks += 1
            await resp.write(data)
        stats.requests += 1
        stats.generation_tokens += sum(len(t.split()) for t in texts)
        await resp.write_eof()
        return resp

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
            await resp.write(_sse(error) + DONE_EVENT)
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


def _option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bakeoff.refserver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=MODEL, help="served model name")
    defaults = RefOptions()
    for f in fields(RefOptions):
        default = getattr(defaults, f.name)
        flag = _option_flag(f.name)
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
    try:
        options = RefOptions(**args)
    except ValueError as exc:
        sys.exit(f"refserver: {exc}")
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    app = ReferenceServer(options, model).app()
    # A short shutdown timeout: stalled handlers would otherwise hold the exit for a minute.
    web.run_app(app, host=host, port=port, print=None, access_log=None, shutdown_timeout=0.5, loop=loop)


@contextlib.contextmanager
def serve_reference(model: str = MODEL, startup_timeout_s: float = 20.0, **options: Any) -> Iterator[str]:
    """Start the reference server in its own process on a free port; yield its base URL.

    ``options`` are :class:`RefOptions` fields. The process is killed on exit: a graceful
    stop would wait for stalled streams.
    """
    RefOptions(**options)  # reject a typo here rather than as a failed start
    port = free_port()
    argv = [sys.executable, "-m", "bakeoff.refserver", "--port", str(port), "--model", model]
    for name, value in options.items():
        if isinstance(value, bool):
            argv.append(_option_flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [_option_flag(name), str(value)]
    base_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bakeoff-ref-") as tmp:
        log_path = Path(tmp) / "refserver.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_ready(
                base_url + "/health",
                timeout_s=startup_timeout_s,
                interval_s=0.05,
                still_running=lambda: proc.poll() is None,
                log_path=log_path,
                what="reference server",
            )
            yield base_url
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
