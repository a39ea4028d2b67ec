"""One streaming request in, one :class:`RequestRecord` out.

The hot loop does as little as it can per chunk: take a ``perf_counter_ns`` stamp as the
bytes arrive, split SSE events, parse JSON once. Everything derived (token shares per chunk,
fallback token counts) happens after the stream ends. Failures never raise out of
:meth:`StreamingClient.send`: they become records with an ``error_kind``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bakeoff.errors import ServerUnreachableError
from bakeoff.records import RequestRecord
from bakeoff.sse import DONE, SSEDecoder, cached_tokens_of, read_chunk, split_tokens

TokenCounter = Callable[[str], int]
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class PlannedRequest:
    """A request exactly as it will be sent, identical for every backend."""

    request_id: int
    endpoint: str
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    prompt_tokens: int = 0
    group: str = ""
    turn: int = -1
    arrival_s: float = 0.0  # offset from the run start, for open-loop schedules
    temperature: float = 0.0


@dataclass
class ClientSettings:
    base_url: str
    model: str
    extra_body: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    request_timeout_s: float = 120.0
    stall_timeout_s: float = 30.0
    count_tokens: TokenCounter | None = None


def request_body(item: PlannedRequest, settings: ClientSettings) -> bytes:
    body: dict[str, Any] = {
        "model": settings.model,
        "max_tokens": item.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": item.temperature,
    }
    if item.endpoint == "chat":
        body["messages"] = item.messages
    else:
        body["prompt"] = item.prompt
    body.update(settings.extra_body)
    return orjson.dumps(body)


class StreamingClient:
    """Shares one connection pool across all in-flight requests of a run."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(
            total=settings.request_timeout_s, sock_read=settings.stall_timeout_s
        )

    async def __aenter__(self) -> StreamingClient:
        connector = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
        # A 1 MiB read buffer: long-context streams send lines far past aiohttp's 64 KiB default.
        self._session = aiohttp.ClientSession(
            connector=connector, read_bufsize=1 << 20, timeout=self._timeout
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, item: PlannedRequest, record: RequestRecord) -> RequestRecord:
        assert self._session is not None, "use StreamingClient as an async context manager"
        url = self.settings.base_url.rstrip("/") + ENDPOINT_PATHS[item.endpoint]
        body = request_body(item, self.settings)
        record.prompt_tokens = item.prompt_tokens
        texts: list[str] = []
        usage: dict[str, Any] | None = None
        done = False
        record.start_ns = _perf_ns()
        try:
            async with self._session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                record.headers_ns = _perf_ns()
                record.http_status = resp.status
                if resp.status != 200:
                    detail = (await resp.read())[:500].decode(errors="replace")
                    return _fail(record, "http", f"HTTP {resp.status}: {detail}")
                decoder = SSEDecoder()
                chunk_ns = record.chunk_ns
                async for data in resp.content.iter_any():
                    now = _perf_ns()
                    for payload in decoder.feed(data):
                        if record.first_event_ns == 0:
                            record.first_event_ns = now
                        if payload == DONE:
                            done = True
                            continue
                        info = read_chunk(payload)
                        if info.error is not None:
                            return _fail(record, "protocol", info.error)
                        if info.text is not None:
                            if record.first_token_ns == 0:
                                record.first_token_ns = now
                            chunk_ns.append(now)
                            texts.append(info.text)
                        if info.finish_reason is not None:
                            record.finish_reason = info.finish_reason
                        if info.usage is not None:
                            usage = info.usage
                record.end_ns = _perf_ns()
        except aiohttp.ServerTimeoutError as exc:
            return _fail(record, "stall", f"no data for {self.settings.stall_timeout_s} s: {exc}")
        except TimeoutError:
            return _fail(record, "timeout", f"request exceeded {self.settings.request_timeout_s} s")
        except aiohttp.ClientConnectorError as exc:
            return _fail(record, "connect", str(exc))
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
            return _fail(record, "stream_cut", str(exc) or type(exc).__name__, texts)
        except aiohttp.ClientError as exc:
            return _fail(record, "protocol", f"{type(exc).__name__}: {exc}", texts)
        except asyncio.CancelledError:
            _fail(record, "cancelled", "run interrupted", texts)
            raise
        if not done and record.finish_reason is None:
            return _fail(record, "stream_cut", "stream ended without finish_reason or [DONE]", texts)
        self._finish(record, texts, usage)
        return record

    def _finish(self, record: RequestRecord, texts: list[str], usage: dict[str, Any] | None) -> None:
        record.output_text = "".join(texts)
        record.chunk_chars = [len(t) for t in texts]
        count = self.settings.count_tokens
        if usage is not None and usage.get("completion_tokens") is not None:
            record.completion_tokens = int(usage["completion_tokens"])
            record.prompt_tokens = int(usage.get("prompt_tokens") or record.prompt_tokens)
            record.cached_tokens = cached_tokens_of(usage)
            record.usage_source = "server"
        elif count is not None:
            record.completion_tokens = count(record.output_text)
            record.usage_source = "tokenizer"
        else:
            record.completion_tokens = len(texts)
            record.usage_source = "chunks"
        if count is not None and len(texts) != record.completion_tokens:
            weights = [count(t) for t in texts]
        else:
            weights = record.chunk_chars
        record.chunk_tokens = split_tokens(record.completion_tokens, weights)


def _fail(
    record: RequestRecord, kind: Any, message: str, texts: list[str] | None = None
) -> RequestRecord:
    record.end_ns = _perf_ns()
    record.error_kind = kind
    record.error = message[:1000]
    if texts:
        record.output_text = "".join(texts)
        record.chunk_chars = [len(t) for t in texts]
    return record


async def check_server(base_url: str, model: str | None, timeout_s: float = 5.0) -> list[str]:
    """Fail within seconds, with a clear message, when nothing serves at ``base_url``.

    Returns the served model names; an unknown ``model`` is an error listing them.
    """
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url) as resp,
        ):
            if resp.status != 200:
                raise ServerUnreachableError(f"{url} answered HTTP {resp.status}; is it an OpenAI-compatible server?")
            payload = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ServerUnreachableError(
            f"cannot reach {base_url} ({type(exc).__name__}: {exc}); check --base-url and that the server is up"
        ) from exc
    served = [str(m.get("id")) for m in payload.get("data", []) if isinstance(m, dict)]
    if model is not None and served and model not in served:
        raise ServerUnreachableError(f"--model {model!r} is not served at {base_url}; it serves: {', '.join(served)}")
    return served
