"""What one streaming response has shown so far, and the failure that ends a request early.

:class:`StreamState` is fed from :mod:`bakeoff.measure.client`'s transport callback: events are
split and stamped as they arrive and parsed into the :class:`RequestRecord` once the stream is
over, so the code that runs on every wakeup stays small. Kept apart from the connection and the
pool so the client's hot path reads as transport alone.
"""

from __future__ import annotations

from typing import Any

from bakeoff.measure.sse import DONE, SSEDecoder, read_chunk, read_chunks
from bakeoff.results.records import ANSWER, REASONING, ErrorKind, RequestRecord

ERROR_BODY_LIMIT = 500
# In every error object (``{"error": ...}``, ``"object": "error"``) and never in escaped text.
ERROR_MARK = b'"error"'


class RequestFailure(Exception):
    """Ends one request early; ``kind`` becomes the record's ``error_kind``."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class StreamState:
    """What one response has shown so far; fed from the transport callback.

    The callback only splits events and stamps them; JSON is parsed once the stream is
    over (:meth:`replay`), so the code that runs on every wakeup stays small. Only an
    event that may be an error object is parsed at once, to stop the request there.
    """

    __slots__ = (
        "decoder",
        "done",
        "error_body",
        "event_ns",
        "events",
        "parsed",
        "phases",
        "read_ns",
        "reads",
        "record",
        "texts",
        "usage",
    )

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.reads: list[bytes] = []  # every received segment, as received
        self.read_ns: list[int] = []  # the moment each arrived
        self.parsed = 0  # reads handed to the HTTP parser so far
        self.decoder = SSEDecoder()
        self.events: list[bytes] = []
        self.event_ns: list[int] = []
        self.texts: list[str] = []  # one per chunk entry, reasoning and answer alike
        self.phases: list[int] = []  # the phase of each entry of texts
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error_body = b""

    def last_heard_ns(self) -> int:
        """When the server was last heard from: the last read's stamp, else the request's send."""
        return self.read_ns[-1] if self.read_ns else self.record.start_ns

    def on_headers(self, status: int, now: int) -> None:
        self.record.headers_ns = now
        self.record.http_status = status

    def on_body(self, data: bytes, now: int) -> str | None:
        """Handle body bytes that arrived at ``now``; return an error message to stop."""
        if self.record.http_status != 200:
            if len(self.error_body) < ERROR_BODY_LIMIT:
                self.error_body += data[:ERROR_BODY_LIMIT]
            return None
        return self.on_events(self.decoder.feed(data), now)

    def on_events(self, payloads: list[bytes], now: int) -> str | None:
        return self.on_timed_events(payloads, [now] * len(payloads))

    def on_timed_events(self, payloads: list[bytes], stamps: list[int]) -> str | None:
        """Keep each event with the moment it arrived; return the error of an error object."""
        record = self.record
        for payload, now in zip(payloads, stamps, strict=True):
            if record.first_event_ns == 0:
                record.first_event_ns = now
            if payload == DONE:
                self.done = True
                continue
            if ERROR_MARK in payload:
                error = read_chunk(payload).error
                if error is not None:
                    return error
            self.events.append(payload)
            self.event_ns.append(now)
        return None

    def on_waited_events(self, payloads: list[bytes], stamps: list[int]) -> str | None:
        """:meth:`on_timed_events` for reads that waited: kept in two list extends, no loop.

        A read waits only when it holds no error mark and ends an event, so no error object
        can be among them, nor span two of them; ``[DONE]`` can, and takes the general path.
        """
        if not payloads or DONE in payloads:
            return self.on_timed_events(payloads, stamps)
        if self.record.first_event_ns == 0:
            self.record.first_event_ns = stamps[0]
        self.events += payloads
        self.event_ns += stamps
        return None

    def replay(self) -> str | None:
        """Parse the kept events into the record; return the error of a broken chunk."""
        record = self.record
        chunk_ns, texts, phases = record.chunk_ns, self.texts, self.phases
        for (text, finish, usage, error, reasoning), now in zip(read_chunks(self.events), self.event_ns, strict=True):
            if error is not None:
                return error
            # A delta with both (the end of the thinking) is two entries: reasoning first.
            if reasoning is not None:
                if record.first_token_ns == 0:
                    record.first_token_ns = now
                chunk_ns.append(now)
                texts.append(reasoning)
                phases.append(REASONING)
            if text is not None:
                if record.first_token_ns == 0:
                    record.first_token_ns = now
                chunk_ns.append(now)
                texts.append(text)
                phases.append(ANSWER)
            if finish is not None:
                record.finish_reason = finish
            if usage is not None:
                self.usage = usage
        self.events.clear()
        self.event_ns.clear()
        return None

    def answer_text(self) -> str:
        return "".join(t for t, p in zip(self.texts, self.phases, strict=True) if p == ANSWER)

    def keep_partial(self, record: RequestRecord) -> None:
        """What a failed stream showed before it failed: answer text, chunk sizes, phases."""
        if self.texts:
            record.output_text = self.answer_text()
            record.chunk_chars = [len(t) for t in self.texts]
            if REASONING in self.phases:
                record.chunk_phase = list(self.phases)
