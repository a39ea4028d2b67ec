"""The format-independent trace row, and the prefix reuse its block ids design.

Every format parses into :class:`TraceRow`: an arrival offset, prompt and output lengths,
and (Mooncake, bakeoff) the ids of the prompt's blocks. Block ``j`` of a prompt holds tokens
``j*block_size .. (j+1)*block_size`` and equal ids at equal positions after equal ids mean
identical tokens: a prefix cache can reuse exactly the leading blocks an earlier request
already sent. :func:`reused_tokens` computes that from the ids alone, the way a perfect
prefix cache with one-token granularity would see the plan; the report sets it beside what
the server says it reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace, as read (arrival not yet scaled)."""

    line: int  # 1-based line of the file it came from, for messages
    at_s: float  # seconds after the trace's first request
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()  # prefix block ids, block_size tokens each (last may be partial)
    session: str = ""


@dataclass(frozen=True)
class LoadedTrace:
    """A trace after filters and the window, rebased so its first request arrives at 0."""

    source: Path
    format: str
    block_size: int  # tokens per block id; 0 when the format has no block ids
    rows: tuple[TraceRow, ...]
    rows_in_file: int
    left_out: dict[str, int] = field(default_factory=dict)  # why rows were dropped -> how many
    sha256: str = ""

    @property
    def span_s(self) -> float:
        return self.rows[-1].at_s - self.rows[0].at_s if self.rows else 0.0


def block_tokens(prompt_tokens: int, blocks: Sequence[int], block_size: int) -> list[int]:
    """Tokens each listed block contributes to a prompt of ``prompt_tokens`` (last may be partial).

    Ids beyond the prompt's length contribute nothing; tokens beyond the ids are unique text.
    """
    out = []
    for j in range(len(blocks)):
        take = min(block_size, prompt_tokens - j * block_size)
        if take <= 0:
            break
        out.append(take)
    return out


def reused_tokens(requests: Sequence[tuple[int, Sequence[int]]], block_size: int) -> list[int]:
    """Prompt tokens of each request (in send order) that repeat a prefix sent before it.

    ``requests``: (prompt tokens, block ids) per request. A trie over block-id paths keeps,
    per node, how many tokens of that block earlier requests sent (a partial last block
    sends fewer); a request reuses each leading block as far as an earlier one covered it,
    and stops at the first block that was new or not covered in full.
    """
    children: dict[tuple[int, int], int] = {}
    covered: list[int] = [0]  # node 0 is the root
    reused = []
    for prompt, blocks in requests:
        sizes = block_tokens(prompt, blocks, block_size)
        node, total, matching = 0, 0, True
        for block, size in zip(blocks, sizes, strict=False):
            key = (node, block)
            child = children.get(key)
            if child is None:
                child = children[key] = len(covered)
                covered.append(0)
            if matching:
                seen = covered[child]
                total += min(seen, size)
                matching = seen >= size == block_size
            covered[child] = max(covered[child], size)
            node = child
        reused.append(total)
    return reused


def reuse_share(requests: Sequence[tuple[int, Sequence[int]]], block_size: int) -> float | None:
    """Share of all prompt tokens that repeat an earlier prefix; None without requests.

    Without block ids every prompt is unique text, so the share is 0 by construction.
    """
    total = sum(prompt for prompt, _ in requests)
    if not total:
        return None
    if block_size <= 0:
        return 0.0
    return sum(reused_tokens(requests, block_size)) / total


def cache_block_reuse(requests: Sequence[tuple[int, Sequence[int]]], block_size: int, cache_block: int) -> float | None:
    """Share of prompt tokens a cache of ``cache_block``-token blocks can reuse, from ids of ``block_size``.

    Caches reuse whole blocks only, so each request's reused prefix (:func:`reused_tokens`) is
    cut down to whole cache blocks. At ``cache_block == block_size`` that is exact. A coarser
    cache block (a multiple of it) is reused only when every id inside it matched, which the
    cut gives exactly. A finer one can do better than the ids show: the first id that differs
    may still share its leading tokens, which the ids cannot tell, so the figure is a lower bound.
    """
    total = sum(prompt for prompt, _ in requests)
    if not total:
        return None
    if block_size <= 0:
        return 0.0
    reused = reused_tokens(requests, block_size)
    return sum(n // cache_block * cache_block for n in reused) / total


SHARING_CLASSES = ("unshared", "shared<50%", "shared>=50%")


def sharing_class(reused: int, prompt_tokens: int) -> str:
    """A request's prefix-sharing class, by the share of its prompt an earlier one sent."""
    if reused <= 0 or prompt_tokens <= 0:
        return SHARING_CLASSES[0]
    return SHARING_CLASSES[1] if reused / prompt_tokens < 0.5 else SHARING_CLASSES[2]
