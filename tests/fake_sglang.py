"""A small in-process server with SGLang 0.5.18's cache accounting, for telemetry tests.

What it reproduces, as read from the released code: ``usage.prompt_tokens_details`` is
left out when a request had no cached tokens; ``sglang:cached_tokens_total`` and
``sglang:prompt_tokens_total`` are counters while ``sglang:cache_hit_rate`` is a gauge of
the last request only; ``/flush_cache`` answers HTTP 400 while it refuses. Knobs let a
test make it refuse flushes, report requests as running, or answer like vLLM's
``/reset_prefix_cache`` (200 with ``{"success": false}``). It records the headers of
every metrics and reset call so a test can check an API key went out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bakeoff.serving.process import free_port

BLOCK = 4  # words per cache block


@dataclass
class FakeState:
    prompt_total: int = 0
    cached_total: int = 0
    last_rate: float = 0.0
    blocks: set[int] = field(default_factory=set)
    running: int = 0
    running_polls: int = 0  # /metrics reports this many more polls with `running` requests
    refuse_resets: int = 0  # refuse this many reset calls
    reset_calls: int = 0
    reset_style: str = "sglang"  # sglang: HTTP 400 when refused; vllm: 200 {"success": false}
    seen_headers: list[dict[str, str]] = field(default_factory=list)

    def account(self, words: list[str]) -> int:
        cached, key, leading = 0, 0, True
        for start in range(0, len(words) - BLOCK + 1, BLOCK):
            key = hash((key, *words[start : start + BLOCK]))
            if leading and key in self.blocks:
                cached += BLOCK
            else:
                leading = False
                self.blocks.add(key)
        return cached


def _app(state: FakeState) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        words = " ".join(m["content"] for m in body["messages"]).split()
        cached = state.account(words)
        n = int(body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        state.running += 1

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        base = {"id": "x", "object": "chat.completion.chunk", "model": body["model"]}
        await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await send({**base, "choices": [{"index": 0, "delta": {"content": "w " * n}}]})
        await send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        usage: dict[str, Any] = {"prompt_tokens": len(words), "completion_tokens": n, "total_tokens": len(words) + n}
        if cached:  # SGLang leaves the details out when nothing was cached
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        await send({**base, "choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        state.running -= 1
        state.prompt_total += len(words)
        state.cached_total += cached
        state.last_rate = cached / len(words) if words else 0.0
        return resp

    async def metrics(request: web.Request) -> web.Response:
        state.seen_headers.append(dict(request.headers))
        running = state.running
        if state.running_polls > 0:
            state.running_polls -= 1
            running += 1
        text = (
            "# TYPE sglang:prompt_tokens_total counter\n"
            f'sglang:prompt_tokens_total{{model_name="m"}} {state.prompt_total}\n'
            "# TYPE sglang:cached_tokens_total counter\n"
            f'sglang:cached_tokens_total{{model_name="m"}} {state.cached_total}\n'
            "# TYPE sglang:cache_hit_rate gauge\n"
            f'sglang:cache_hit_rate{{model_name="m"}} {state.last_rate}\n'
            f'sglang:num_running_reqs{{model_name="m"}} {running}\n'
            f'sglang:num_queue_reqs{{model_name="m"}} 0\n'
            # vLLM's names for the same gauges, so the fake also stands in for vLLM's reset.
            f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} 0\n'
        )
        return web.Response(text=text)

    async def reset(request: web.Request) -> web.Response:
        state.seen_headers.append(dict(request.headers))
        state.reset_calls += 1
        if state.refuse_resets > 0:
            state.refuse_resets -= 1
            if state.reset_style == "vllm":
                return web.json_response({"success": False})
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
        state.blocks.clear()
        if state.reset_style == "vllm":
            return web.json_response({"success": True})
        return web.Response(text="Cache flushed.\n")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/flush_cache", reset)
    app.router.add_post("/reset_prefix_cache", reset)
    app.router.add_get("/health", health)
    return app


@contextlib.contextmanager
def serve_fake(state: FakeState) -> Iterator[str]:
    """Run the fake on a free port in a background thread; yield its base URL."""
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(state), access_log=None)
    ready = threading.Event()

    def work() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert ready.wait(10), "fake server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
