"""The reference server's ``trtllm`` profile: TensorRT-LLM 1.3.0rc's wire behaviour.

See the table in :mod:`bakeoff.ref.profiles` for everything it reproduces; the request
validation is the part worth its own words.

trtllm-serve's OpenAI request models derive from ``OpenAIBaseModel``
(``ConfigDict(extra="forbid")``), so a field it does not know is an HTTP 400 before any
generation, where vLLM and SGLang ignore it. These are the field names of
``CompletionRequest``, ``ChatCompletionRequest`` and ``StreamOptions`` in
``tensorrt_llm/serve/openai_protocol.py`` (NVIDIA/TensorRT-LLM; read at a 2026 commit of
main, a superset of the 1.3.0rc lists: the fields bakeoff sends are in both). Chat's
``max_completion_tokens`` is also accepted under its alias ``max_tokens``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, ClassVar

import orjson
from aiohttp import web

from bakeoff.ref.cache import KV_CAPACITY_BLOCKS, Counters
from bakeoff.ref.wire import Handler, Served, WireProfile, exposition, json_response, usage_info

_SAMPLING = frozenset(
    {
        "best_of", "use_beam_search", "top_k", "top_p_min", "min_p", "repetition_penalty", "length_penalty",
        "early_stopping", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
        "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "lora_request",
        "thinking_token_budget", "prompt_ignore_length", "add_special_tokens", "response_format",
        "disaggregated_params", "priority", "conversation_params", "echo",
    }
)  # fmt: skip
TRTLLM_COMPLETION_FIELDS = _SAMPLING | {
    "model", "prompt", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
    "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    "return_context_logits", "detokenize",
}  # fmt: skip
TRTLLM_CHAT_FIELDS = _SAMPLING | {
    "messages", "prompt_token_ids", "prompt_token_ids_b64", "model", "frequency_penalty", "logit_bias",
    "logprobs", "top_logprobs", "max_completion_tokens", "max_tokens", "n", "presence_penalty", "seed", "stop",
    "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "user",
    "reasoning_effort", "thinking", "add_generation_prompt", "documents", "chat_template",
    "chat_template_kwargs", "injected_chat_template_kwargs", "media_io_kwargs", "cache_salt",
    "agent_hierarchy", "mm_processor_kwargs",
}  # fmt: skip
TRTLLM_STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats"})


def _problem(kind: str, loc: tuple[str, ...], msg: str, value: object) -> str:
    return repr({"type": kind, "loc": ("body", *loc), "msg": msg, "input": value})


def validation_error(body: dict[str, Any], known: frozenset[str], model: str) -> str | None:
    """FastAPI's ``str(RequestValidationError)`` for ``body``, or None when it validates.

    Only what bakeoff can get wrong is checked: unknown fields (top level and in
    ``stream_options``), the required ones, and the ``stream_options``-needs-``stream``
    rule TensorRT-LLM adds in a model validator.
    """
    problems = [_problem("extra_forbidden", (k,), "Extra inputs are not permitted", body[k]) for k in body
                if k not in known]  # fmt: skip
    required = ("model", "messages") if "messages" in known else ("model", "prompt")
    problems += [_problem("missing", (k,), "Field required", body) for k in required if k not in body]
    options = body.get("stream_options")
    if isinstance(options, dict):
        problems += [
            _problem("extra_forbidden", ("stream_options", k), "Extra inputs are not permitted", options[k])
            for k in options
            if k not in TRTLLM_STREAM_OPTIONS
        ]
        if options and not body.get("stream"):
            msg = "Value error, Stream options can only be defined when stream is true."
            problems.append(_problem("value_error", (), msg, body))
    if not problems:
        return None
    noun = "error" if len(problems) == 1 else "errors"
    return f"{len(problems)} validation {noun} for {model}:\n" + "".join(f"  {p}\n" for p in problems)


class TrtllmProfile(WireProfile):
    name = "trtllm"
    owner = "tensorrt_llm"
    block = 32  # KvCacheConfig.tokens_per_block
    keep_last = True
    prompt_logprobs = False  # prompt_logprobs and return_token_ids are unknown fields: refused before this
    MAX_ITERATIONS: ClassVar[int] = 1000  # iter_stats_max_iterations: older stats are dropped

    def __init__(self, warmup_s: float = 0.0) -> None:
        super().__init__(warmup_s)
        self.iterations: deque[dict[str, Any]] = deque(maxlen=self.MAX_ITERATIONS)
        self._iter = 0
        self._completed = 0

    def startup_log(self, port: int) -> list[str]:
        """The PyTorch flow's start-up markers in its logger's format (``[MM/DD/YYYY-HH:MM:SS] [TRT-LLM]
        [I] ...``), which bakeoff reads as the flow's build line (bakeoff.serving.trtllm_log); the
        stand-in builds nothing, so the phases take no time."""
        now = time.strftime("%m/%d/%Y-%H:%M:%S")
        logged = [
            "Using LLM with PyTorch backend",
            "[Autotuner] Autotuning process starts ...",
            "[Autotuner] Autotuning process ends",
            "Creating CUDA graph instances for 2 batch sizes.",
            "Run generation only CUDA graph warmup for batch size=2, draft_len=0",
            "Run generation only CUDA graph warmup for batch size=1, draft_len=0",
            "Setting PyTorch memory fraction to 0.9",
        ]
        return [f"[{now}] [TRT-LLM] [I] {text}" for text in logged] + [
            f"INFO:     Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)"
        ]

    def routes(self, served: Served) -> list[tuple[str, str, Handler]]:
        async def health(request: web.Request) -> web.StreamResponse:
            return web.Response(status=200)

        async def iteration_stats(request: web.Request) -> web.StreamResponse:
            drained = list(self.iterations)
            self.iterations.clear()
            return json_response(drained)

        async def prometheus(request: web.Request) -> web.StreamResponse:
            return web.Response(text=self.prometheus(served), content_type="text/plain")

        return [
            ("GET", "/health", health),
            ("GET", "/metrics", iteration_stats),
            ("GET", "/prometheus/metrics", prometheus),
        ]

    def check_request(self, body: dict[str, Any], *, chat: bool, model: str) -> web.Response | None:
        known = TRTLLM_CHAT_FIELDS if chat else TRTLLM_COMPLETION_FIELDS
        message = validation_error(body, known, "ChatCompletionRequest" if chat else "CompletionRequest")
        return None if message is None else json_response({"error": message}, 400)

    def wants_usage(self, stream_options: object) -> bool:
        # StreamOptions.include_usage defaults to True: any stream_options object turns it on.
        return isinstance(stream_options, dict) and stream_options.get("include_usage", True) is not False

    def error(self, status: int, message: str) -> web.Response:
        kind = "BadRequestError" if status == 400 else "InternalServerError"
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return json_response(body, status)

    def usage(self, prompt: int, completion: int, cached: int) -> dict[str, Any]:
        return usage_info(prompt, completion, cached)

    def opening(self, head: dict[str, Any], *, chat: bool, role_chunk: bool, no_content_key: bool) -> bytes:
        if not chat:
            return b""
        # model_dumpjson_response(exclude_none=True): no content key at all; TRT-LLM writes this
        # first event as f"data: {data} \n\n", with a space before the blank line.
        first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        return b"data: " + orjson.dumps(first) + b" \n\n"

    def content(self, head: dict[str, Any], *, chat: bool, text: str, finish: str | None) -> dict[str, Any]:
        if chat:
            # exclude_none: the reasoning delta is "" (not None), so it stays; null fields go.
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text, "reasoning_content": ""}}
            if finish is not None:
                choice["finish_reason"] = finish
            return {**head, "choices": [choice]}
        choice = {"index": 0, "text": text, "token_ids": None, "logprobs": None, "finish_reason": finish,
                  "stop_reason": None, "avg_decoded_tokens_per_iter": None}  # fmt: skip
        return {**head, "choices": [choice], "usage": None}

    def reasoning(self, head: dict[str, Any], *, text: str) -> dict[str, Any]:
        # exclude_none: content is None in a reasoning delta, so only reasoning_content goes out.
        return {**head, "choices": [{"index": 0, "delta": {"reasoning_content": text}}]}

    def reasoning_usage(self, usage: dict[str, Any], reasoning: int) -> dict[str, Any]:
        return usage  # UsageInfo has no reasoning count

    def _log_iteration(self, c: Counters) -> None:
        self._iter += 1
        self.iterations.append(
            {
                "iter": self._iter,
                "iterLatencyMS": 0.0,
                "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
                "numActiveRequests": c.running,
                "numQueuedRequests": c.waiting,
                "numCompletedRequests": self._completed,
                "maxNumActiveRequests": c.peak_running,
                "gpuMemUsage": 0,
                "cpuMemUsage": 0,
                "pinnedMemUsage": 0,
                "kvCacheStats": {
                    "maxNumBlocks": KV_CAPACITY_BLOCKS,
                    "freeNumBlocks": KV_CAPACITY_BLOCKS - c.held_blocks,
                    "usedNumBlocks": c.held_blocks,
                    "tokensPerBlock": self.block,
                    "allocTotalBlocks": c.reused_blocks + c.missed_blocks,
                    "allocNewBlocks": c.missed_blocks,
                    # Cumulative since start, like the KV cache manager's own counters.
                    "reusedBlocks": c.reused_blocks,
                    "missedBlocks": c.missed_blocks,
                    "cacheHitRate": c.hit_rate,
                },
            }
        )
        self._completed = 0

    def on_prefill(self, counters: Counters) -> None:
        self._log_iteration(counters)

    def on_finish(self, counters: Counters) -> None:
        self._completed += 1
        self._log_iteration(counters)

    def prometheus(self, served: Served) -> str:
        c = served.counters
        lab = 'model_name="undefined",engine_type="undefined"'
        return exposition(
            [
                ("trtllm_request_success_total", "counter", "Count of successfully processed requests.",
                 lab + ',finished_reason="length"', c.requests),
                ("trtllm_prompt_tokens_total", "counter", "Cumulative number of prompt (input) tokens processed.",
                 lab, c.prompt_tokens),
                ("trtllm_generation_tokens_total", "counter", "Cumulative number of generation (output) tokens "
                 "produced.", lab, c.generation_tokens),
                ("trtllm_kv_cache_hit_rate", "gauge", "KV cache hit rate", lab, c.hit_rate),
                ("trtllm_kv_cache_reused_blocks_total", "counter", "Cumulative number of KV cache blocks reused "
                 "(cache hits)", lab, c.reused_blocks),
                ("trtllm_kv_cache_missed_blocks_total", "counter", "Cumulative number of KV cache blocks missed "
                 "(cache misses)", lab, c.missed_blocks),
                ("trtllm_kv_cache_utilization", "gauge", "KV cache utilization", lab, c.kv_usage),
                ("trtllm_num_requests_running", "gauge", "Number of active requests", lab, c.running),
                ("trtllm_num_requests_waiting", "gauge", "Number of queued requests", lab, c.waiting),
                *(self._spec_rows(c, lab) if c.speculating else []),
            ]
        )  # fmt: skip

    @staticmethod
    def _spec_rows(c: Counters, lab: str) -> list[tuple[str, str, str, str, float]]:
        """metrics/collector.py: from each iteration's specDecodingStats; drafted and accepted
        (the target's own token not counted) only, no count of verification steps."""
        return [
            ("trtllm_spec_decode_num_draft_tokens_total", "counter", "Total number of draft tokens in speculative "
             "decoding", lab, c.spec_proposed),
            ("trtllm_spec_decode_num_accepted_tokens_total", "counter", "Total number of accepted tokens in "
             "speculative decoding", lab, c.spec_accepted),
            ("trtllm_spec_decode_acceptance_length", "gauge", "Acceptance length in speculative decoding", lab,
             c.last_accept_length),
        ]  # fmt: skip
