"""The reference server's framework profiles: each framework's wire behaviour, as bakeoff sees it.

Most tests run the aiohttp application in-process (``aiohttp.test_utils.TestServer``) and
read the raw bytes a real client would get; the last ones drive bakeoff's own
:class:`StreamingClient` against each profile, and one starts the server process the way a
rehearsal does.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp.test_utils import TestServer

from bakeoff.backends.spec import load_backend
from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.observe.telemetry import Snapshot, parse_prometheus, speculative_from_counters
from bakeoff.ref.cache import PrefixCache
from bakeoff.ref.options import RefOptions
from bakeoff.ref.profiles import SglangProfile, make_profile
from bakeoff.ref.server import ReferenceServer
from bakeoff.ref.wire import WireProfile
from bakeoff.results.records import RequestRecord
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest
from polling import apoll_until

MODEL = "served-name"
FAST = RefOptions(ttft_ms=5.0, itl_ms=1.0)
SLOW = '{"ttft_ms": 600, "itl_ms": 1}'  # a request that stays running while the test pokes the server
# The role-only chat chunk goes out at once and the first content TTFT later. Server and
# client share one event loop here, so on busy cores a 5 ms gap can close up and both land in
# one read (one timestamp); 100 ms keeps them apart.
APART = RefOptions(ttft_ms=100.0, itl_ms=1.0)
# Four drafts a step, 0.375 of them accepted: 1, 2, 1, 2, ... a step (1.5 on average).
SPECULATING = RefOptions(ttft_ms=5.0, itl_ms=1.0, spec_tokens=4, spec_accept=0.375)
PROMPT = " ".join(f"p{i}" for i in range(70))
BACKENDS = Path(__file__).resolve().parents[1] / "backends"


@asynccontextmanager
async def serving(profile: WireProfile, options: RefOptions = FAST) -> AsyncIterator[str]:
    server = TestServer(ReferenceServer(options, MODEL, profile=profile).app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def run(
    profile: str | WireProfile,
    check: Callable[[str, aiohttp.ClientSession], Awaitable[None]],
    options: RefOptions = FAST,
) -> None:
    async def main() -> None:
        wire = make_profile(profile) if isinstance(profile, str) else profile
        async with serving(wire, options) as url, aiohttp.ClientSession() as session:
            await check(url, session)

    asyncio.run(main())


def body(chat: bool, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "stream": stream, "ignore_eos": True}
    if stream:
        obj["stream_options"] = {"include_usage": True}
    obj.update({"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT})
    obj.update(extra)
    return obj


async def post(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    *,
    chat: bool,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with session.post(url + path, data=orjson.dumps(payload), headers=headers) as resp:
        return resp.status, await resp.read()


def events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of a stream, parsed; ``[DONE]`` kept as the string."""
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: "):
            payload = block[len(b"data: ") :].strip()
            out.append(payload.decode() if payload == b"[DONE]" else orjson.loads(payload))
    return out


async def metrics(session: aiohttp.ClientSession, url: str) -> tuple[str, dict[str, float]]:
    async with session.get(url) as resp:
        assert resp.status == 200
        text = await resp.text()
    return text, parse_prometheus(text)


async def gauge(session: aiohttp.ClientSession, url: str, name: str) -> float:
    """One gauge of the server's /metrics (0 when absent)."""
    _, values = await metrics(session, url + "/metrics")
    return values.get(name, 0.0)


def types(text: str) -> dict[str, str]:
    return {parts[2]: parts[3] for line in text.splitlines() if (parts := line.split()) and line.startswith("# TYPE")}


# --- the prefix cache ----------------------------------------------------------------------


def test_cache_granularity_and_the_last_token() -> None:
    words = [f"w{i}" for i in range(32)]
    vllm = PrefixCache(16, keep_last=True)
    assert [vllm.lookup(words), vllm.lookup(words)] == [0, 16]  # the 32nd token is always computed
    radix = PrefixCache(1, keep_last=True)
    assert [radix.lookup(words), radix.lookup([*words[:20], "other"])] == [0, 20]
    generic = PrefixCache(16, keep_last=False)
    assert [generic.lookup(words), generic.lookup(words)] == [0, 32]


def test_unknown_profile_is_refused_before_any_start() -> None:
    with pytest.raises(ValueError, match="profile must be one of"):
        make_profile("tgi")
    with pytest.raises(ValueError, match="profile must be one of"), serve_reference(profile="tgi"):
        pass


# --- vLLM ----------------------------------------------------------------------------------


def test_vllm_stream_shapes() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        status, raw = await post(session, url, body(True), chat=True)
        chat = events(raw)
        assert status == 200 and chat[-1] == "[DONE]"
        role = chat[0]["choices"][0]
        assert role == {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None}  # fmt: skip
        assert [c["choices"][0]["finish_reason"] for c in chat[1:-2]] == [None, None, None, "length"]
        assert chat[-2]["choices"] == [] and chat[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        _, raw = await post(session, url, body(False), chat=False)
        text = events(raw)
        assert "".join(c["choices"][0]["text"] for c in text[:-2]).split() == ["w0", "w1", "w2", "w3"]
        assert all(c["choices"][0]["text"] for c in text[:-2])  # no empty first chunk on completions
        assert text[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}  # 69 usable tokens, 16-blocks

    run("vllm", check)


def test_vllm_wrong_model_is_404_and_unknown_fields_pass() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        status, raw = await post(session, url, body(True, model="other"), chat=True)
        assert status == 404 and orjson.loads(raw)["error"]["message"] == "The model `other` does not exist."
        status, _ = await post(session, url, body(True, some_extension=1), chat=True)
        assert status == 200

    run("vllm", check)


def test_vllm_reset_fails_while_blocks_are_held() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        await post(session, url, body(False), chat=False)
        running = asyncio.ensure_future(post(session, url, body(False), chat=False, headers={"x-bakeoff-ref": SLOW}))
        await apoll_until(lambda: gauge(session, url, "vllm:num_requests_running"), 5, "the slow request running")
        async with session.post(url + "/reset_prefix_cache") as resp:
            assert resp.status == 200 and await resp.json() == {"success": False}
        await running
        _, raw = await post(session, url, body(False), chat=False)
        assert events(raw)[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 64  # nothing was freed
        async with session.post(url + "/reset_prefix_cache") as resp:
            assert resp.status == 200 and await resp.json() == {"success": True}
        _, raw = await post(session, url, body(False), chat=False)
        assert events(raw)[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    run("vllm", check)


def test_vllm_metric_names_types_and_labels() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        for _ in range(2):
            await post(session, url, body(False), chat=False)
        text, values = await metrics(session, url + "/metrics")
        assert values["vllm:prefix_cache_queries_total"] == 140 and values["vllm:prefix_cache_hits_total"] == 64
        assert values["vllm:request_success_total"] == 2 and values["vllm:generation_tokens_total"] == 8
        kinds = types(text)
        assert kinds["vllm:prefix_cache_hits_total"] == "counter" and kinds["vllm:kv_cache_usage_perc"] == "gauge"
        assert kinds["vllm:num_requests_running"] == "gauge" and kinds["vllm:num_requests_waiting"] == "gauge"
        assert f'vllm:prompt_tokens_total{{model_name="{MODEL}",engine="0"}} 140.0' in text
        assert "bakeoff_ref" not in text  # the server's own lateness is at /ref/metrics, not in vLLM's text
        _, own = await metrics(session, url + "/ref/metrics")
        assert own["bakeoff_ref_chunks_total"] == 8

    run("vllm", check)


# --- SGLang --------------------------------------------------------------------------------


def test_sglang_health_is_503_until_warm_then_slow() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        async with session.get(url + "/health") as resp:
            assert resp.status == 503

        async def warm() -> bool:
            async with session.get(url + "/health") as resp:
                assert resp.status in (200, 503)
                return resp.status == 200

        await apoll_until(warm, 5, "the warm-up to end")
        started = time.monotonic()
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
        assert time.monotonic() - started >= 0.1  # the health generation is awaited, not skipped

    run(SglangProfile(warmup_s=0.3, health_poll_s=0.1), check)


def test_sglang_stream_shapes_and_zero_cache_details() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        _, raw = await post(session, url, body(True, max_tokens=32), chat=True)
        chat = events(raw)
        assert chat[0]["choices"][0]["delta"]["role"] == "assistant" and chat[0]["usage"] is None
        content = chat[1:-3]
        tokens = [len(c["choices"][0]["delta"]["content"].split()) for c in content]
        assert sum(tokens) == 32 and len(tokens) == 30 and tokens[9] == 2  # several tokens in some chunks
        assert all(c["choices"][0]["finish_reason"] is None for c in content)
        finish = chat[-3]["choices"][0]
        assert finish["finish_reason"] == "length" and finish["delta"]["content"] is None
        # 0.5.23 reports cached_tokens also when nothing was cached (0.5.18 sent null details).
        assert chat[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        _, raw = await post(session, url, body(True), chat=True)
        assert events(raw)[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 69}  # token granularity

    run("sglang", check)


@pytest.mark.parametrize("profile", ["generic", "vllm", "sglang", "trtllm"])
def test_a_canned_answer_ends_on_its_own_in_every_profile(profile: str) -> None:
    """A canned (quality) answer shorter than max_tokens ends with "stop" in every profile, in
    SGLang's finish chunk of its own too; one max_tokens cuts ends with "length"."""
    answer = "Paris is the answer"

    async def main() -> list[list[str | None]]:
        app = ReferenceServer(FAST, MODEL, profile=make_profile(profile, 0.0), canned={PROMPT: answer}).app()
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        reasons = []
        try:
            url = str(server.make_url("")).rstrip("/")
            async with aiohttp.ClientSession() as session:
                for max_tokens in (8, 2):
                    _, raw = await post(session, url, body(True, max_tokens=max_tokens), chat=True)
                    chunks = [e for e in events(raw) if isinstance(e, dict) and e["choices"]]
                    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
                    assert text.split() == answer.split()[:max_tokens]
                    reasons.append(
                        [c["choices"][0].get("finish_reason") for c in chunks if c["choices"][0].get("finish_reason")]
                    )
        finally:
            await server.close()
        return reasons

    whole, cut = asyncio.run(main())
    assert whole == ["stop"] and cut == ["length"]


def test_sglang_flush_refused_while_running_and_hit_rate_gauge() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        await post(session, url, body(False), chat=False)
        running = asyncio.ensure_future(post(session, url, body(False), chat=False, headers={"x-bakeoff-ref": SLOW}))
        await apoll_until(lambda: gauge(session, url, "sglang:num_running_reqs"), 5, "the slow request running")
        async with session.post(url + "/flush_cache") as resp:
            assert resp.status == 400 and (await resp.text()).startswith("Cache flushed.")
        await running
        text, values = await metrics(session, url + "/metrics")
        assert values["sglang:cached_tokens_total"] == 69 and values["sglang:prompt_tokens_total"] == 140
        assert values["sglang:cache_hit_rate"] == pytest.approx(69 / 70)  # the last prefill only, not 69/140
        kinds = types(text)
        assert kinds["sglang:cache_hit_rate"] == "gauge" and kinds["sglang:cached_tokens_total"] == "counter"
        assert kinds["sglang:token_usage"] == "gauge" and kinds["sglang:num_queue_reqs"] == "gauge"
        async with session.get(url + "/flush_cache") as resp:
            assert resp.status == 200
        _, raw = await post(session, url, body(False), chat=False)
        assert events(raw)[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # flushed: a cold prompt

    run("sglang", check)


# --- TensorRT-LLM --------------------------------------------------------------------------


def test_trtllm_rejects_unknown_fields_naming_them() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        status, raw = await post(session, url, body(True, ref={"ttft_ms": 1}), chat=True)
        error = orjson.loads(raw)["error"]
        assert status == 400 and "('body', 'ref')" in error and "Extra inputs are not permitted" in error
        status, raw = await post(session, url, body(False, stream=False, stream_options={"include_usage": True}),
                                 chat=False)  # fmt: skip
        assert status == 400 and "Stream options can only be defined when stream is true" in orjson.loads(raw)["error"]
        status, raw = await post(session, url, body(False, stream_options={"include_usage": True, "x": 1}), chat=False)
        assert status == 400 and "('body', 'stream_options', 'x')" in orjson.loads(raw)["error"]
        status, _ = await post(session, url, body(True, min_tokens=4, temperature=0.0), chat=True)
        assert status == 200

    run("trtllm", check)


def test_trtllm_stream_shapes() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        _, raw = await post(session, url, body(True, stream_options={}), chat=True)
        first_line = raw.split(b"\n\n")[0]
        assert first_line.endswith(b"} ")  # TRT-LLM's space before the blank line
        chat = events(raw)
        assert chat[0]["choices"] == [{"index": 0, "delta": {"role": "assistant"}}]  # no content key
        assert ["finish_reason" in c["choices"][0] for c in chat[1:-2]] == [False, False, False, True]
        assert chat[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # include_usage defaults on
        _, raw = await post(session, url, body(False), chat=False)
        first = events(raw)[0]
        assert first["usage"] is None and first["choices"][0]["token_ids"] is None
        assert events(raw)[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}  # 32-token blocks

    run("trtllm", check)


def test_trtllm_iteration_stats_drain_and_prometheus() -> None:
    async def check(url: str, session: aiohttp.ClientSession) -> None:
        for _ in range(2):
            await post(session, url, body(False), chat=False)
        async with session.get(url + "/metrics") as resp:
            stats = await resp.json()
        kv = stats[-1]["kvCacheStats"]
        assert (kv["reusedBlocks"], kv["missedBlocks"], kv["tokensPerBlock"]) == (2, 4, 32)
        async with session.get(url + "/metrics") as resp:
            assert await resp.json() == []  # drained by the first GET
        text, values = await metrics(session, url + "/prometheus/metrics")
        assert values["trtllm_kv_cache_reused_blocks_total"] == 2 and values["trtllm_kv_cache_missed_blocks_total"] == 4
        assert types(text)["trtllm_kv_cache_hit_rate"] == "gauge"
        assert 'model_name="undefined",engine_type="undefined"' in text
        for path in ("/reset_prefix_cache", "/flush_cache"):
            async with session.post(url + path) as resp:
                assert resp.status == 404  # TensorRT-LLM has no cache reset

    run("trtllm", check)


# --- speculative decoding, in every profile ------------------------------------------------


def _speculate(profile: str, options: RefOptions, max_tokens: int) -> tuple[list[int], Snapshot, Snapshot, str]:
    """One streamed completion; its chunk sizes, the backend's scrapes around it, and the text after."""
    backend = load_backend(profile)
    assert backend.metrics.path is not None

    async def main() -> tuple[list[int], Snapshot, Snapshot, str]:
        async with serving(make_profile(profile, warmup_s=0.0), options) as url, aiohttp.ClientSession() as session:
            _, before = await metrics(session, url + backend.metrics.path)
            status, raw = await post(session, url, body(False, max_tokens=max_tokens), chat=False)
            assert status == 200
            text, after = await metrics(session, url + backend.metrics.path)
        chunks = [len(e["choices"][0]["text"].split()) for e in events(raw) if isinstance(e, dict) and e["choices"]]
        return chunks, before, after, text

    return asyncio.run(main())


@pytest.mark.parametrize("profile", ["vllm", "sglang", "trtllm"])
def test_speculation_streams_steps_and_counts_them_as_the_framework_does(profile: str) -> None:
    backend = load_backend(profile)
    chunks, before, after, _ = _speculate(profile, SPECULATING, max_tokens=16)
    # The prefill's token, then each step's own token and the drafts it accepted, in one chunk.
    assert chunks == [1, 2, 3, 2, 3, 2, 3]
    spec = speculative_from_counters(before, after, backend, draft_len=4)
    assert spec is not None
    # Six steps proposed 24 drafts and accepted 9 of them, read through each backend's YAML
    # (SGLang's from its verify-call and token counters, TensorRT-LLM's without a step count).
    assert (spec["draft_tokens"], spec["accepted_tokens"], spec["acceptance_rate"]) == (24, 9, 0.375)
    assert spec["accepted_per_step"] == (None if profile == "trtllm" else 1.5)


def test_speculation_cuts_the_last_step_to_max_tokens() -> None:
    chunks, before, after, text = _speculate("vllm", SPECULATING, max_tokens=8)
    # Steps of 2, 3, then 2 of the 3 the third step would have sent: 4 drafts accepted, not 5.
    assert chunks == [1, 2, 3, 2]
    assert speculative_from_counters(before, after, load_backend("vllm")) == {
        "draft_tokens": 12, "accepted_tokens": 4, "drafts": 3, "acceptance_rate": 4 / 12, "accepted_per_step": 4 / 3,
    }  # fmt: skip
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="served-name",engine="0"} 4.0' in text


@pytest.mark.parametrize("profile", ["vllm", "sglang", "trtllm"])
def test_without_speculation_nothing_is_drafted_and_chunks_are_the_profiles(profile: str) -> None:
    chunks, before, after, text = _speculate(profile, FAST, max_tokens=12)
    assert chunks == make_profile(profile).chunk_sizes(12, 1)
    assert speculative_from_counters(before, after, load_backend(profile), draft_len=4) is None
    # vLLM registers its draft counters only with a speculative config, TensorRT-LLM on a first draft.
    assert ("spec_decode" in text) is False
    if profile == "sglang":  # its gauges are there at 0, the verify-call counter is not
        assert "sglang:spec_accept_length" in text and "sglang:spec_verify_calls_total" not in text


def test_speculation_options_are_checked() -> None:
    with pytest.raises(ValueError, match="spec_accept between 0 and 1"):
        RefOptions(spec_tokens=4, spec_accept=1.5)
    with pytest.raises(ValueError, match="spec_tokens must be 0"):
        RefOptions(spec_tokens=-1)


# --- bakeoff's client against each profile -------------------------------------------------


@pytest.mark.parametrize("profile", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_client_records_from_each_profile(profile: str, endpoint: str) -> None:
    warm = {"vllm": 64, "sglang": 69, "trtllm": 64}[profile]

    async def main() -> list[RequestRecord]:
        async with serving(make_profile(profile), APART) as url:
            item = PlannedRequest(0, endpoint, 8, prompt=PROMPT, messages=[{"role": "user", "content": PROMPT}])
            async with StreamingClient(ClientSettings(base_url=url, model=MODEL)) as client:
                return [await client.send(item, RequestRecord(i)) for i in range(2)]

    cold, hot = asyncio.run(main())
    for record in (cold, hot):
        assert record.ok, record.error
        assert record.completion_tokens == 8 and record.prompt_tokens == 70 and record.usage_source == "server"
        assert sum(record.chunk_tokens) == 8 and record.output_text.split() == [f"w{i}" for i in range(8)]
        # TTFT counts from the first content chunk, never from a role-only one (chat only).
        assert record.first_token_ns == record.chunk_ns[0]
        assert (record.first_event_ns < record.first_token_ns) is (endpoint == "chat")
    # Every profile reports 0 cached tokens on a cold prompt: SGLang 0.5.23 too (0.5.18 left them out).
    assert cold.cached_tokens == 0
    assert hot.cached_tokens == warm


def test_served_as_a_process_in_a_profile() -> None:
    """The way a rehearsal starts it: wait_ready rides out SGLang's 503 warm-up."""
    started = time.monotonic()
    with serve_reference(model=MODEL, profile="sglang", warmup_s=0.5) as url:
        assert time.monotonic() - started >= 0.5
        with urllib.request.urlopen(url + "/v1/models") as resp:
            models = orjson.loads(resp.read())
        assert models["data"][0] == {"id": MODEL, "object": "model", "owned_by": "sglang"}


# --- prompt logprobs (vLLM's completions fields; bakeoff.ref.logprobs) ---------------------

ASKED = {"prompt_logprobs": 0, "return_token_ids": True}


def _prompt_report(answer: dict[str, Any], prompt: str, logprob: float) -> None:
    """One non-streamed answer holds vLLM's prompt logprobs for ``prompt``, every token at ``logprob``."""
    choice = answer["choices"][0]
    words = prompt.split()
    ids, entries = choice["prompt_token_ids"], choice["prompt_logprobs"]
    assert len(ids) == len(entries) == len(words) == answer["usage"]["prompt_tokens"]
    assert all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    assert entries[0] is None  # nothing precedes the first prompt token
    for word, token, entry in zip(words[1:], ids[1:], entries[1:], strict=True):
        assert list(entry) == [str(token)]  # prompt_logprobs 0: the prompt token alone, keyed by its id
        stat = entry[str(token)]
        assert stat["logprob"] == logprob and isinstance(stat["rank"], int) and stat["rank"] >= 1
        assert stat["decoded_token"].strip() == word and stat["decoded_token"][0].isspace()
    # The answer's own ids: one per completion token.
    assert len(choice["token_ids"]) == answer["usage"]["completion_tokens"] == len(choice["text"].split())


@pytest.mark.parametrize("profile", ["vllm", "generic"])
def test_prompt_logprobs_on_a_non_streamed_completion(profile: str) -> None:
    prompt = "the cat sat on the mat\nand the dog"

    async def check(url: str, session: aiohttp.ClientSession) -> None:
        planted = FAST.prompt_logprob
        status, raw = await post(session, url, body(False, stream=False, prompt=prompt, **ASKED), chat=False)
        assert status == 200, raw
        first = orjson.loads(raw)
        _prompt_report(first, prompt, planted)
        ids = first["choices"][0]["prompt_token_ids"]
        # Stable: the same word has the same id everywhere, other words others.
        assert ids[0] == ids[4] == ids[7] and len({ids[1], ids[2], ids[3], ids[5]}) == 4
        # The planted logprob is an option like any other, so it can be changed per request.
        header = {"x-bakeoff-ref": orjson.dumps({"prompt_logprob": planted - 0.25}).decode()}
        payload = body(False, stream=False, prompt=prompt, **ASKED)
        status, raw = await post(session, url, payload, chat=False, headers=header)
        assert status == 200
        _prompt_report(orjson.loads(raw), prompt, planted - 0.25)
        # Without return_token_ids the logprobs come alone; without either field nothing is added.
        status, raw = await post(session, url, body(False, stream=False, prompt_logprobs=0), chat=False)
        choice = orjson.loads(raw)["choices"][0]
        assert len(choice["prompt_logprobs"]) == len(PROMPT.split()) and "prompt_token_ids" not in choice
        status, raw = await post(session, url, body(False, stream=False), chat=False)
        assert {"prompt_logprobs", "prompt_token_ids", "token_ids"}.isdisjoint(orjson.loads(raw)["choices"][0])

    run(profile, check)


def test_prompt_logprobs_refusals_as_vllm_answers_them() -> None:
    """Streamed, prompt logprobs above 0 are a 400 in vLLM 0.32; 0 is accepted and the stream carries none."""

    async def check(url: str, session: aiohttp.ClientSession) -> None:
        status, raw = await post(session, url, body(False, prompt_logprobs=1), chat=False)
        assert status == 400
        assert orjson.loads(raw)["error"]["message"] == "`prompt_logprobs` are not available when `stream=True`."
        status, raw = await post(session, url, body(False, prompt_logprobs=-1), chat=False)
        assert status == 400 and b"stream=True" in raw
        status, raw = await post(session, url, body(False, prompt_logprobs=0, return_token_ids=True), chat=False)
        assert status == 200
        chunks = [e for e in events(raw) if isinstance(e, dict)]
        assert chunks and all("prompt_logprobs" not in c.get("choices", [{}])[0] for c in chunks if c["choices"])
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).split() == [f"w{i}" for i in range(4)]
        for bad, message in ((-2, "must be a positive value or -1"), ("0", "must be an integer"),
                             (1, "prompt_logprobs 0 (each prompt token's own logprob) only")):  # fmt: skip
            status, raw = await post(session, url, body(False, stream=False, prompt_logprobs=bad), chat=False)
            assert status == 400 and message in orjson.loads(raw)["error"]["message"], (bad, raw)

    run("vllm", check)


def test_prompt_logprobs_are_vllms_alone() -> None:
    """SGLang's stand-in ignores the fields; TensorRT-LLM's refuses them as unknown, as TensorRT-LLM does."""

    async def sglang(url: str, session: aiohttp.ClientSession) -> None:
        status, raw = await post(session, url, body(False, stream=False, **ASKED), chat=False)
        assert status == 200
        assert {"prompt_logprobs", "prompt_token_ids"}.isdisjoint(orjson.loads(raw)["choices"][0])
        status, _ = await post(session, url, body(False, prompt_logprobs=1), chat=False)
        assert status == 200  # no stream check either: the field means nothing there

    async def trtllm(url: str, session: aiohttp.ClientSession) -> None:
        status, raw = await post(session, url, body(False, stream=False, **ASKED), chat=False)
        assert status == 400 and b"prompt_logprobs" in raw and b"return_token_ids" in raw

    run(SglangProfile(0.0, health_poll_s=0.0), sglang)
    run("trtllm", trtllm)


def test_prompt_logprobs_from_the_server_process_and_its_flag() -> None:
    """Started by argv as a rehearsal starts it: ``--prompt-logprob`` plants the value; ids do not change
    from one process to the next (a perplexity check compares runs)."""
    prompt = "serving frameworks differ in their schedulers"
    payload = orjson.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 2, **ASKED})
    answers = []
    for logprob in (-1.5, -2.75):
        with serve_reference(model=MODEL, profile="vllm", ttft_ms=1, itl_ms=0, prompt_logprob=logprob) as url:
            request = urllib.request.Request(url + "/v1/completions", data=payload, method="POST")
            with urllib.request.urlopen(request) as resp:
                answers.append(orjson.loads(resp.read()))
        _prompt_report(answers[-1], prompt, logprob)
    first, second = (a["choices"][0]["prompt_token_ids"] for a in answers)
    assert first == second


# --- the backend YAMLs against the profiles that stand in for them --------------------------


def _rehearsable() -> list[tuple[str, dict[str, Any]]]:
    specs = [yaml.safe_load(path.read_text()) for path in sorted(BACKENDS.glob("*.yaml"))]
    return [(spec["name"], spec) for spec in specs if spec.get("rehearsal_profile")]


@pytest.mark.parametrize(("name", "spec"), _rehearsable(), ids=[name for name, _ in _rehearsable()])
def test_every_scraped_name_and_path_exists_in_the_profile(name: str, spec: dict[str, Any]) -> None:
    """A YAML metric name the profile lacks would read 'unknown' in every rehearsal report.

    The server speculates: the frameworks register (or first increment) their draft counters
    only then, and the YAMLs map those too.
    """

    async def check(url: str, session: aiohttp.ClientSession) -> None:
        await post(session, url, body(False), chat=False)  # counters appear once something ran
        async with session.get(url + spec["health"]["path"]) as resp:
            assert resp.status == 200
        names = spec["metrics"]["names"]
        wanted = [part.strip() for native in names.values() for part in native.split("+")]
        lazy = {part.strip() for n in spec["metrics"].get("lazy", []) for part in names[n].split("+")}
        _, values = await metrics(session, url + spec["metrics"]["path"])
        # Before any cache hit only the names the YAML marks lazy may be missing (SGLang's hit counter).
        assert {n for n in wanted if n not in values} <= lazy
        if name == "sglang":  # 0.5.23 creates it at the first hit: the stand-in must not export it before
            assert "sglang:cached_tokens_total" not in values
        await post(session, url, body(False), chat=False)  # the same prompt again: a cache hit
        _, values = await metrics(session, url + spec["metrics"]["path"])
        # After the hit, only lazy counters of events that did not happen (a retraction) may be missing.
        hit_counters = {"sglang:cached_tokens_total", "vllm:prefix_cache_hits_total"}
        assert {n for n in wanted if n not in values} <= lazy - hit_counters
        if name == "sglang":  # no retraction yet: 0.5.23 binds the counter's labels at the first one
            assert "sglang:num_retracted_requests_total" not in values
        stats = spec["metrics"].get("iteration_stats")
        if stats:
            async with session.get(url + stats["path"]) as resp:
                last = (await resp.json())[-1]
            for dotted in stats["fields"].values():
                value: Any = last
                for key in dotted.split("."):
                    value = value[key]

    run(make_profile(spec["rehearsal_profile"], warmup_s=0.0), check, SPECULATING)
