"""Planted speculative decoding for the reference server: several tokens a step, counted like a framework.

With ``spec_tokens`` K above 0 the reference server decodes the way a speculating engine
streams: the prefill yields the first token (at ``ttft_ms``, no draft involved), then every
decode step (one ``itl_ms`` gap, as without speculation) proposes K draft tokens, accepts
some of them and emits them together with the target model's own token, in one SSE chunk.

Acceptance is planted, not sampled, so a test knows every figure: ``spec_accept`` P (0 to 1)
is spread evenly over the steps of a request, so that after ``s`` steps exactly
``floor(s * K * P)`` drafts have been accepted (P = 0.375, K = 4: 1, 2, 1, 2, ... a step).
The last step is cut to what ``max_tokens`` leaves, and only the tokens it emits count as
accepted. Every completion token is then the prefill's, a step's own, or an accepted draft:
``completion = 1 + steps + accepted``, the identity SGLang's counters are read with.

:class:`Drafts` is what a request adds to the counters each profile exposes under its
framework's names (:mod:`bakeoff.ref.profiles`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Keeps floor(s * K * P) exact where s * K * P is a whole number short by a rounding error.
_EPS = 1e-9


@dataclass(frozen=True)
class Drafts:
    """One request's speculation: verification steps, draft tokens proposed, drafts accepted."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0


def accepted_after(steps: int, spec_tokens: int, spec_accept: float) -> int:
    """Drafts accepted over the first ``steps`` verification steps."""
    return math.floor(steps * spec_tokens * spec_accept + _EPS)


def step_sizes(tokens: int, spec_tokens: int, spec_accept: float) -> tuple[list[int], Drafts]:
    """Tokens per chunk of a ``tokens``-long answer, and what its steps proposed and accepted."""
    if tokens < 1:
        return [], Drafts()
    sizes, sent, step, accepted = [1], 1, 0, 0
    while sent < tokens:
        step += 1
        wanted = accepted_after(step, spec_tokens, spec_accept) - accepted_after(step - 1, spec_tokens, spec_accept)
        size = min(1 + wanted, tokens - sent)
        sizes.append(size)
        sent += size
        accepted += size - 1
    return sizes, Drafts(steps=step, proposed=step * spec_tokens, accepted=accepted)


def split_at(sizes: list[int], boundary: int) -> tuple[list[int], list[int]]:
    """Chunk sizes before and after token ``boundary``; a step across it becomes two chunks."""
    before: list[int] = []
    after: list[int] = []
    start = 0
    for size in sizes:
        if start + size <= boundary:
            before.append(size)
        elif start >= boundary:
            after.append(size)
        else:
            before.append(boundary - start)
            after.append(start + size - boundary)
        start += size
    return before, after
