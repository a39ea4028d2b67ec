"""Mooncake-style block ids for the synthetic sample traces (scripts/make-traces.py and
scripts/make-mooncake-agent-trace.py import it from beside them).

Mooncake's release hashes prompts by block: block j of a prompt gets the id of its whole
prefix up to that block's end (a partial last block gets its own id), new prefixes taking
the next integer, so equal ids mean equal prefixes. A prompt is written as segments, runs
of text that only ever appear whole: ``(segment id, tokens)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Segment = tuple[int, int]  # (segment id, tokens)


def block_ids(prompts: Iterable[Sequence[Segment]], block_size: int) -> list[list[int]]:
    """One id per block of each prompt, in order: the id of the prompt's whole prefix up to that block's end."""
    ids: dict[tuple[Segment, ...], int] = {}
    out = []
    for segments in prompts:
        length = sum(n for _, n in segments)
        row = []
        for block_end in range(block_size, length + block_size, block_size):
            end = min(block_end, length)
            prefix, used = [], 0
            for segment, tokens in segments:
                take = min(tokens, end - used)
                if take <= 0:
                    break
                prefix.append((segment, take))
                used += take
            row.append(ids.setdefault(tuple(prefix), len(ids)))
        out.append(row)
    return out
