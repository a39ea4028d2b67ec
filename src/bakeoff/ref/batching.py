"""A planted load model for the reference server: timing that answers to serving knobs.

The reference server's plain schedule (``ttft_ms``, then a chunk every ``itl_ms``) ignores
load, which is right for testing measurement and wrong for testing a *tuner*: a tuner needs
knobs whose effect it can be graded on. These options plant known, deliberately simple
effects (a caricature of a batching scheduler, not a model of any framework):

================================ ============================================================
option                           planted effect
================================ ============================================================
``slots`` (N, 0: unlimited)      at most N requests are served at once; the rest wait in
                                 arrival order and their TTFT includes the wait (the
                                 ``waiting`` gauge counts them)
``itl_per_running_ms``           each decode gap grows by this for every *other* request
                                 running at that moment: TPOT grows with the batch in flight
``token_budget`` (B, 0: off)     a prompt of P words is prefilled in ceil(P / B) steps
``prefill_step_ms``              the time of one prefill step: a small budget costs TTFT
``itl_per_budget_token_ms``      each decode gap grows by this per token of budget: a large
                                 budget (big steps beside the decodes) costs TPOT
``garble``                       canned answers come back wrong: a configuration that is
                                 fast and broken, for quality gates
================================ ============================================================

With the budget effects both set, the latency of a request falls and then rises with B,
so the best budget is inside its range; with slots below the concurrency requests queue.
The server reads ``slots`` from its own options (it is one scheduler); the rest may also be
overridden per request like every option.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Protocol


class _Timed(Protocol):
    @property
    def ttft_ms(self) -> float: ...
    @property
    def itl_ms(self) -> float: ...
    @property
    def itl_per_running_ms(self) -> float: ...
    @property
    def token_budget(self) -> int: ...
    @property
    def prefill_step_ms(self) -> float: ...
    @property
    def itl_per_budget_token_ms(self) -> float: ...


class _Gauges(Protocol):
    running: int
    waiting: int


def first_token_ms(opts: _Timed, prompt_words: int) -> float:
    """TTFT once a request holds a slot: the base plus its prefill steps."""
    steps = math.ceil(max(prompt_words, 1) / opts.token_budget) if opts.token_budget > 0 else 1
    return opts.ttft_ms + steps * opts.prefill_step_ms


def gap_ms(opts: _Timed, running: int) -> float:
    """One decode gap, ``running`` requests being served (this one among them)."""
    return (
        opts.itl_ms
        + opts.itl_per_running_ms * max(running - 1, 0)
        + opts.itl_per_budget_token_ms * max(opts.token_budget, 0)
    )


class Slots:
    """``slots`` requests served at once, the rest waiting in arrival order (0: no limit)."""

    def __init__(self, slots: int) -> None:
        if slots < 0:
            raise ValueError(f"slots must be 0 (unlimited) or more, got {slots}")
        self._free = asyncio.Semaphore(slots) if slots else None

    @contextlib.asynccontextmanager
    async def held(self, gauges: _Gauges) -> AsyncIterator[bool]:
        """Hold a slot for the body; yields whether the request had to wait for it."""
        if self._free is None:
            yield False
            return
        waited = self._free.locked()
        gauges.waiting += 1
        try:
            await self._free.acquire()
        finally:
            gauges.waiting -= 1
        try:
            yield waited
        finally:
            self._free.release()
