"""An incremental, I/O-free HTTP/1.1 response parser for the streaming client's hot path.

The client reads OpenAI streams straight from an asyncio protocol, so every received
segment is stamped and decoded in the read callback, with no stream-reader futures or
task switches per chunk. This module turns those raw segments into body bytes:
status line and headers, then a chunked, length-delimited or close-delimited body. Only
what LLM servers send is supported: no compression (the client never asks for it), no
upgrades; informational ``1xx`` responses are skipped.
"""

from __future__ import annotations

from itertools import accumulate, repeat
from operator import add
from typing import Literal

HEADER_LIMIT = 1 << 16
_HEX = b"0123456789abcdefABCDEF"
# 16 hex digits is 2**64: anything longer is an attack or garbage, never a real chunk.
_SIZE_DIGITS = 16
_SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)


class HttpProtocolError(Exception):
    """The peer sent something that is not a valid HTTP/1.1 response."""


class ResponseParser:
    """Feed raw bytes, get body bytes back; ``complete`` once the body has ended."""

    __slots__ = (
        "_buf",
        "_framing",
        "_remaining",
        "_state",
        "complete",
        "headers",
        "headers_done",
        "keep_alive",
        "reason",
        "status",
    )

    def __init__(self) -> None:
        self._buf = b""
        self._framing: Literal["chunked", "length", "close"] = "close"
        self._remaining = 0
        self._state = _SIZE
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.keep_alive = True
        self.complete = False

    @property
    def chunked(self) -> bool:
        """Whether the body is chunked (known once ``headers_done``)."""
        return self._framing == "chunked"

    def feed(self, data: bytes) -> bytes:
        """Consume ``data``; return the body bytes it completed (often all of it)."""
        if not self.headers_done:
            data = self._feed_head(data)
            if not self.headers_done or not data:
                return b""
        if self.complete:
            # Bytes after a complete response: the connection cannot be reused safely.
            self.keep_alive = False
            return b""
        if self._framing == "chunked":
            return self._dechunk(data)
        if self._framing == "length":
            body = data[: self._remaining]
            self._remaining -= len(body)
            if self._remaining == 0:
                self.complete = True
                if len(data) > len(body):
                    self.keep_alive = False
            return body
        return data

    def whole_chunks(self, reads: list[bytes]) -> tuple[list[bytes], list[int]] | None:
        """Every chunk's data in ``reads`` and the read it is in, when each read holds whole chunks; else None.

        The batch form of the whole-chunk fast path, for reads parsed after they arrived: a
        few passes over all of them at once instead of a call per read. A loaded client
        finds several chunks in one read (they queued in the kernel meanwhile), so a read may
        hold any number of whole chunks, as long as none spans two reads. Whole chunks leave
        the parser where it was (at a chunk start), so it is not changed; with None the reads
        go through :meth:`feed` one by one.
        """
        if not (self.headers_done and self._framing == "chunked" and self._state == _SIZE) or self._buf:
            return None
        parts = b"".join(reads).split(b"\r\n")
        # Size line, data, size line, data ... then the empty rest after the last CRLF. Data
        # holding a CRLF of its own splits short of its declared size and is left to feed().
        if not len(parts) % 2 or parts[-1]:
            return None
        sizes, data = parts[0:-1:2], parts[1::2]
        if not all(sizes) or max(map(len, sizes)) > _SIZE_DIGITS or b"".join(sizes).translate(None, _HEX):
            return None
        lengths = list(map(int, sizes, repeat(16)))
        if 0 in lengths or lengths != list(map(len, data)):
            return None
        # Where each chunk (size line, data, two CRLFs) and each read end in the joined bytes.
        chunk_ends = list(accumulate(map(add, map(add, map(len, sizes), lengths), repeat(4))))
        read_ends = list(accumulate(map(len, reads)))
        if read_ends == chunk_ends:  # one chunk a read, as an idle client reads them
            return data, list(range(len(reads)))
        ends = set(read_ends)
        if not ends.issubset(chunk_ends):
            return None  # a chunk split over two reads
        # A chunk's read is the number of reads that ended before it: a running count of the
        # chunk ends that are read ends.
        return data, list(accumulate(map(ends.__contains__, chunk_ends[:-1]), initial=0))

    def feed_eof(self) -> None:
        """The peer closed; a close-delimited body ends here, any other is truncated."""
        if self.complete:
            return
        if self.headers_done and self._framing == "close":
            self.complete = True
            return
        where = "before the response headers" if not self.headers_done else "mid-body"
        raise HttpProtocolError(f"closed the connection {where}")

    def _feed_head(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > HEADER_LIMIT:
                    raise HttpProtocolError(f"response headers longer than {HEADER_LIMIT} bytes")
                self._buf = buf
                return b""
            self._parse_head(buf[:end])
            buf = buf[end + 4 :]
            if self.status >= 200:
                self._buf = b""
                self.headers_done = True
                return buf
            self.headers = {}  # 1xx: an interim response, the real one follows

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
        self.status = int(parts[1])
        self.reason = parts[2] if len(parts) > 2 else ""
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise HttpProtocolError(f"malformed header line: {line[:100]!r}")
            key = name.strip().lower()
            value = value.strip()
            self.headers[key] = f"{self.headers[key]}, {value}" if key in self.headers else value
        if self.status < 200:
            return
        connection = self.headers.get("connection", "").lower()
        self.keep_alive = "keep-alive" in connection if parts[0] == "HTTP/1.0" else "close" not in connection
        if self.status in (204, 304):
            self.complete = True
        elif "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._framing = "chunked"
        elif "content-length" in self.headers:
            try:
                self._remaining = int(self.headers["content-length"])
            except ValueError:
                raise HttpProtocolError("invalid Content-Length") from None
            self._framing = "length"
            self.complete = self._remaining == 0
        else:
            self.keep_alive = False  # the body runs until the peer closes

    def _dechunk(self, data: bytes) -> bytes:
        if not self._buf and self._state == _SIZE:
            # Fast path for the usual read, exactly one whole non-final chunk: no state loop.
            nl = data.find(b"\r\n")
            # Only bare hex digits here: int() alone would also take "+5", "0x5", "5_0" or " 5".
            if 0 < nl <= 8 and data.endswith(b"\r\n") and not data[:nl].strip(_HEX):
                length = int(data[:nl], 16)
                if length > 0 and len(data) == nl + length + 4:
                    return data[nl + 2 : nl + 2 + length]
        buf = self._buf + data if self._buf else data
        size = len(buf)
        out: list[bytes] = []
        pos = 0
        state = self._state
        while pos < size:
            if state == _DATA:
                take = min(self._remaining, size - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    state = _CRLF
            elif state == _SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if size - pos > 1024:
                        raise HttpProtocolError("chunk size line too long")
                    break
                length = _chunk_size(buf[pos:end])
                pos = end + 2
                self._remaining = length
                state = _DATA if length else _TRAILER
            elif state == _CRLF:
                if size - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise HttpProtocolError("chunk not followed by CRLF")
                pos += 2
                state = _SIZE
            elif state == _TRAILER:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                blank = end == pos  # the empty line that ends the trailer section
                pos = end + 2
                if blank:
                    state = _DONE
                    self.complete = True
                    if pos < size:
                        self.keep_alive = False
                    break
        self._state = state
        self._buf = buf[pos:] if pos < size and state != _DONE else b""
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)


def _chunk_size(line: bytes) -> int:
    """The size of a chunk-size line (RFC 9112 7.1): hex digits, then optional extensions.

    Strict on purpose: a lenient parse of a mangled size (a sign, ``0x``, spaces,
    underscores) would silently take the wrong number of bytes as body and desynchronise
    every later event of the stream.
    """
    digits, sep, _ = line.partition(b";")
    if sep:
        digits = digits.rstrip(b" \t")  # whitespace is allowed only before an extension
    if not digits or len(digits) > _SIZE_DIGITS or digits.strip(_HEX):
        raise HttpProtocolError(f"bad chunk size {line[:40]!r}")
    return int(digits, 16)
