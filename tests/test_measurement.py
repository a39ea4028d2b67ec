"""The measurement itself, end to end: real HTTP against a server with exactly known timing.

The reference server (``bakeoff.ref.server``, its own process) sends the first content
chunk ``ttft`` after a request arrives and one chunk every ``itl`` after that, so the
client, load generator, runner and CLI are checked against known answers, and every
protocol quirk and fault is injected on purpose. Options differ per test through the
request body's ``ref`` field, so one server serves the module.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
import uvloop

from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.errors import LaunchError, ServerDiedError, SpecError
from bakeoff.measure.client import ClientSettings, StreamingClient, request_body
from bakeoff.measure.loadgen import closed_loop
from bakeoff.measure.metrics import e2e_ms, itl_ms, itl_per_token_ms, tpot_ms, ttfb_ms, ttft_ms
from bakeoff.observe.telemetry import parse_prometheus
from bakeoff.ref.options import MODEL
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import RECORDS_PARQUET, RUN_INFO, SUMMARY, read_json, read_records, read_summary
from bakeoff.serving.process import free_port, probe, wait_ready
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest, RunPlan
from plan_workloads import CLOSED

T = TypeVar("T")
TTFT_MS = 100.0
ITL_MS = 20.0
BAKEOFF = Path(sys.executable).with_name("bakeoff")


# Campaigns read on uvloop (a plain protocol there), tests mostly on asyncio's own loop (a
# buffered one): the tests of how a stream is read and how it fails run on both.
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=sorted(LOOPS))
def loop_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run_on(loop_name: str, coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        return runner.run(coro)


@pytest.fixture(scope="module")
def ref_url() -> Iterator[str]:
    with serve_reference(ttft_ms=TTFT_MS, itl_ms=ITL_MS) as url:
        yield url


def settings(url: str, ref: dict[str, Any] | None = None, **kwargs: Any) -> ClientSettings:
    extra: dict[str, Any] = {"ignore_eos": True}
    if ref:
        extra["ref"] = ref
    return ClientSettings(base_url=url, model=MODEL, extra_body=extra, **kwargs)


def planned(
    n: int, max_tokens: int = 16, endpoint: str = "completions", words: int = 8, first_id: int = 0
) -> list[PlannedRequest]:
    prompt = " ".join(f"p{i}" for i in range(words))
    messages = [{"role": "user", "content": prompt}]
    return [
        PlannedRequest(first_id + i, endpoint, max_tokens, prompt=prompt, messages=messages, prompt_tokens=words)
        for i in range(n)
    ]


def run(
    config: ClientSettings, items: list[PlannedRequest], concurrency: int = 1, loop_name: str = "asyncio"
) -> list[RequestRecord]:
    async def drive() -> list[RequestRecord]:
        records: list[RequestRecord] = []
        async with StreamingClient(config) as client:
            await closed_loop(client, items, concurrency, records.append)
        return sorted(records, key=lambda r: r.request_id)

    return run_on(loop_name, drive())


def one(
    config: ClientSettings, max_tokens: int = 16, endpoint: str = "completions", loop_name: str = "asyncio"
) -> RequestRecord:
    return run(config, planned(1, max_tokens, endpoint), loop_name=loop_name)[0]


def server_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics") as resp:
        return parse_prometheus(resp.read().decode())


def mean_lateness_ms(before: dict[str, float], after: dict[str, float]) -> float:
    """How late the reference server sent its chunks on average, between two scrapes."""
    chunks = after["bakeoff_ref_chunks_total"] - before["bakeoff_ref_chunks_total"]
    late_s = after["bakeoff_ref_late_seconds_total"] - before["bakeoff_ref_late_seconds_total"]
    return late_s / chunks * 1e3 if chunks else 0.0


def median(values: list[float | None]) -> float:
    return statistics.median(v for v in values if v is not None)


# --- timing -----------------------------------------------------------------------------


def measure_schedule(url: str) -> tuple[list[RequestRecord], float]:
    """Eight measured requests four at a time after a warm-up, and how late the server ran meanwhile."""
    # The first requests of a fresh server pay for accepts and cold code; warm up as runs do.
    warmup = planned(4, max_tokens=2, first_id=-4)
    before = server_counters(url)
    records = run(settings(url), warmup + planned(8, max_tokens=16), concurrency=4)[len(warmup) :]
    return records, mean_lateness_ms(before, server_counters(url))


def quickest_ttfts_ms(records: list[RequestRecord]) -> list[float]:
    return sorted(v for r in records if (v := ttft_ms(r)) is not None)


@pytest.mark.precision
def test_measured_timing_matches_the_configured_schedule(ref_url: str) -> None:
    records, late_ms = measure_schedule(ref_url)
    if late_ms > 0.5 or quickest_ttfts_ms(records)[1:2] != pytest.approx([TTFT_MS], abs=2.0):
        # A busy moment: the server missed its own schedule, or the client read even its quickest
        # answers late (a neighbour on the client's core: CI saw 102.5 ms once, in a phase of two
        # workers). Once more, then it counts: a systematic error of the client shows both times.
        records, late_ms = measure_schedule(ref_url)
    assert all(r.ok for r in records), [r.error for r in records]
    ttfts = quickest_ttfts_ms(records)
    tpots = [t for r in records if (t := tpot_ms(r)) is not None]
    assert statistics.fmean(tpots) == pytest.approx(ITL_MS, rel=0.03)
    assert median([g for r in records for g in itl_ms(r)]) == pytest.approx(ITL_MS, abs=1.0)
    assert statistics.median(ttfts) == pytest.approx(TTFT_MS, abs=10.0)
    assert all(r.completion_tokens == 16 and r.usage_source == "server" for r in records)
    assert all(len(r.chunk_ns) == 16 and r.finish_reason == "length" for r in records)
    assert late_ms <= 0.5, f"the reference server ran {late_ms:.1f} ms late twice: run the precision tests alone"
    # Busy moments only ever add delay: the systematic error shows in the quickest requests
    # (the second quickest of eight here), the noise in the median.
    assert ttfts[1] == pytest.approx(TTFT_MS, abs=2.0)
    assert sorted(map(e2e_ms, records))[1] == pytest.approx(TTFT_MS + 15 * ITL_MS, abs=3.0)


@pytest.mark.precision
def test_role_only_first_chunk_is_not_the_first_token(ref_url: str) -> None:
    record = one(settings(ref_url, {"role_chunk": True}), endpoint="chat")
    assert record.ok
    # The role chunk goes out at once, content only after TTFT: TTFB << TTFT.
    first_byte, first_token = ttfb_ms(record), ttft_ms(record)
    assert first_byte is not None and first_token is not None
    assert first_byte < 20.0 and first_token > TTFT_MS - 2.0
    assert len(record.chunk_ns) == 16  # the role chunk is not a content chunk


def test_without_role_chunk_first_byte_is_first_token(ref_url: str) -> None:
    record = one(settings(ref_url, {"role_chunk": False}))
    assert record.ok and record.first_event_ns == record.first_token_ns


def test_first_chunk_without_content_key(ref_url: str) -> None:
    # TensorRT-LLM's role chunk has no content key at all; it is neither an error nor a token.
    record = one(settings(ref_url, {"content_key_missing": True}), endpoint="chat")
    assert record.ok and record.first_event_ns < record.first_token_ns
    assert record.output_text.split() == [f"w{i % 10}" for i in range(16)]


@pytest.mark.precision
def test_several_tokens_per_chunk(ref_url: str) -> None:
    record = one(settings(ref_url, {"tokens_per_chunk": 4}), max_tokens=64)
    assert record.ok
    assert record.chunk_tokens == [4] * 16 and record.completion_tokens == 64
    assert median(list(itl_ms(record))) == pytest.approx(ITL_MS, abs=1.0)
    assert median(list(itl_per_token_ms(record))) == pytest.approx(ITL_MS / 4, abs=0.3)
    # TPOT spreads the 15 chunk gaps over the 60 tokens after the first chunk (which carried 4).
    assert tpot_ms(record) == pytest.approx(15 * ITL_MS / 60, rel=0.03)


@pytest.mark.precision
def test_speculative_steps_keep_the_step_time(ref_url: str) -> None:
    # 4 drafts a step, half accepted: the prefill's token, then 8 steps of 3 tokens, one step time apart.
    record = one(settings(ref_url, {"spec_tokens": 4, "spec_accept": 0.5}), max_tokens=25)
    assert record.ok
    assert record.chunk_tokens == [1] + [3] * 8 and record.completion_tokens == 25
    assert ttft_ms(record) == pytest.approx(TTFT_MS, abs=5.0)
    assert median(list(itl_ms(record))) == pytest.approx(ITL_MS, abs=1.0)
    assert median(list(itl_per_token_ms(record))) == pytest.approx(ITL_MS / 3, abs=0.5)


def test_uneven_last_chunk_gets_its_share(ref_url: str) -> None:
    record = one(settings(ref_url, {"tokens_per_chunk": 4, "itl_ms": 2.0}), max_tokens=10)
    assert record.ok and record.chunk_tokens == [4, 4, 2]


@pytest.mark.parametrize("mode", ["separate", "finish"])
def test_usage_from_the_server(ref_url: str, mode: str) -> None:
    record = one(settings(ref_url, {"usage": mode, "itl_ms": 2.0}, count_tokens=lambda t: 999))
    assert record.ok and record.usage_source == "server"
    assert record.completion_tokens == 16 and record.prompt_tokens == 8
    assert record.cached_tokens is not None


def test_usage_absent_falls_back_to_tokenizer_and_is_flagged(ref_url: str) -> None:
    config = settings(ref_url, {"usage": "none", "itl_ms": 2.0}, count_tokens=lambda t: len(t.split()))
    record = one(config)
    assert record.ok and record.usage_source == "tokenizer" and record.completion_tokens == 16


def test_usage_absent_without_tokenizer_counts_chunks_and_is_flagged(ref_url: str) -> None:
    record = one(settings(ref_url, {"usage": "none", "tokens_per_chunk": 2, "itl_ms": 2.0}))
    # 8 chunks of 2 tokens: counting chunks undercounts, which is why it is flagged.
    assert record.ok and record.usage_source == "chunks" and record.completion_tokens == 8


def test_comments_and_a_one_megabyte_line(ref_url: str) -> None:
    record = one(settings(ref_url, {"comments": True, "long_line_bytes": 1 << 20, "itl_ms": 2.0}))
    assert record.ok and record.completion_tokens == 16 and len(record.chunk_ns) == 16


# --- faults -----------------------------------------------------------------------------


def test_http_500(ref_url: str) -> None:
    record = one(settings(ref_url, {"fault": "http500"}))
    assert record.error_kind == "http" and record.http_status == 500 and "injected" in record.error


def test_cut_stream(ref_url: str, loop_name: str) -> None:
    record = one(settings(ref_url, {"fault": "cut", "itl_ms": 2.0}), loop_name=loop_name)
    assert record.error_kind == "stream_cut"
    assert len(record.chunk_ns) == 8  # what arrived before the cut is kept
    assert record.output_text.split() == [f"w{i}" for i in range(8)]


def test_error_object_mid_stream(ref_url: str, loop_name: str) -> None:
    record = one(settings(ref_url, {"fault": "error", "itl_ms": 2.0}), loop_name=loop_name)
    assert record.error_kind == "protocol" and "engine error" in record.error


# The stalling server sends its chunks, then nothing for an hour: only the client's own timeout ends
# the request. Never before it is due (the server's sleeps and the timeout only add up), and long
# before the stall would end (bounds one-sided and generous: no millisecond asserted beside other tests).
def test_stall_longer_than_the_stall_timeout(ref_url: str, loop_name: str) -> None:
    started = time.monotonic()
    record = one(settings(ref_url, {"fault": "stall", "itl_ms": 2.0}, stall_timeout_s=0.5), loop_name=loop_name)
    assert record.error_kind == "stall"
    assert time.monotonic() - started < 10.0
    assert e2e_ms(record) >= TTFT_MS + 7 * 2.0 + 500.0 - 1.0  # 0.5 s of silence after the last of 8 chunks


def test_request_timeout(ref_url: str) -> None:
    started = time.monotonic()
    record = one(settings(ref_url, {"fault": "stall", "itl_ms": 50.0}, request_timeout_s=0.6, stall_timeout_s=5.0))
    assert record.error_kind == "timeout"
    elapsed_s = time.monotonic() - started
    assert elapsed_s < 5.0  # before the 5 s stall timeout could end it
    # Never before it is due. The request's budget starts before its connection is taken (the
    # connect counts against it), so it is measured from before the call, not from the send:
    # e2e from the send once read 598.6 ms here, 1.4 ms of connecting earlier.
    assert elapsed_s >= 0.6


def test_fault_every_nth_request(ref_url: str) -> None:
    records = run(settings(ref_url, {"fault": "http500", "fault_every": 3, "itl_ms": 1.5}), planned(6, 4))
    assert [r.error_kind for r in records] == [None, None, "http", None, None, "http"]


def test_server_dies_mid_run_and_the_runner_still_writes_everything(tmp_path: Path) -> None:
    plan = RunPlan("c2", "closed", CLOSED, concurrency=2, requests=planned(12, max_tokens=8))
    # The run ends at the server's death (bakeoff.serving.death_watch): the rest of the plan is not sent.
    with (
        serve_reference(ttft_ms=20.0, itl_ms=5.0, fault="die", fault_every=5) as url,
        pytest.raises(ServerDiedError),
    ):
        execute_plan(plan, RunTarget(settings(url), show_progress=False), tmp_path)
    summary = read_summary(tmp_path / SUMMARY)
    requests = summary.requests
    # The 5th request kills the server mid-stream; the one beside it (concurrency 2) has finished by
    # then unless the host delayed it (a loaded 2-core host once left it in flight: 3 ok, 2 cut).
    assert 3 <= requests.ok <= 4 and summary.server_died is not None
    assert set(requests.failed_by_kind) <= {"stream_cut", "connect"}
    assert requests.failed_by_kind.get("stream_cut", 0) >= 1
    records = read_records(tmp_path / RECORDS_PARQUET)
    assert len(records) + summary.server_died.requests_not_sent == 12
    assert (tmp_path / RUN_INFO).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # writes were atomic


def test_ctrl_c_keeps_the_records_collected_so_far(ref_url: str, tmp_path: Path) -> None:
    plan = RunPlan("c2", "closed", CLOSED, concurrency=2, requests=planned(40, max_tokens=16))
    # SIGINT from a timer thread, as a terminal would send it, while the loop is running.
    timer = threading.Timer(1.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            execute_plan(plan, RunTarget(settings(ref_url), show_progress=False), tmp_path)
    finally:
        timer.cancel()
    records = read_records(tmp_path / RECORDS_PARQUET)
    assert 1 <= len(records) < 40 and all(r.ok for r in records)
    summary = read_summary(tmp_path / SUMMARY)
    assert summary.interrupted is True and summary.requests.ok == len(records)


# --- the reference server's own counters --------------------------------------------------


def test_prefix_cache_counters(ref_url: str) -> None:
    before = server_counters(ref_url)
    config = settings(ref_url, {"itl_ms": 1.0})
    prompt = " ".join(f"cache{i}" for i in range(40))  # 2 full blocks of 16 words, then 8
    item = PlannedRequest(0, "completions", 2, prompt=prompt)
    records = run(config, [item, item])
    after = server_counters(ref_url)
    assert [r.cached_tokens for r in records] == [0, 32]
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == 80
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == 32


def test_reference_options_are_checked(ref_url: str) -> None:
    with pytest.raises(TypeError), serve_reference(bogus=1):
        pass
    record = one(settings(ref_url, {"bogus": 1}))
    assert record.error_kind == "http" and record.http_status == 400 and "bogus" in record.error


def test_header_override_and_a_non_streaming_answer(ref_url: str) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": "a b c", "max_tokens": 5})
    # The header's options replace the server's: a 1 ms schedule, and an end of sequence after 3 tokens.
    override = '{"ttft_ms": 1, "itl_ms": 1, "eos_after": 3}'
    headers = {"Content-Type": "application/json", "x-bakeoff-ref": override}
    request = urllib.request.Request(ref_url + "/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(request) as resp:
        answer = orjson.loads(resp.read())
    assert answer["choices"][0]["text"].split() == ["w0", "w1", "w2"]
    assert answer["usage"]["prompt_tokens"] == 3 and answer["usage"]["completion_tokens"] == 3
    plain = {"Content-Type": "application/json"}
    request = urllib.request.Request(ref_url + "/v1/completions", data=body, headers=plain)
    with urllib.request.urlopen(request) as resp:
        answer = orjson.loads(resp.read())
    assert answer["choices"][0]["text"].split() == ["w0", "w1", "w2", "w3", "w4"]  # without it, all 5


# --- exact output lengths ----------------------------------------------------------------
# eos_after makes the reference server stop early, as a model's extra EOS id does on a real
# server, unless the request's min_tokens asks for more.


def test_request_body_carries_min_tokens_equal_to_max_tokens() -> None:
    item = planned(1, max_tokens=48)[0]
    with_min = orjson.loads(request_body(item, settings("http://x", min_tokens=True)))
    assert with_min["min_tokens"] == with_min["max_tokens"] == 48
    assert "min_tokens" not in orjson.loads(request_body(item, settings("http://x")))


def test_early_stop_shows_as_a_short_completion(ref_url: str) -> None:
    record = one(settings(ref_url, {"eos_after": 4}), max_tokens=16)
    assert record.ok and record.max_tokens == 16 and record.completion_tokens == 4
    assert record.short


def test_min_tokens_gets_the_planned_length(ref_url: str) -> None:
    record = one(settings(ref_url, {"eos_after": 4}, min_tokens=True), max_tokens=16)
    assert record.ok and record.completion_tokens == 16 and not record.short


def test_a_short_run_is_flagged_and_planned_lengths_are_stored(ref_url: str, tmp_path: Path) -> None:
    plan = RunPlan("c2", "closed", CLOSED, concurrency=2, requests=planned(6, max_tokens=12))
    summary = execute_plan(plan, RunTarget(settings(ref_url, {"eos_after": 5}), show_progress=False), tmp_path)
    short = summary.short_completions
    assert (short.count, short.share, short.tokens_missing) == (6, 1.0, 42)
    assert short.warning is not None and "6 of 6 requests ended before their planned max_tokens" in short.warning
    assert [r.max_tokens for r in read_records(tmp_path / RECORDS_PARQUET)] == [12] * 6
    # The host's CPU over the window is recorded; no engine process was followed, so it is not judged busy.
    assert summary.host is not None and summary.host.cpus >= 1 and not summary.host.busy
    assert summary.host.busy_cores is not None and summary.host.engine_cores is None
    assert read_json(tmp_path / RUN_INFO)["client"]["min_tokens"] is False


# --- the client on its own ----------------------------------------------------------------


class OneAnswerPerConnection:
    """A server that answers the first request on each connection, then drops the connection
    when the next request arrives on it: a kept-alive connection it closed while idle."""

    def __init__(self, answer_after_s: float = 0.0) -> None:
        body = b"data: " + orjson.dumps({"choices": [{"index": 0, "text": " a", "finish_reason": "length"}]})
        body += b"\n\ndata: [DONE]\n\n"
        self.response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            len(body),
            body,
        )
        self.answer_after_s = answer_after_s
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        await asyncio.sleep(self.answer_after_s)
        writer.write(self.response)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # a later request on this connection: drop it
        writer.close()


def test_kept_alive_connection_closed_by_the_server_is_retried(loop_name: str) -> None:
    """A server may close an idle connection just as the next request goes out on it."""
    server = OneAnswerPerConnection()

    async def drive() -> list[RequestRecord]:
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        records = []
        async with listening, StreamingClient(settings(f"http://127.0.0.1:{port}")) as client:
            for item in planned(2, 1):
                records.append(await client.send(item, RequestRecord(item.request_id)))
        return records

    records = run_on(loop_name, drive())
    assert [r.error_kind for r in records] == [None, None]
    assert server.connections == 2


def test_the_retry_after_a_closed_idle_connection_goes_out_on_a_new_one(loop_name: str) -> None:
    """The server closed both idle connections of the pool: the retry must not take the other."""
    server = OneAnswerPerConnection(answer_after_s=0.05)  # both first requests in flight: two connections

    async def drive() -> list[RequestRecord]:
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        first, second, third = planned(3, 1)
        async with listening, StreamingClient(settings(f"http://127.0.0.1:{port}")) as client:
            records = list(
                await asyncio.gather(
                    client.send(first, RequestRecord(first.request_id)),
                    client.send(second, RequestRecord(second.request_id)),
                )
            )
            records.append(await client.send(third, RequestRecord(third.request_id)))
        return records

    records = run_on(loop_name, drive())
    assert [r.error_kind for r in records] == [None, None, None]
    assert server.connections == 3  # two for the pair; the third request's retry opened the third


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class PiecemealStream:
    """Sends a stream in separate writes: a split event, and the last chunk split in two."""

    def __init__(self) -> None:
        def event(text: str, finish: str | None = None) -> bytes:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            return b"data: " + orjson.dumps({"object": "text_completion", "choices": [choice]}) + b"\n\n"

        usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 4}}
        split = _chunk(event(" c"))
        self.writes = [
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunk(event("")),
            _chunk(event(" a")),
            _chunk(event(" b")),
            split[:20],  # an event over two reads
            split[20:],
            _chunk(event(" d", "length") + b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"),
            b"0\r\n",  # the last chunk over two reads
            b"\r\n",
        ]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
        for piece in self.writes:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)  # each write its own read
        await reader.read()  # kept alive: only the bytes can tell the client the response ended
        writer.close()


async def one_request(server: PiecemealStream) -> RequestRecord:
    """One 4-token request from the streaming client to ``server``, listening on a free port."""
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    item = planned(1, 4)[0]
    async with listening, StreamingClient(settings(f"http://127.0.0.1:{port}", stall_timeout_s=2)) as client:
        return await client.send(item, RequestRecord(item.request_id))


def test_a_stream_in_pieces_is_read_whole_with_each_event_at_its_own_read(loop_name: str) -> None:
    """Reads that wait to be parsed (data_received) keep their own stamps; a split end still ends the response."""
    record = run_on(loop_name, one_request(PiecemealStream()))
    assert record.ok, record.error
    assert record.output_text == " a b c d" and record.completion_tokens == 4 and record.finish_reason == "length"
    # Four content chunks from four reads (the split event at its second half), each later than the one before.
    assert len(record.chunk_ns) == 4 and record.chunk_ns == sorted(set(record.chunk_ns))
    assert record.first_event_ns < record.first_token_ns == record.chunk_ns[0] < record.end_ns


class QueuedStream(PiecemealStream):
    """Sends two chunks in one write, as a server's chunks queue up while a loaded client is busy."""

    def __init__(self) -> None:
        super().__init__()

        def event(text: str, finish: str | None = None) -> bytes:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            return _chunk(b"data: " + orjson.dumps({"object": "text_completion", "choices": [choice]}) + b"\n\n")

        usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 4}}
        self.writes = [
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + event(""),
            event(" a") + event(" b"),  # one read, two chunks: both stamped when it arrived
            event(" c"),
            event(" d", "length") + _chunk(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n") + b"0\r\n\r\n",
        ]


def test_chunks_queued_in_one_read_share_its_stamp(loop_name: str) -> None:
    """The batch path takes a read of several whole chunks: each event keeps the stamp of the read it came in."""
    record = run_on(loop_name, one_request(QueuedStream()))
    assert record.ok, record.error
    assert record.output_text == " a b c d" and record.completion_tokens == 4 and record.chunk_tokens == [1] * 4
    a, b, c, d = record.chunk_ns
    assert a == b < c < d <= record.end_ns
    assert record.first_event_ns < record.first_token_ns == a


def test_invalid_base_url_is_a_spec_error() -> None:
    async def enter() -> None:
        async with StreamingClient(settings("ftp://127.0.0.1:1")):
            pass

    with pytest.raises(SpecError, match="base URL"):
        asyncio.run(enter())


# --- the command line ---------------------------------------------------------------------


def bench(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BAKEOFF), "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def bench_args(url: str, out: Path, **overrides: str) -> list[str]:
    values = {"concurrency": "2", "num-requests": "4", "input-len": "8", "output-len": "8", "warmup": "0"}
    values.update({k.replace("_", "-"): v for k, v in overrides.items()})
    args = ["--base-url", url, "--model", MODEL, "--out", str(out)]
    for name, value in values.items():
        args += [f"--{name}", value]
    return args


def test_cli_bench_against_the_reference_server(ref_url: str, tmp_path: Path) -> None:
    result = bench(*bench_args(ref_url, tmp_path / "run"))
    assert result.returncode == 0, result.stderr
    summary = read_summary(tmp_path / "run" / SUMMARY)
    assert summary.requests.ok == 4 and summary.tokens.completion == 32


def test_cli_unreachable_url_fails_fast_with_a_clear_message(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = bench(*bench_args(url, tmp_path / "run"))
    assert result.returncode != 0
    assert time.monotonic() - started < 20.0  # interpreter start-up included
    assert "cannot reach" in result.stderr and url in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [("concurrency", "0"), ("num_requests", "0"), ("input_len", "-5"), ("output_len", "-1")],
)
def test_cli_rejects_non_positive_values_naming_the_flag(tmp_path: Path, flag: str, value: str) -> None:
    result = bench(*bench_args("http://127.0.0.1:9", tmp_path / "run", **{flag: value}))
    assert result.returncode == 2
    assert f"--{flag.replace('_', '-')}" in result.stderr and "at least 1" in result.stderr


def test_cli_bench_sends_headers_and_min_tokens(ref_url: str, tmp_path: Path) -> None:
    # The header reaches the server: its per-request options make it stop after 3 tokens.
    early = ["--header", 'x-bakeoff-ref: {"eos_after": 3}']
    exact = bench(*bench_args(ref_url, tmp_path / "exact"), *early)
    assert exact.returncode == 0, exact.stderr
    assert read_summary(tmp_path / "exact" / SUMMARY).short_completions.count == 0
    short = bench(*bench_args(ref_url, tmp_path / "short"), *early, "--no-min-tokens")
    assert short.returncode == 0, short.stderr
    assert read_summary(tmp_path / "short" / SUMMARY).short_completions.count == 4
    assert "warning: 4 of 4 requests ended before their planned max_tokens" in short.stderr


def test_cli_bench_tells_on_screen_what_a_small_window_supports(ref_url: str, tmp_path: Path) -> None:
    # 16 in flight, 32 requests: the steady-state window holds few; nothing may pass for a P99.
    result = bench(*bench_args(ref_url, tmp_path / "run", concurrency="16", num_requests="32"))
    assert result.returncode == 0, result.stderr
    summary = read_summary(tmp_path / "run" / SUMMARY)
    n = summary.latency.ttft_ms.n
    assert n < 100
    # The table applies the report's support rule: the highest percentile n supports, named, never a P99.
    shown = f"(n={n}; P99 needs ≥100)" if n >= 2 else f"unsupported (n={n})"
    assert shown in result.stdout, result.stdout
    highest = "it supports no percentile" if n < 2 else "the highest it supports is P"
    assert f"P99 unsupported by n={n} samples ({highest}" in result.stderr
    assert "raise --num-requests" in result.stderr and "requests_per_slot" not in result.stderr


@pytest.mark.parametrize("header", ["no-colon", "Content-Length: 3", "Bad Name: x"])
def test_cli_refuses_a_bad_header_before_sending(header: str, tmp_path: Path) -> None:
    result = bench(*bench_args("http://127.0.0.1:9", tmp_path / "run"), "--header", header)
    assert result.returncode == 2 and "--header" in result.stderr and "Traceback" not in result.stderr


# --- a server behind an API key -------------------------------------------------------------

KEY_ENV = "BAKEOFF_TEST_SERVER_KEY"
KEY = "sk-test-7f3a9c1e5b2d4086"


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)
        with serve_reference(ttft_ms=5.0, itl_ms=1.0, api_key_env=KEY_ENV) as url:
            yield url


def test_keyed_server_refuses_requests_without_the_key(keyed_url: str) -> None:
    record = one(settings(keyed_url))
    assert record.error_kind == "http" and record.http_status == 401
    record = one(settings(keyed_url, headers={"Authorization": f"Bearer {KEY}"}))
    assert record.ok and record.completion_tokens == 16


def test_health_probe_sends_the_key_and_a_refusal_fails_fast(keyed_url: str, tmp_path: Path) -> None:
    health = keyed_url + "/health"
    assert probe(health) == 401
    assert probe(health, headers={"Authorization": f"Bearer {KEY}"}) == 200
    common: dict[str, Any] = {"interval_s": 0.05, "still_running": None, "log_path": tmp_path / "log", "what": "s"}
    wait_ready(health, timeout_s=5.0, headers={"Authorization": f"Bearer {KEY}"}, **common)
    started = time.monotonic()
    with pytest.raises(LaunchError, match="API key"):
        wait_ready(health, timeout_s=60.0, **common)
    assert time.monotonic() - started < 5.0  # no waiting out the start-up timeout


def test_cli_bench_with_the_key_from_the_environment_never_writes_it(keyed_url: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = bench(*bench_args(keyed_url, out), "--api-key-env", "MY_SERVING_KEY", env={"MY_SERVING_KEY": KEY})
    assert result.returncode == 0, result.stderr
    assert read_summary(out / SUMMARY).requests.ok == 4
    assert read_json(out / RUN_INFO)["client"]["header_names"] == ["Authorization"]
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and all(KEY.encode() not in p.read_bytes() for p in written)
    assert KEY not in result.stdout + result.stderr


def test_cli_bench_without_the_key_says_so(keyed_url: str, tmp_path: Path) -> None:
    result = bench(*bench_args(keyed_url, tmp_path / "run"))
    assert result.returncode == 2
    assert "HTTP 401" in result.stderr and "--api-key-env" in result.stderr


def test_cli_bench_with_an_unset_key_variable_fails_before_any_request(tmp_path: Path) -> None:
    # Nothing listens at this URL: the error must come from the variable check, first.
    url = f"http://127.0.0.1:{free_port()}"
    result = bench(*bench_args(url, tmp_path / "run"), "--api-key-env", "NO_SUCH_KEY_VAR_X", env={})
    assert result.returncode == 2
    assert "--api-key-env" in result.stderr and "NO_SUCH_KEY_VAR_X" in result.stderr
    assert "cannot reach" not in result.stderr and not (tmp_path / "run").exists()
