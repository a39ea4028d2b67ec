"""The framework profiles of the reference server, and the registry that picks one by name.

``python -m bakeoff.ref.server --profile vllm`` (or ``serve_reference(profile="vllm")``) answers
as that framework's pinned version does on the wire, so a rehearsal exercises bakeoff's GPU
path (probes, request bodies, stream parsing, scrapes, cache resets) against each framework's
actual quirks. What a profile controls is described in :mod:`bakeoff.ref.wire`; timing and
faults stay :class:`bakeoff.ref.options.RefOptions`. Facts were read from each framework's
released code; where the exact pinned version could not be read, the table names the source.

What each profile reproduces, and where the fact comes from (paths in the framework's repo):

======= ===================================================================== ================================
profile reproduces                                                            source
======= ===================================================================== ================================
generic bakeoff's own server: every quirk switchable per request (RefOptions) this repository
vllm    0.33.0. /health 200, empty body, once up (nothing listens before)     entrypoints/openai/api_server.py
vllm    role-only first chat chunk {"role": "assistant", "content": ""}; no   openai/chat_completion/serving.py
        empty first chunk on completions; logprobs/finish_reason null         openai/completion/serving.py
vllm    usage in a final ``choices: []`` chunk; prompt_tokens_details         _make_prompt_tokens_details
        .cached_tokens also when 0 (YAML passes --enable-prompt-tokens-details)
vllm    wrong ``model`` -> 404 NotFoundError; unknown fields accepted         serving.py _check_model
vllm    vllm: metrics, labels model_name and engine; 16-token blocks, the     v1/metrics/loggers.py,
        last prompt token never a hit                                         v1/core/kv_cache_manager.py
vllm    POST /reset_prefix_cache: 200 {"success": false} while running       serve/dev/cache/api_router.py,
        requests hold blocks (unless ?reset_running_requests=true), else      DESIGN.md "Protocol quirks"
        clears, {"success": true}
sglang  0.5.23. /health (= /health_generate) 503 until the warm-up request    srt/entrypoints/http_server.py
        is done, then 200 after its probe generation (polled each second)
sglang  chunks dumped with every null field ("usage": null, matched_stop);    entrypoints/openai/serving_chat.py
        role-only first chat chunk; the chat finish reason in a chunk of its
        own with an empty (all-null) delta
sglang  several tokens per chunk: every 10th chunk carries one more token     DESIGN.md (29-31 chunks for 32
                                                                              tokens seen on CPU)
sglang  usage.prompt_tokens_details.cached_tokens always, 0 included          openai/usage_processor.py
sglang  sglang: counters cached_tokens_total (from the first hit on),        srt/metrics/collector.py,
        num_retracted_requests_total (from the first retraction on),
        prompt_tokens_total...;                                               observability/metrics_collector.py
        gauges cache_hit_rate (last prefill only), token_usage,
        num_running_reqs, num_queue_reqs
sglang  /flush_cache (GET, POST): 400 while requests run, else clears; both   http_server.py flush_cache
        answer SGLang's text; radix cache at token granularity (page size 1)
trtllm  1.3.0rc, PyTorch flow. /health 200 empty                              tensorrt_llm/serve/openai_server.py
trtllm  unknown request fields (and stream_options without stream) -> 400     serve/openai_protocol.py,
        {"error": "<validation errors>"} naming the field: extra="forbid"     read at a 2026 main commit (field
                                                                              lists: a superset of 1.3.0rc)
trtllm  chat role chunk {"role": "assistant"} without content, written with   serve/postprocess_handlers.py
        a trailing space; chat chunks without nulls, completions chunks
        with every null; stream_options {} alone turns usage on; usage
        always carries prompt_tokens_details
trtllm  /metrics: JSON iteration stats, drained by each GET (kvCacheStats     openai_server.py
        .reusedBlocks, cumulative); Prometheus at /prometheus/metrics with    metrics/collector.py
        trtllm_ names, labels model_name/engine_type "undefined"
trtllm  no cache-reset endpoint (404); 32-token blocks                        llmapi/llm_args.py KvCacheConfig
vllm    reasoning (``reasoning_tokens``) in delta ``reasoning``, copied into    engine/protocol.py DeltaMessage
        the deprecated ``reasoning_content``; no reasoning count in usage     (read at commit 040a2cc),
                                                                              UsageInfo
sglang  reasoning in delta ``reasoning_content``; usage.reasoning_tokens      openai/protocol.py DeltaMessage,
        (top level) counts it                                                 UsageInfo
trtllm  reasoning in delta ``reasoning_content`` (``content`` absent:         serve/openai_protocol.py,
        exclude_none); no reasoning count in usage                            UsageInfo
vllm    speculating (``spec_tokens``): counters spec_decode_num_drafts,       v1/spec_decode/metrics.py
        _num_draft_tokens, _num_accepted_tokens; registered only then
sglang  gauges spec_accept_length, spec_accept_rate (0 when off), counter     observability/
        spec_verify_calls_total from the first verification step on           metrics_collector.py
trtllm  counters trtllm_spec_decode_num_draft_tokens_total and                metrics/collector.py
        _num_accepted_tokens_total (no count of steps), gauge                 (specDecodingStats)
        trtllm_spec_decode_acceptance_length
vllm    non-streamed completions: prompt_logprobs 0 -> choices[0]              completion/protocol.py
        .prompt_logprobs (one entry a prompt token, the first null) and,      check_logprobs, completion/
        with return_token_ids, prompt_token_ids; streamed, prompt_logprobs    serving.py (0.32.0 wheel);
        above 0 -> 400 (bakeoff.ref.logprobs)                                 generic: the same
sglang  prompt_logprobs and return_token_ids ignored (input logprobs come     this repository (not
        through SGLang's own fields, not reproduced)                          reproduced)
trtllm  prompt_logprobs and return_token_ids refused as unknown fields (400)  serve/openai_protocol.py
======= ===================================================================== ================================
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar, Literal, get_args

from aiohttp import web

from bakeoff.ref.cache import Counters
from bakeoff.ref.trtllm import TrtllmProfile
from bakeoff.ref.wire import Handler, Served, WireProfile, exposition, json_response, sse, usage_info

ProfileName = Literal["generic", "vllm", "sglang", "trtllm"]
PROFILES: tuple[str, ...] = get_args(ProfileName)


class VllmProfile(WireProfile):
    name = "vllm"
    owner = "vllm"
    block = 16
    keep_last = True

    def routes(self, served: Served) -> list[tuple[str, str, Handler]]:
        async def health(request: web.Request) -> web.StreamResponse:
            return web.Response(status=200)

        async def metrics(request: web.Request) -> web.StreamResponse:
            return web.Response(text=self.prometheus(served), content_type="text/plain")

        async def reset(request: web.Request) -> web.StreamResponse:
            # vLLM's scheduler refuses to drop blocks that running requests still hold;
            # reset_running_requests preempts them first.
            force = request.query.get("reset_running_requests", "false").lower() == "true"
            if served.counters.held_blocks and not force:
                return json_response({"success": False})
            served.counters.cache.clear()
            return json_response({"success": True})

        return [("GET", "/health", health), ("GET", "/metrics", metrics), ("POST", "/reset_prefix_cache", reset)]

    def check_request(self, body: dict[str, Any], *, chat: bool, model: str) -> web.Response | None:
        if body.get("model") not in (None, model):
            message = f"The model `{body.get('model')}` does not exist."
            error = {"message": message, "type": "NotFoundError", "param": "model", "code": 404}
            return json_response({"error": error}, 404)
        return None

    def error(self, status: int, message: str) -> web.Response:
        kind = "BadRequestError" if status == 400 else "InternalServerError"
        return json_response({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)

    def usage(self, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return usage_info(prompt, completion, cached)

    def opening(self, head: dict[str, Any], *, chat: bool, role_chunk: bool, no_content_key: bool) -> bytes:
        if not chat:
            return b""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return sse({**head, "choices": [choice]})

    def content(self, head: dict[str, Any], *, chat: bool, text: str, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        choice.update({"logprobs": None, "finish_reason": finish})
        if finish is not None or not chat:
            choice["stop_reason"] = None
        return {**head, "choices": [choice]}

    def reasoning(self, head: dict[str, Any], *, text: str) -> dict[str, Any]:
        # DeltaMessage's after-validator copies reasoning into the deprecated reasoning_content.
        delta = {"reasoning": text, "reasoning_content": text}
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}

    def reasoning_usage(self, usage: dict[str, Any], reasoning: int) -> dict[str, Any]:
        return usage  # UsageInfo has no completion_tokens_details: reasoning is not counted

    def prometheus(self, served: Served) -> str:
        c = served.counters
        lab = f'model_name="{served.model}",engine="0"'
        return exposition(
            [
                ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", lab,
                 c.running),
                ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", lab, c.waiting),
                ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", lab, c.kv_usage),
                ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of "
                 "queried tokens.", lab, c.prompt_tokens),
                ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached "
                 "tokens.", lab, c.cache_hits),
                ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", lab, c.prompt_tokens),
                ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", lab,
                 c.generation_tokens),
                ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", lab,
                 c.preemptions),
                ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                 lab + ',finished_reason="length"', c.requests),
                *(vllm_spec_rows(c, lab) if c.speculating else []),
            ]
        )  # fmt: skip


def vllm_spec_rows(c: Counters, lab: str) -> list[tuple[str, str, str, str, float]]:
    """vllm/v1/spec_decode/metrics.py (0.33.0): registered only with a speculative config."""
    return [
        ("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", lab, c.spec_steps),
        ("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", lab, c.spec_proposed),
        ("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", lab,
         c.spec_accepted),
    ]  # fmt: skip


class SglangProfile(WireProfile):
    name = "sglang"
    owner = "sglang"
    block = 1  # RadixAttention matches any token prefix (page size 1)
    keep_last = True
    prompt_logprobs = False  # its input logprobs have fields of their own: not reproduced, ignored
    FLUSH_TEXT: ClassVar[str] = (
        "Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation will not be performed.)\n"
    )

    def __init__(self, warmup_s: float = 0.0, health_poll_s: float = 1.0) -> None:
        super().__init__(warmup_s)
        # health_generate sends a one-token generation, then sleeps a second before it
        # looks for the answer: a healthy SGLang takes about 1 s per /health.
        self.health_poll_s = health_poll_s

    def routes(self, served: Served) -> list[tuple[str, str, Handler]]:
        async def health(request: web.Request) -> web.StreamResponse:
            if time.monotonic() - self.started < self.warmup_s:
                return web.Response(status=503)  # ServerStatus.Starting: warm-up not done
            await asyncio.sleep(self.health_poll_s)
            return web.Response(status=200)

        async def metrics(request: web.Request) -> web.StreamResponse:
            return web.Response(text=self.prometheus(served), content_type="text/plain")

        async def flush(request: web.Request) -> web.StreamResponse:
            if served.counters.running or served.counters.waiting:
                return web.Response(status=400, text=self.FLUSH_TEXT)
            served.counters.cache.clear()
            return web.Response(status=200, text=self.FLUSH_TEXT)

        return [
            ("GET", "/health", health),
            ("GET", "/health_generate", health),
            ("GET", "/metrics", metrics),
            ("GET", "/flush_cache", flush),
            ("POST", "/flush_cache", flush),
        ]

    def chunk_sizes(self, max_tokens: int, per_chunk: int) -> list[int]:
        sizes: list[int] = []
        while sum(sizes) < max_tokens:
            want = per_chunk + 1 if len(sizes) % 10 == 9 else per_chunk
            sizes.append(min(want, max_tokens - sum(sizes)))
        return sizes

    def usage(self, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            # 0.5.23 (usage_processor.py) reports it whenever --enable-cache-report is on,
            # 0 included; 0.5.18 left the details out (null) when nothing was cached.
            "prompt_tokens_details": {"cached_tokens": cached},
            "reasoning_tokens": 0,
        }

    @staticmethod
    def _delta(role: str | None, content: str | None, reasoning: str | None = None) -> dict[str, Any]:
        return {"role": role, "content": content, "reasoning_content": reasoning, "tool_calls": None}

    def reasoning(self, head: dict[str, Any], *, text: str) -> dict[str, Any]:
        choice = {"index": 0, "delta": self._delta(None, None, text), "logprobs": None, "finish_reason": None,
                  "matched_stop": None}  # fmt: skip
        return {**head, "choices": [choice], "usage": None}

    def reasoning_usage(self, usage: dict[str, Any], reasoning: int) -> dict[str, Any]:
        return {**usage, "reasoning_tokens": reasoning}

    def opening(self, head: dict[str, Any], *, chat: bool, role_chunk: bool, no_content_key: bool) -> bytes:
        if not chat:
            return b""
        choice = {"index": 0, "delta": self._delta("assistant", ""), "logprobs": None, "finish_reason": None,
                  "matched_stop": None}  # fmt: skip
        return sse({**head, "choices": [choice], "usage": None})

    def content(self, head: dict[str, Any], *, chat: bool, text: str, finish: str | None) -> dict[str, Any]:
        if chat:
            # The finish reason comes in a chunk of its own (closing).
            choice = {"index": 0, "delta": self._delta(None, text), "logprobs": None, "finish_reason": None,
                      "matched_stop": None}  # fmt: skip
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        return {**head, "choices": [choice], "usage": None}

    def closing(self, head: dict[str, Any], *, chat: bool, finish: str = "length") -> bytes:
        if not chat:
            return b""
        choice = {"index": 0, "delta": self._delta(None, None), "logprobs": None, "finish_reason": finish,
                  "matched_stop": None}  # fmt: skip
        return sse({**head, "choices": [choice], "usage": None})

    def prometheus(self, served: Served) -> str:
        c = served.counters
        lab = f'model_name="{served.model}"'
        return exposition(
            [
                ("sglang:num_running_reqs", "gauge", "The number of running requests.", lab, c.running),
                ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", lab, c.waiting),
                ("sglang:token_usage", "gauge", "The token usage.", lab, c.kv_usage),
                ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", lab, c.last_hit_rate),
                ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", lab, c.prompt_tokens),
                ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", lab,
                 c.generation_tokens),
                # Created at the first cache hit (0.5.23 observability/metrics_collector.py): absent before.
                *([("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.", lab, c.cache_hits)]
                  if c.cache_hits else []),
                ("sglang:num_requests_total", "counter", "Number of requests processed.", lab, c.requests),
                # Its labels are bound at the first retraction (increment_retracted_reqs): absent before.
                *([("sglang:num_retracted_requests_total", "counter", "Total number of retracted requests.", lab,
                    c.preemptions)] if c.preemptions else []),
                # Gauges of the last logging interval, exported (0) with speculation off too; the
                # counter of verification steps appears with the first one (observability/metrics_collector.py).
                ("sglang:spec_accept_length", "gauge", "Mean acceptance length of speculative decoding (accepted "
                 "drafts + bonus token per forward).", lab, c.last_accept_length),
                ("sglang:spec_accept_rate", "gauge", "Speculative acceptance rate (`accepted drafts / proposed "
                 "drafts` in batch).", lab, c.last_accept_rate),
                *([("sglang:spec_verify_calls_total", "counter", "Number of speculative decoding verification "
                    "calls.", lab, c.spec_steps)] if c.spec_steps else []),
            ]
        )  # fmt: skip


_PROFILES: dict[str, type[WireProfile]] = {p.name: p for p in (WireProfile, VllmProfile, SglangProfile, TrtllmProfile)}
DEFAULT_WARMUP_S: dict[str, float] = {"sglang": 0.5}  # the rest answer nothing before they are up


def make_profile(name: str, warmup_s: float | None = None) -> WireProfile:
    if name not in _PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {name!r}")
    warmup = DEFAULT_WARMUP_S.get(name, 0.0) if warmup_s is None else warmup_s
    if warmup < 0:
        raise ValueError(f"warmup_s must be 0 or more, got {warmup}")
    return _PROFILES[name](warmup)
