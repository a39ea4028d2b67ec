"""The streaming client's HTTP/1.1 response parser: framing, splits, truncation."""

from __future__ import annotations

import pytest

from bakeoff.measure.http1 import HttpProtocolError, ResponseParser

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def feed_all(parser: ResponseParser, pieces: list[bytes]) -> bytes:
    return b"".join(parser.feed(p) for p in pieces)


def test_chunked_response() -> None:
    parser = ResponseParser()
    body = feed_all(parser, [HEAD + chunked(b"data: a\n\n", b"data: b\n\n")])
    assert body == b"data: a\n\ndata: b\n\n"
    assert parser.status == 200 and parser.complete and parser.keep_alive
    assert parser.headers["content-type"] == "text/event-stream"


def test_one_chunk_per_read() -> None:
    # How streams usually arrive: headers, then one whole chunk per read, then the end.
    parser = ResponseParser()
    assert parser.feed(HEAD) == b""
    assert parser.feed(b"9\r\ndata: a\n\n\r\n") == b"data: a\n\n"
    assert parser.feed(b"e\r\ndata: [DONE]\n\n\r\n") == b"data: [DONE]\n\n"
    assert not parser.complete
    assert parser.feed(b"0\r\n\r\n") == b""
    assert parser.complete and parser.keep_alive


@pytest.mark.parametrize("size", [1, 2, 3, 5, 17])
def test_split_at_every_boundary(size: int) -> None:
    raw = HEAD + chunked(b"data: first\n\n", b"x" * 40, b"data: [DONE]\n\n")
    parser = ResponseParser()
    body = feed_all(parser, [raw[i : i + size] for i in range(0, len(raw), size)])
    assert body == b"data: first\n\n" + b"x" * 40 + b"data: [DONE]\n\n"
    assert parser.complete


def test_chunk_extensions_and_trailers() -> None:
    parser = ResponseParser()
    raw = HEAD + b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: yes\r\n\r\n"
    assert parser.feed(raw) == b"hello"
    assert parser.complete


def test_content_length_body_and_error_status() -> None:
    parser = ResponseParser()
    raw = b'HTTP/1.1 500 Internal Server Error\r\nContent-Length: 12\r\n\r\n{"error": 1}'
    assert parser.feed(raw) == b'{"error": 1}'
    assert parser.status == 500 and parser.reason == "Internal Server Error" and parser.complete


def test_close_delimited_body_ends_at_eof() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\n\r\ndata: a\n\n") == b"data: a\n\n"
    assert not parser.complete and not parser.keep_alive
    parser.feed_eof()
    assert parser.complete


def test_connection_close_and_http10() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert parser.complete and not parser.keep_alive
    parser = ResponseParser()
    parser.feed(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert not parser.keep_alive


def test_interim_response_is_skipped() -> None:
    parser = ResponseParser()
    body = parser.feed(b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD + chunked(b"ok"))
    assert body == b"ok" and parser.status == 200


def test_truncated_chunked_body_is_an_error_at_eof() -> None:
    parser = ResponseParser()
    parser.feed(HEAD + b"a\r\ndata: x\n\n\r\n")
    with pytest.raises(HttpProtocolError, match="mid-body"):
        parser.feed_eof()


def test_eof_before_headers() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200")
    with pytest.raises(HttpProtocolError, match="before the response headers"):
        parser.feed_eof()


@pytest.mark.parametrize(
    "raw",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        HEAD + b"zz\r\n",
        HEAD + b"2\r\nabXY",
        HEAD + b"-5\r\nabcde\r\n",
    ],
)
def test_malformed_responses(raw: bytes) -> None:
    with pytest.raises(HttpProtocolError):
        ResponseParser().feed(raw)


def test_bytes_after_the_end_make_the_connection_unreusable() -> None:
    parser = ResponseParser()
    parser.feed(HEAD + chunked(b"a") + b"HTTP/1.1 200 OK\r\n")
    assert parser.complete and not parser.keep_alive


@pytest.mark.parametrize("size_line", [b"+5", b"0x5", b"5_0", b" 5", b"5 ", b"", b"1" * 17, b"5\t", b"\xd9\xa5"])
@pytest.mark.parametrize("split", [False, True])
def test_chunk_size_is_parsed_strictly(size_line: bytes, split: bool) -> None:
    # int(x, 16) alone takes several of these; each would desynchronise the stream silently.
    raw = HEAD + size_line + b"\r\nhello\r\n"
    parser = ResponseParser()
    with pytest.raises(HttpProtocolError, match="bad chunk size"):
        if split:  # the general path, not the one-whole-chunk fast path
            parser.feed(raw[: len(HEAD) + 1])
            parser.feed(raw[len(HEAD) + 1 :])
        else:
            parser.feed(raw)


def test_whitespace_before_a_chunk_extension_is_allowed() -> None:
    parser = ResponseParser()
    assert parser.feed(HEAD + b"5 ;name=value\r\nhello\r\n0\r\n\r\n") == b"hello"
    assert parser.complete


def test_uppercase_hex_sizes_in_both_paths() -> None:
    parser = ResponseParser()
    assert parser.feed(HEAD) == b""
    assert parser.feed(b"A\r\n" + b"x" * 10 + b"\r\n") == b"x" * 10  # fast path
    assert parser.feed(b"B\r\n" + b"y" * 11 + b"\r\n0\r\n\r\n") == b"y" * 11  # general path
    assert parser.complete


def test_whole_chunks_reads_one_chunk_a_read_as_feed_does() -> None:
    reads = [b"9\r\ndata: a\n\n\r\n", b"A\r\ndata: bc\n\n\r\n", b"e\r\ndata: [DONE]\n\n\r\n"]
    batch, single = ResponseParser(), ResponseParser()
    batch.feed(HEAD)
    single.feed(HEAD)
    assert batch.whole_chunks(reads) == ([single.feed(r) for r in reads], [0, 1, 2])
    # Whole chunks leave the parser at a chunk start: the end is read as usual.
    assert batch.feed(b"0\r\n\r\n") == b"" and batch.complete


def test_whole_chunks_says_which_read_each_chunk_came_in() -> None:
    # A loaded client finds several chunks queued in one read: each is stamped with that read.
    reads = [b"9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n", b"9\r\ndata: c\n\n\r\n", b"9\r\ndata: d\n\n\r\n" * 3]
    parser = ResponseParser()
    parser.feed(HEAD)
    chunks = parser.whole_chunks(reads)
    assert chunks == ([b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"] + [b"data: d\n\n"] * 3, [0, 0, 1, 2, 2, 2])
    assert parser.feed(b"0\r\n\r\n") == b"" and parser.complete


@pytest.mark.parametrize(
    "reads",
    [
        [b"9\r\ndata: a", b"\n\n\r\n"],  # one chunk over two reads
        [b"9\r\ndata: a\n\n\r\n9\r\ndata:", b" b\n\n\r\n"],  # the second of a read's chunks over two
        [b"9\r\ndata: a\n\n\r\n", b"0\r\n\r\n"],  # the last chunk
        [b"0x9\r\ndata: a\n\n\r\n"],  # a size int() takes and HTTP does not
        [b"+9\r\ndata: a\n\n\r\n"],
        [b"a\r\ndata: a\r\n\r\n\r\n"],  # data holding a CRLF of its own
        [b"8\r\ndata: a\n\n\r\n"],  # a size that is not the data's
    ],
)
def test_whole_chunks_leaves_anything_else_to_feed(reads: list[bytes]) -> None:
    parser = ResponseParser()
    parser.feed(HEAD)
    assert parser.whole_chunks(reads) is None


def test_whole_chunks_only_at_a_chunk_start_of_a_chunked_body() -> None:
    parser = ResponseParser()
    assert parser.whole_chunks([b"9\r\ndata: a\n\n\r\n"]) is None  # no headers yet
    parser.feed(HEAD + b"9\r\ndata:")
    assert parser.whole_chunks([b"9\r\ndata: a\n\n\r\n"]) is None  # mid-chunk
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n")
    assert parser.whole_chunks([b"9\r\ndata: a\n\n\r\n"]) is None  # not chunked
