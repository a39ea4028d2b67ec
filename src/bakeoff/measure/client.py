"""One streaming request in, one :class:`RequestRecord` out.

The hot path runs in the read callback of an asyncio protocol (a plain one on uvloop, which
campaigns run on; a buffered one on asyncio's own loop): each received segment is stamped
with ``perf_counter_ns`` the moment the event loop hands it over and kept, raw. A read of a
chunked 200 stream that ends an event and a chunk cannot end the response, so it is only
kept; the next read that can (or that may hold an error object) parses every kept read at
its own stamp, de-chunked (:mod:`bakeoff.measure.http1`) and split into SSE events, the
usual one-event-a-chunk run of reads in one batch. The JSON is parsed once the stream is
over. There are no stream-reader futures, task switches or timer re-arms per chunk: a
general HTTP client spends several times the CPU per chunk, which at a few hundred streams
is what limits a measurement. Everything derived (token shares per chunk, fallback token
counts) happens after the stream ends.
Connections are kept alive and reused. Failures never raise out of
:meth:`StreamingClient.send`: they become records with an ``error_kind``. What one response
has shown so far is :class:`~bakeoff.measure.stream_state.StreamState`; this module is the transport.

A reasoning model's thinking (its own delta field) is a chunk like any other, marked
``REASONING`` in ``chunk_phase``; ``output_text`` holds the answer alone. Reasoning tokens
come from the server's usage where it counts them, else from the tokenizer on the thinking
text, else from the chunks' share of the completion tokens (``reasoning_source`` says which).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import orjson

from bakeoff.errors import SpecError
from bakeoff.measure.auth import check_headers
from bakeoff.measure.control import tls_context
from bakeoff.measure.http1 import HttpProtocolError, ResponseParser
from bakeoff.measure.sse import cached_tokens_of, reasoning_tokens_of, split_tokens
from bakeoff.measure.stream_state import ERROR_BODY_LIMIT, ERROR_MARK, RequestFailure, StreamState
from bakeoff.results.records import ANSWER, REASONING, ErrorKind, RequestRecord, UsageSource
from bakeoff.workloads.plans import PlannedRequest

TokenCounter = Callable[[str], int]
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_EVENT_END = b"\n\n\r\n"  # an SSE event's blank line, then the CRLF that ends its chunk
READ_BUFFER_BYTES = 1 << 18
_perf_ns = time.perf_counter_ns


@dataclass
class ClientSettings:
    """How every request of a run is sent.

    ``headers`` go on every request (an API key among them: see :mod:`bakeoff.measure.auth`);
    they are secrets as far as anything written is concerned. ``min_tokens`` sends
    ``min_tokens`` equal to ``max_tokens``, for servers that accept it: ``ignore_eos``
    alone leaves the extra end-of-sequence ids of some models (Llama 3 has several) able
    to end a request early.
    """

    base_url: str
    model: str
    extra_body: dict[str, Any] = field(default_factory=lambda: {"ignore_eos": True})
    request_timeout_s: float = 120.0
    stall_timeout_s: float = 30.0
    count_tokens: TokenCounter | None = None
    headers: dict[str, str] = field(default_factory=dict)
    min_tokens: bool = False
    # Separate from the request deadline: a server that does not accept the connection
    # within seconds is down or overloaded, which a 120 s request timeout would hide.
    connect_timeout_s: float = 10.0


def request_body(item: PlannedRequest, settings: ClientSettings) -> bytes:
    body: dict[str, Any] = {
        "model": settings.model,
        "max_tokens": item.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": item.temperature,
    }
    if settings.min_tokens:
        body["min_tokens"] = item.max_tokens
    if item.endpoint == "chat":
        body["messages"] = item.messages
    else:
        body["prompt"] = item.prompt
    body.update(settings.extra_body)
    return orjson.dumps(body)


def header_block(headers: dict[str, str]) -> str:
    """The extra header lines of every request, each ending in CRLF; checked first."""
    check_headers(headers, "client headers")
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


class _Connection(asyncio.Protocol):
    """One kept-alive HTTP/1.1 connection; serves one request at a time.

    A plain protocol, for uvloop: it reads into one buffer of its own and hands over a bytes
    copy of exactly what arrived, one call per read. A buffered protocol costs uvloop two
    Python calls a read (``get_buffer``, ``buffer_updated``), a buffer export and a slice;
    asyncio's own loop is the other way round (:class:`_BufferedConnection`).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser()
        self.stream: StreamState | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.live = False  # a request is in flight and not resolved: its bytes are wanted
        self.closed = False
        self.reused = False
        self.streaming = False  # a chunked 200 body: reads that cannot end it wait (data_received)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def start(self, stream: StreamState, request: bytes, waiter: asyncio.Future[None]) -> int:
        """Send ``request``; return the moment its bytes were handed to the socket."""
        assert self.transport is not None
        self.parser = ResponseParser()
        self.stream = stream
        self.waiter = waiter
        self.live = True
        self.streaming = False
        now = _perf_ns()
        self.transport.write(request)
        return now

    def data_received(self, data: bytes) -> None:
        # The whole per-read work: a stamp, the raw bytes kept, two checks on their end.
        now = _perf_ns()
        stream = self.stream
        if stream is None or not self.live:
            self.close()  # bytes nobody asked for: this connection is not reusable
            return
        stream.reads.append(data)
        stream.read_ns.append(now)
        # In a chunked 200 stream a read ending an event and a chunk ("\n\n\r\n") cannot end
        # the response (its last chunk ends in "\r\n\r\n"): unless it may hold an error object
        # it is parsed, with its own stamp, with the next read that can.
        if self.streaming and data.endswith(_EVENT_END) and ERROR_MARK not in data:
            return
        self.catch_up()

    def catch_up(self) -> None:
        """Parse the reads not parsed yet, each at its own stamp; resolve once the response ended or failed."""
        stream = self.stream
        if stream is None:
            return
        record, parser, reads, stamps = stream.record, self.parser, stream.reads, stream.read_ns
        i = stream.parsed
        last = len(reads) - 1
        if self.streaming and last - i > 1:
            # The reads that waited, as a stream usually arrives (each one whole event in one
            # whole chunk), are taken together; otherwise, and the last read, one by one.
            waited = reads[i:last]
            chunks = parser.whole_chunks(waited)
            payloads = stream.decoder.single_events(chunks[0]) if chunks is not None else None
            if chunks is not None and payloads is not None:
                error = stream.on_waited_events(payloads, list(map(stamps[i:last].__getitem__, chunks[1])))
                stream.parsed = i = last
                if error is not None:
                    self.resolve(RequestFailure("protocol", error))
                    return
        try:
            while i < len(reads):
                now = stamps[i]
                body = parser.feed(reads[i])
                i += 1
                if parser.headers_done and record.headers_ns == 0:
                    stream.on_headers(parser.status, now)
                if body:
                    error = stream.on_body(body, now)
                    if error is not None:
                        self.resolve(RequestFailure("protocol", error))
                        return
                if parser.complete:
                    record.end_ns = now
                    self.resolve(None)
                    return
        except HttpProtocolError as exc:
            self.resolve(RequestFailure("protocol", f"invalid HTTP response: {exc}"))
            return
        finally:
            stream.parsed = i
        self.streaming = parser.chunked and record.http_status == 200

    def eof_received(self) -> bool:
        self.catch_up()  # the reads that waited: the parser must see every byte before the end
        try:
            self.parser.feed_eof()
        except HttpProtocolError as exc:
            self.resolve(RequestFailure("stream_cut", f"server {exc}"))
            return False
        if self.stream is not None and self.parser.complete:
            self.stream.record.end_ns = _perf_ns()
            self.resolve(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        reason = f": {exc}" if exc else ""
        self.resolve(RequestFailure("stream_cut", f"connection lost before the response ended{reason}"))

    def resolve(self, outcome: RequestFailure | None) -> None:
        self.live = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if outcome is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(outcome)
                self.close()

    @property
    def reusable(self) -> bool:
        return not self.closed and self.parser.complete and self.parser.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _BufferedConnection(_Connection, asyncio.BufferedProtocol):
    """:class:`_Connection` for asyncio's own loop, which reads a plain protocol's data into a
    fresh 256 KiB bytes object per read.

    Here reads land in a buffer shared by every connection of the pool: the loop reads into
    it and hands it to :meth:`buffer_updated` before the next read, so no connection needs
    its own.
    """

    def __init__(self, buffer: memoryview) -> None:
        super().__init__()
        self._buffer = buffer

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes].tobytes())


class _Watchdog:
    """Fails a request on its total deadline or after ``stall_s`` without a byte.

    Arms one timer per request and re-arms it only when it fires, so the per-chunk cost
    is nothing: the last read's stamp (:meth:`StreamState.last_heard_ns`) is the last byte's moment.
    """

    __slots__ = ("_handle", "_loop", "conn", "end_ns", "stall_s", "stream", "total_s")

    def __init__(self, stream: StreamState, total_s: float, stall_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.stream = stream
        self.conn: _Connection | None = None
        self.total_s = total_s
        self.stall_s = stall_s
        self.end_ns = _perf_ns() + int(total_s * 1e9)
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, conn: _Connection) -> None:
        self.cancel()
        self.conn = conn
        self._arm(_perf_ns())

    def _arm(self, now: int) -> None:
        due = min(self.end_ns, self.stream.last_heard_ns() + int(self.stall_s * 1e9))
        self._handle = self._loop.call_later(max(due - now, 0) / 1e9, self._fire)

    def _fire(self) -> None:
        now = _perf_ns()
        if self.conn is None:
            return
        if now >= self.end_ns:
            self.conn.resolve(RequestFailure("timeout", f"request exceeded {self.total_s:g} s"))
        elif now - self.stream.last_heard_ns() >= self.stall_s * 1e9:
            self.conn.resolve(RequestFailure("stall", f"no data for {self.stall_s:g} s"))
        else:
            self._arm(now)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


class _Pool:
    """Idle kept-alive connections to one server, most recently used first."""

    def __init__(self, base_url: str, connect_timeout_s: float) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise SpecError(f"base URL must be http(s)://host[:port][/prefix], got {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = tls_context() if url.scheme == "https" else None
        self.netloc = url.netloc
        self.prefix = url.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self._buffer: memoryview | None = None  # the buffered connections' read buffer, made when first needed
        self._idle: list[_Connection] = []
        self.busy: set[_Connection] = set()

    async def acquire(self, *, fresh: bool = False) -> _Connection:
        """An idle kept-alive connection, or a new one (always new when ``fresh``)."""
        while self._idle and not fresh:
            conn = self._idle.pop()
            if conn.reusable and conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                self.busy.add(conn)
                return conn
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await loop.create_connection(self._protocol(loop), self.host, self.port, ssl=self.ssl)
        self.busy.add(conn)
        return conn

    def _protocol(self, loop: asyncio.AbstractEventLoop) -> Callable[[], _Connection]:
        """The connection class that reads cheapest on ``loop``: plain on uvloop, buffered on asyncio's own."""
        if type(loop).__module__.startswith("uvloop"):
            return _Connection
        if self._buffer is None:
            self._buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        buffer = self._buffer
        return lambda: _BufferedConnection(buffer)

    def release(self, conn: _Connection) -> None:
        self.busy.discard(conn)
        conn.live = False
        conn.stream = None
        conn.waiter = None
        if conn.reusable:
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in [*self._idle, *self.busy]:
            conn.close()
        self._idle.clear()
        self.busy.clear()


class StreamingClient:
    """Shares one pool of kept-alive connections across all in-flight requests of a run."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._pool: _Pool | None = None
        self._extra_headers = header_block(settings.headers)

    async def __aenter__(self) -> StreamingClient:
        self._pool = _Pool(self.settings.base_url, self.settings.connect_timeout_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.close()

    def _request_bytes(self, item: PlannedRequest) -> bytes:
        assert self._pool is not None
        body = request_body(item, self.settings)
        head = (
            f"POST {self._pool.prefix}{ENDPOINT_PATHS[item.endpoint]} HTTP/1.1\r\n"
            f"Host: {self._pool.netloc}\r\nUser-Agent: bakeoff\r\nAccept: */*\r\n"
            f"{self._extra_headers}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    async def send(self, item: PlannedRequest, record: RequestRecord) -> RequestRecord:
        pool = self._pool
        assert pool is not None, "use StreamingClient as an async context manager"
        request = self._request_bytes(item)
        record.prompt_tokens = item.prompt_tokens
        record.max_tokens = item.max_tokens
        record.start_ns = _perf_ns()
        stream = StreamState(record)
        watchdog = _Watchdog(stream, self.settings.request_timeout_s, self.settings.stall_timeout_s)
        conn: _Connection | None = None
        try:
            # A kept-alive connection the server closed while idle fails before any byte;
            # only then is the request sent again, on a fresh connection: the server may have
            # closed every idle one at once (llama-server after its keep-alive timeout), so
            # another from the pool could fail the same way.
            for attempt in range(2):
                try:
                    conn = await pool.acquire(fresh=attempt > 0)
                except (OSError, TimeoutError) as exc:
                    return _fail(record, "connect", _connect_message(pool, exc))
                waiter = asyncio.get_running_loop().create_future()
                record.start_ns = conn.start(stream, request, waiter)
                watchdog.watch(conn)
                try:
                    await waiter
                    break
                except RequestFailure as failure:
                    watchdog.cancel()
                    retry = attempt == 0 and conn.reused and not stream.reads  # nothing arrived
                    if retry and failure.kind == "stream_cut":
                        pool.release(conn)
                        conn = None
                        continue
                    conn.catch_up()  # what arrived before the failure is kept
                    stream.replay()
                    return _fail(record, failure.kind, str(failure), stream)
        except asyncio.CancelledError:
            if conn is not None:
                conn.catch_up()
            stream.replay()
            _fail(record, "cancelled", "run interrupted", stream)
            if conn is not None:
                conn.close()
            raise
        finally:
            watchdog.cancel()
            if conn is not None:
                pool.release(conn)
        if record.http_status != 200:
            detail = stream.error_body[:ERROR_BODY_LIMIT].decode(errors="replace")
            return _fail(record, "http", f"HTTP {record.http_status}: {detail}")
        # A last event the server ended without its blank line.
        error = stream.on_events(stream.decoder.flush(), record.end_ns) or stream.replay()
        if error is not None:
            return _fail(record, "protocol", error)
        if not stream.done and record.finish_reason is None:
            return _fail(record, "stream_cut", "stream ended without finish_reason or [DONE]", stream)
        self._finish(record, stream, stream.usage)
        return record

    def _finish(self, record: RequestRecord, stream: StreamState, usage: dict[str, Any] | None) -> None:
        texts, phases = stream.texts, stream.phases
        reasons = REASONING in phases
        record.output_text = stream.answer_text() if reasons else "".join(texts)
        record.chunk_chars = [len(t) for t in texts]
        count = self.settings.count_tokens
        if usage is not None and usage.get("completion_tokens") is not None:
            record.completion_tokens = int(usage["completion_tokens"])
            record.prompt_tokens = int(usage.get("prompt_tokens") or record.prompt_tokens)
            record.cached_tokens = cached_tokens_of(usage)
            record.usage_source = "server"
        elif count is not None:
            record.completion_tokens = count("".join(texts))
            record.usage_source = "tokenizer"
        else:
            record.completion_tokens = len(texts)
            record.usage_source = "chunks"
        if count is not None and len(texts) != record.completion_tokens:
            weights = [count(t) for t in texts]
        else:
            weights = record.chunk_chars
        if not reasons:
            record.chunk_tokens = split_tokens(record.completion_tokens, weights)
            return
        record.chunk_phase = list(phases)
        counted, source = _reasoning_count(usage, texts, phases, count)
        if counted is None:
            # Nobody counted the thinking: its chunks' share of the completion tokens.
            record.chunk_tokens = split_tokens(record.completion_tokens, weights)
            counted = sum(t for t, p in zip(record.chunk_tokens, phases, strict=True) if p == REASONING)
        else:
            # Each phase's own count spread over its own chunks, so the phases sum exactly.
            counted = min(counted, record.completion_tokens)
            record.chunk_tokens = _split_by_phase(counted, record.completion_tokens - counted, weights, phases)
        record.reasoning_tokens = counted
        record.reasoning_source = source


def _reasoning_count(
    usage: dict[str, Any] | None, texts: list[str], phases: list[int], count: TokenCounter | None
) -> tuple[int | None, UsageSource]:
    """Reasoning tokens from the server's usage, else the tokenizer; (None, "chunks") when neither can say.

    SGLang's ``usage.reasoning_tokens`` is 0 by default: 0 beside chunks that carried
    reasoning is not a count.
    """
    server = reasoning_tokens_of(usage) if usage is not None else None
    if server:
        return server, "server"
    if count is not None:
        return count("".join(t for t, p in zip(texts, phases, strict=True) if p == REASONING)), "tokenizer"
    return None, "chunks"


def _split_by_phase(reasoning: int, answer: int, weights: list[int], phases: list[int]) -> list[int]:
    shares = [0] * len(weights)
    for phase, total in ((REASONING, reasoning), (ANSWER, answer)):
        where = [i for i, p in enumerate(phases) if p == phase]
        for i, share in zip(where, split_tokens(total, [weights[i] for i in where]), strict=True):
            shares[i] = share
    return shares


def _connect_message(pool: _Pool, exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"connecting to {pool.host}:{pool.port} timed out after {pool.connect_timeout_s:g} s"
    return f"cannot connect to {pool.host}:{pool.port}: {exc}"


def _fail(record: RequestRecord, kind: ErrorKind, message: str, stream: StreamState | None = None) -> RequestRecord:
    record.end_ns = _perf_ns()
    record.error_kind = kind
    record.error = message[:1000]
    if stream is not None:
        stream.keep_partial(record)
    return record
