"""The reference server's simulated serving state: a prefix cache and the counters fed from it.

Every wire profile (:mod:`bakeoff.ref.profiles`) reads the same :class:`Counters` and exposes
them under its framework's metric names, so a hit counted here shows up as
``vllm:prefix_cache_hits_total``, ``sglang:cached_tokens_total`` or TensorRT-LLM's reused
blocks alike. The cache works on whitespace-separated words, the reference server's tokens.

Granularity differs per framework, and it changes what a campaign's designed reuse turns
into, so it is a parameter:

- ``block``: tokens per cache block. Only whole blocks are reused (vLLM: 16-token blocks;
  TensorRT-LLM: ``tokens_per_block`` 32; SGLang's radix cache: page size 1, any prefix).
- ``keep_last``: the last prompt token is always computed, never a hit (vLLM caps a hit at
  ``num_tokens - 1``, SGLang's ``max_prefix_len = input_len - 1``, TensorRT-LLM likewise),
  so a repeated prompt of exactly 32 tokens hits 16 on vLLM, not 32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bakeoff.ref.speculation import Drafts

KV_CAPACITY_BLOCKS = 4096  # the pretend KV pool that usage gauges are a fraction of


class PrefixCache:
    """Chained block hashes: a block hits only when every block before it hit too."""

    def __init__(self, block: int, *, keep_last: bool, enabled: bool = True) -> None:
        if block < 1:
            raise ValueError("cache block size must be at least 1")
        self.block = block
        self.keep_last = keep_last
        self.enabled = enabled  # off: a server started with prefix caching disabled
        self._blocks: set[int] = set()

    def lookup(self, words: list[str]) -> int:
        """Cached tokens of this prompt; its blocks are cached from now on."""
        if not self.enabled:
            return 0
        usable = len(words) - 1 if self.keep_last else len(words)
        hits, key, leading = 0, 0, True
        for start in range(0, len(words) - self.block + 1, self.block):
            key = hash((key, *words[start : start + self.block]))
            if leading and key in self._blocks and start + self.block <= usable:
                hits += self.block
            else:
                leading = False
                self._blocks.add(key)
        return hits

    def clear(self) -> None:
        self._blocks.clear()


def blocks_for(tokens: int, block: int) -> int:
    return -(-tokens // block)


@dataclass
class Counters:
    """Serving counters since start; gauges describe the moment they are read."""

    cache: PrefixCache
    running: int = 0
    waiting: int = 0  # the reference server never queues, but every framework exports it
    preemptions: int = 0  # nor does it run out of KV cache and preempt; exported all the same
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cache_hits: int = 0  # prompt tokens served from the cache
    reused_blocks: int = 0
    missed_blocks: int = 0
    last_hit_rate: float = 0.0  # of the last prefill (SGLang's cache_hit_rate gauge)
    held_blocks: int = 0  # KV blocks of running requests: what a reset cannot free
    peak_running: int = 0
    # Speculative decoding (bakeoff.ref.speculation), counted as requests finish; a profile
    # exposes these only when the server was started speculating, as the frameworks do.
    speculating: bool = False
    spec_steps: int = 0  # verification steps (vLLM's drafts, SGLang's verify calls)
    spec_proposed: int = 0  # draft tokens proposed
    spec_accepted: int = 0  # draft tokens accepted
    # Of the last finished request: SGLang's gauges cover the last logging interval only.
    last_accept_length: float = 0.0
    last_accept_rate: float = 0.0
    _held: dict[int, int] = field(default_factory=dict)

    def admit(self, key: int, words: list[str], max_tokens: int) -> int:
        """Count one arriving request's prefill; return its cached tokens."""
        hits = self.cache.lookup(words)
        block = self.cache.block
        total_blocks = blocks_for(len(words), block)
        self.prompt_tokens += len(words)
        self.cache_hits += hits
        self.reused_blocks += hits // block
        self.missed_blocks += total_blocks - hits // block
        self.last_hit_rate = hits / len(words) if words else 0.0
        self._held[key] = blocks_for(len(words) + max_tokens, block)
        self.held_blocks += self._held[key]
        self.running += 1
        self.peak_running = max(self.peak_running, self.running)
        return hits

    def release(self, key: int, *, generated: int, finished: bool, drafts: Drafts | None = None) -> None:
        """The request left (finished or failed): its blocks are free again."""
        self.held_blocks -= self._held.pop(key, 0)
        self.running -= 1
        if finished:
            self.requests += 1
            self.generation_tokens += generated
            if drafts is not None and drafts.steps:
                self.spec_steps += drafts.steps
                self.spec_proposed += drafts.proposed
                self.spec_accepted += drafts.accepted
                self.last_accept_length = 1 + drafts.accepted / drafts.steps
                self.last_accept_rate = drafts.accepted / drafts.proposed if drafts.proposed else 0.0

    @property
    def kv_usage(self) -> float:
        return min(self.held_blocks / KV_CAPACITY_BLOCKS, 1.0)

    @property
    def hit_rate(self) -> float:
        """Cumulative block hit rate, as TensorRT-LLM's ``cacheHitRate``."""
        looked_up = self.reused_blocks + self.missed_blocks
        return self.reused_blocks / looked_up if looked_up else 0.0
