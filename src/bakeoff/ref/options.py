"""What the reference server is told, and how it keeps time.

:class:`RefOptions` is how one request is answered (timing, chunking, usage, faults), set
on the command line and overridable per request (among them the planted prompt logprob,
:mod:`bakeoff.ref.logprobs`); :class:`Pacer` sleeps to absolute deadlines and
:class:`ServerStats` reports how late each write went out; canned answers map prompts to the
texts the quality checks plant (a rehearsal's stand-in answers its campaign's prompt set
from such a file). The server itself is :mod:`bakeoff.ref.server`.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

import orjson

from bakeoff.ref.cache import Counters

UsageMode = Literal["separate", "finish", "none"]
Fault = Literal["none", "http500", "error", "cut", "stall", "die"]
MODEL = "bakeoff-ref"


@dataclass(frozen=True)
class RefOptions:
    """How one request is answered; every field can be overridden per request."""

    ttft_ms: float = 100.0
    itl_ms: float = 20.0  # gap between content chunks
    tokens_per_chunk: int = 1
    role_chunk: bool = True  # send a role-only first chunk at once, before any content
    content_key_missing: bool = False  # that first chunk has no content key (TensorRT-LLM)
    usage: UsageMode = "separate"
    comments: bool = False  # SSE ': keep-alive' comment lines between events
    fault: Fault = "none"
    fault_every: int = 1  # the fault hits requests N, 2N, 3N... counted per option set
    fault_after: int = -1  # content chunks sent before a mid-stream fault; -1: half of them
    stall_s: float = 3600.0
    long_line_bytes: int = 0  # pad the first content chunk's line to at least this size
    # Stop after this many tokens (0: never), like an EOS id ignore_eos misses, unless the
    # request's min_tokens asks for more: what min_tokens is sent to prevent.
    eos_after: int = 0
    # Chat only: the first N tokens of each answer are reasoning, sent in the profile's
    # reasoning delta field (a reasoning model behind a reasoning parser); then the answer,
    # after a further pause of answer_gap_ms. First reasoning chunk at ttft_ms, first
    # answer chunk at ttft_ms + (reasoning chunks) x itl_ms + answer_gap_ms.
    reasoning_tokens: int = 0
    answer_gap_ms: float = 0.0
    # The planted load model (bakeoff.ref.batching): timing that answers to serving knobs.
    slots: int = 0
    itl_per_running_ms: float = 0.0
    token_budget: int = 0
    prefill_step_ms: float = 0.0
    itl_per_budget_token_ms: float = 0.0
    garble: bool = False
    # Planted speculative decoding (bakeoff.ref.speculation): spec_tokens drafts a decode
    # step (0: off), of which the share spec_accept is accepted, spread evenly over the steps.
    spec_tokens: int = 0
    spec_accept: float = 0.0
    # Planted prompt logprobs (bakeoff.ref.logprobs): the logprob of every prompt token a
    # completions request with prompt_logprobs gets back; perplexity exp(1.5), about 4.48.
    prompt_logprob: float = -1.5
    # Planted drift (a soak's creeping tail): every request's TTFT grows by this many ms per
    # second the server has been up, the way a fragmenting allocator slows a long-lived engine.
    ttft_growth_ms_per_s: float = 0.0

    def __post_init__(self) -> None:
        timed = (self.ttft_ms, self.itl_ms, self.stall_s, self.answer_gap_ms, self.itl_per_running_ms,
                 self.prefill_step_ms, self.itl_per_budget_token_ms, self.ttft_growth_ms_per_s)  # fmt: skip
        if min(timed) < 0:
            raise ValueError(
                "ttft_ms, itl_ms, stall_s, answer_gap_ms, ttft_growth_ms_per_s and the load-model times "
                "must be 0 or more"
            )
        if self.slots < 0 or self.token_budget < 0:
            raise ValueError("slots and token_budget must be 0 (off) or more")
        if self.tokens_per_chunk < 1 or self.fault_every < 1 or self.eos_after < 0 or self.reasoning_tokens < 0:
            raise ValueError(
                "tokens_per_chunk and fault_every must be at least 1, eos_after and reasoning_tokens 0 or more"
            )
        if self.spec_tokens < 0 or not 0.0 <= self.spec_accept <= 1.0:
            raise ValueError("spec_tokens must be 0 (off) or more, spec_accept between 0 and 1")
        if not -1e4 <= self.prompt_logprob <= 0.0:  # also refuses nan: a log-probability is finite and at most 0
            raise ValueError(f"prompt_logprob must be between -10000 and 0, got {self.prompt_logprob}")
        if self.usage not in get_args(UsageMode):
            raise ValueError(f"usage must be one of {get_args(UsageMode)}, got {self.usage!r}")
        if self.fault not in get_args(Fault):
            raise ValueError(f"fault must be one of {get_args(Fault)}, got {self.fault!r}")

    def override(self, changes: object) -> RefOptions:
        if not isinstance(changes, dict):
            raise ValueError("reference-server overrides must be a JSON object")
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown reference-server options: {sorted(unknown)}")
        return replace(self, **changes)


class ServerStats:
    """The reference server's own health as a load source: schedule lateness and chunks sent."""

    def __init__(self) -> None:
        self.pacer = Pacer()
        self.chunks = 0

    def prometheus(self, model: str, counters: Counters) -> str:
        """The generic profile's ``/metrics`` (vLLM-named counters) and, in every profile, ``/ref/metrics``."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        label = f'{{model_name="{model}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", label, counters.running),
            ("vllm:request_success_total", "counter", label, counters.requests),
            ("vllm:prompt_tokens_total", "counter", label, counters.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", label, counters.generation_tokens),
            ("vllm:prefix_cache_queries_total", "counter", label, counters.prompt_tokens),
            ("vllm:prefix_cache_hits_total", "counter", label, counters.cache_hits),
            *(
                [
                    ("vllm:spec_decode_num_drafts_total", "counter", label, counters.spec_steps),
                    ("vllm:spec_decode_num_draft_tokens_total", "counter", label, counters.spec_proposed),
                    ("vllm:spec_decode_num_accepted_tokens_total", "counter", label, counters.spec_accepted),
                ]
                if counters.speculating
                else []
            ),
            ("bakeoff_ref_chunks_total", "counter", "", self.chunks),
            ("bakeoff_ref_late_seconds_total", "counter", "", self.pacer.late_sum_s),
            ("bakeoff_ref_late_seconds_max", "gauge", "", self.pacer.late_max_s),
            ("bakeoff_ref_timer_bias_seconds", "gauge", "", self.pacer.bias_s),
            ("process_cpu_seconds_total", "counter", "", usage.ru_utime + usage.ru_stime),
        ]
        return "".join(f"# TYPE {n} {t}\n{n}{lab} {v}\n" for n, t, lab, v in rows)


class Pacer:
    """Sleeps until absolute deadlines, learning the event loop's timer error.

    Event-loop timers have millisecond granularity (asyncio rounds epoll timeouts up,
    uvloop truncates against a cached clock), so a plain sleep lands up to a millisecond
    off. Aiming each sleep ``bias`` early, ``bias`` being the running mean of that error,
    centres the writes on their deadlines; what remains is reported as lateness.
    """

    GAIN = 0.02
    CLAMP_S = 0.005  # one long deschedule must not swing the mean

    def __init__(self) -> None:
        self.bias_s = 0.0
        self.late_sum_s = 0.0
        self.late_max_s = 0.0

    async def until(self, deadline: float) -> None:
        target = deadline - self.bias_s
        delay = target - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
            error = min(max(time.monotonic() - target, -self.CLAMP_S), self.CLAMP_S)
            self.bias_s += self.GAIN * (error - self.bias_s)
        late = time.monotonic() - deadline
        self.late_sum_s += late
        self.late_max_s = max(self.late_max_s, late)


def canned_key(body: dict[str, Any], *, chat: bool) -> str:
    """What a canned answer is looked up by: the last message's text (chat) or the prompt."""
    if chat:
        messages = body.get("messages") or [{}]
        return str(messages[-1].get("content", ""))
    return str(body.get("prompt", ""))


def load_canned(path: Path) -> dict[str, str]:
    """``--canned FILE``: a JSON object mapping each prompt (see :func:`canned_key`) to its answer."""
    data = orjson.loads(path.read_bytes())
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"--canned {path}: expected a JSON object of prompt -> answer text")
    return {str(k): v for k, v in data.items()}
