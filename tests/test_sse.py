"""SSE framing and OpenAI stream-chunk reading, one test per quirk seen on real servers."""

from __future__ import annotations

import orjson
import pytest

from bakeoff.measure.sse import DONE, SSEDecoder, cached_tokens_of, read_chunk, split_tokens


def sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat(delta: dict[str, object], finish: str | None = None, **extra: object) -> dict[str, object]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def completion(text: str, finish: str | None = None, **extra: object) -> dict[str, object]:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra}


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}

# A vLLM / SGLang style chat stream: role chunk, content, finish, usage chunk, [DONE].
STREAM = b"".join(
    [
        sse(chat({"role": "assistant", "content": ""})),
        sse(chat({"content": "Hello"})),
        b": keep-alive\n\n",
        sse(chat({"content": " big world"})),
        sse(chat({"content": "!"}, "length")),
        sse({"object": "chat.completion.chunk", "choices": [], "usage": USAGE}),
        b"data: [DONE]\n\n",
    ]
)


def decode_all(pieces: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    events = [e for piece in pieces for e in decoder.feed(piece)]
    return events + decoder.flush()


# --- chunk content --------------------------------------------------------------------


def test_role_only_first_chunk_carries_no_text() -> None:
    info = read_chunk(orjson.dumps(chat({"role": "assistant", "content": ""})))
    assert info.text is None and info.error is None and info.finish_reason is None


def test_first_chunk_without_content_key_is_not_an_error() -> None:
    # TensorRT-LLM's role chunk: delta has a role and no content key at all.
    info = read_chunk(orjson.dumps(chat({"role": "assistant"})))
    assert info.text is None and info.error is None


def test_null_content_and_empty_completion_text_carry_no_text() -> None:
    assert read_chunk(orjson.dumps(chat({"content": None}))).text is None
    assert read_chunk(orjson.dumps(completion(""))).text is None


def test_completion_and_chat_text() -> None:
    assert read_chunk(orjson.dumps(completion(" the"))).text == " the"
    assert read_chunk(orjson.dumps(chat({"content": " the"}))).text == " the"


def test_several_tokens_in_one_chunk_are_returned_whole() -> None:
    # SGLang / speculative decoding: one chunk, several tokens; the split comes from usage.
    info = read_chunk(orjson.dumps(chat({"content": " one two three"})))
    assert info.text == " one two three"


def test_usage_in_separate_empty_choices_chunk() -> None:
    info = read_chunk(orjson.dumps({"choices": [], "usage": USAGE}))
    assert info.text is None and info.finish_reason is None and info.usage == USAGE


def test_usage_inside_finish_chunk() -> None:
    # llama.cpp's native server: the last content chunk carries finish_reason and usage.
    info = read_chunk(orjson.dumps(completion(" end", "length", usage=USAGE)))
    assert (info.text, info.finish_reason, info.usage) == (" end", "length", USAGE)


def test_usage_absent() -> None:
    info = read_chunk(orjson.dumps(completion(" end", "stop")))
    assert info.usage is None and info.finish_reason == "stop"


def test_usage_null_before_the_end() -> None:
    # vLLM with include_usage sends "usage": null on every content chunk.
    assert read_chunk(orjson.dumps(completion(" a", usage=None))).usage is None


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"error": {"message": "KV cache exhausted", "code": 500}}, "KV cache exhausted"),
        ({"object": "error", "message": "bad things", "code": 400}, "bad things"),
        ({"error": "plain string error"}, "plain string error"),
    ],
)
def test_error_object_mid_stream(payload: dict[str, object], message: str) -> None:
    info = read_chunk(orjson.dumps(payload))
    assert info.error is not None and message in info.error
    assert info.text is None


def test_unparseable_and_non_object_chunks_are_errors() -> None:
    assert "unparseable" in (read_chunk(b'{"choices": [').error or "")
    assert "unexpected" in (read_chunk(b"[1, 2]").error or "")


def test_cached_tokens_of() -> None:
    assert cached_tokens_of({"prompt_tokens_details": {"cached_tokens": 12}}) == 12
    assert cached_tokens_of({"prompt_tokens_details": None}) is None
    assert cached_tokens_of({"prompt_tokens": 3}) is None


# --- SSE framing ----------------------------------------------------------------------


def test_whole_stream_events() -> None:
    events = decode_all([STREAM])
    assert len(events) == 6
    assert events[-1] == DONE
    texts = [read_chunk(e).text for e in events[:-1]]
    assert texts == [None, "Hello", " big world", "!", None]
    assert read_chunk(events[-2]).usage == USAGE


def test_comments_yield_no_events() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": keep-alive\n\n:ping\n\n") == []
    assert decoder.feed(b": keep-alive\n" + sse(completion("x"))) == [orjson.dumps(completion("x"))]


def test_crlf_line_ends() -> None:
    events = decode_all([STREAM.replace(b"\n", b"\r\n")])
    assert events == decode_all([STREAM])


def test_byte_by_byte_feed_matches_whole_feed() -> None:
    pieces = [STREAM[i : i + 1] for i in range(len(STREAM))]
    assert decode_all(pieces) == decode_all([STREAM])


@pytest.mark.parametrize("size", [2, 3, 7, 64, 1000])
def test_arbitrary_split_points(size: int) -> None:
    stream = STREAM.replace(b"\n", b"\r\n")  # a CRLF split across two reads too
    pieces = [stream[i : i + size] for i in range(0, len(stream), size)]
    assert decode_all(pieces) == decode_all([STREAM])


def test_one_megabyte_line() -> None:
    big = completion("x" * (1 << 20))
    raw = sse(big) + b"data: [DONE]\n\n"
    pieces = [raw[i : i + 65536] for i in range(0, len(raw), 65536)]
    events = decode_all(pieces)
    assert len(events) == 2 and events[1] == DONE
    assert read_chunk(events[0]).text == "x" * (1 << 20)


def test_done_marker() -> None:
    assert SSEDecoder().feed(b"data: [DONE]\n\n") == [DONE]
    assert SSEDecoder().feed(b"data:[DONE]\n\n") == [DONE]  # no space after the colon


def test_multi_line_data_is_joined_with_newlines() -> None:
    assert SSEDecoder().feed(b"data: a\ndata: b\n\n") == [b"a\nb"]


def test_other_fields_are_ignored() -> None:
    assert SSEDecoder().feed(b"event: message\nid: 7\nretry: 100\ndata: x\n\n") == [b"x"]


def test_blank_lines_without_data_are_not_events() -> None:
    assert SSEDecoder().feed(b"\n\n\r\n") == []


def test_flush_returns_an_event_missing_its_blank_line() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.flush() == [DONE]
    assert decoder.flush() == []


# --- token shares ---------------------------------------------------------------------


def test_split_tokens_one_per_chunk_when_counts_match() -> None:
    assert split_tokens(3, [5, 1, 9]) == [1, 1, 1]


def test_split_tokens_proportional_to_weights() -> None:
    assert split_tokens(8, [1, 1, 2, 4]) == [1, 1, 2, 4]
    assert split_tokens(6, [3, 3]) == [3, 3]


def test_split_tokens_largest_remainder() -> None:
    shares = split_tokens(10, [1, 1, 1])
    assert sorted(shares) == [3, 3, 4] and sum(shares) == 10
    assert split_tokens(5, [2, 1]) == [3, 2]  # exact 3.33 / 1.67: the remainder goes to 1.67


def test_split_tokens_zero_weights_share_evenly() -> None:
    assert split_tokens(5, [0, 0]) == [3, 2]


def test_split_tokens_empty() -> None:
    assert split_tokens(4, []) == []


@pytest.mark.parametrize(("total", "weights"), [(31, [3, 1, 4, 1, 5, 9, 2, 6]), (1, [2, 2]), (0, [1, 2])])
def test_split_tokens_always_sums_to_total(total: int, weights: list[int]) -> None:
    shares = split_tokens(total, weights)
    assert sum(shares) == total and len(shares) == len(weights) and min(shares) >= 0


def test_single_events_take_one_event_a_chunk_as_feed_does() -> None:
    chunks = [b'data: {"a": 1}\n\n', b"data: x\n\n", b'data: {"t": "data: y"}\n\n', b"data: [DONE]\n\n"]
    single = SSEDecoder()
    assert SSEDecoder().single_events(chunks) == [e for c in chunks for e in single.feed(c)]


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: a\n\ndata: b\n\n"],  # two events in one chunk
        [b"data: a\n", b"\n"],  # one event over two chunks
        [b"data: a\n", b"\ndata: b\n\n"],  # two newlines a chunk in all, but a blank line over two
        [b"data: a\ndata: b\n\n"],  # a two-line event
        [b": keep-alive\n\n"],  # a comment
        [b"data: a\r\n\r\n"],  # CRLF line ends
        [b"data:a\n\n"],  # no space after the colon: feed takes it, the batch leaves it
        [b"event: x\ndata: a\n\n"],
    ],
)
def test_single_events_leave_anything_else_to_feed(chunks: list[bytes]) -> None:
    assert SSEDecoder().single_events(chunks) is None


def test_single_events_wait_for_a_pending_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a") == []
    assert decoder.single_events([b"data: b\n\n"]) is None
