"""The measured window of a run, derived from its request records alone.

A closed loop at concurrency N ramps up (the first N starts, staggered), holds N requests
in flight, then drains (each worker stops once the level has enough). Only the middle is
steady state, as MLPerf and GuideLLM measure it:

- it starts at the last of the N workers' first starts: from there every slot is busy;
- it ends at the first end that no new start followed: from there fewer than N are in flight.

Requests that started and ended inside count for latency; rates count what completed inside
(requests by their end, output tokens by their chunk arrival). Every bound comes from the
records' ``slot``, ``start_ns`` and ``end_ns``, so ``records.parquet`` recomputes it offline,
and the load generator stops a level by the same definition (:class:`WindowTracker`).
Runs without slots (open loop, sessions, older records) are measured first send -> last end.
"""

from __future__ import annotations

from dataclasses import dataclass

from bakeoff.results.records import RequestRecord


@dataclass(frozen=True)
class Bounds:
    """A window in ``perf_counter_ns`` time, and the concurrency it was held at (0: not a closed loop)."""

    start_ns: int
    end_ns: int
    concurrency: int = 0

    @property
    def seconds(self) -> float:
        return max(self.end_ns - self.start_ns, 1) / 1e9

    def inside(self, r: RequestRecord) -> bool:
        return r.start_ns >= self.start_ns and r.end_ns <= self.end_ns

    def ended_inside(self, r: RequestRecord) -> bool:
        return self.start_ns <= r.end_ns <= self.end_ns


def whole_run(measured: list[RequestRecord]) -> Bounds:
    """First send (or scheduled send) -> last end: the window of runs that have no steady state."""
    if not measured:
        return Bounds(0, 0)
    start = min(min(r.start_ns, r.scheduled_ns or r.start_ns) for r in measured)
    return Bounds(start, max(r.end_ns for r in measured))


def steady_bounds(measured: list[RequestRecord]) -> Bounds | None:
    """The steady-state window of a closed loop; None for runs whose records carry no slot."""
    slotted = [r for r in measured if r.slot >= 0]
    if not slotted:
        return None
    first_start: dict[int, int] = {}
    for r in slotted:
        first_start[r.slot] = min(first_start.get(r.slot, r.start_ns), r.start_ns)
    start = max(first_start.values())
    last_start = max(r.start_ns for r in slotted)
    # The first end after the last start was not replaced: the drain begins there.
    end = min(r.end_ns for r in slotted if r.end_ns > last_start)
    return Bounds(start, end, len(first_start))


class WindowTracker:
    """The load generator's running view of the window, to stop a level once it holds enough.

    ``started`` is told each slot's first start, ``finished`` each completed request; ``enough``
    says whether ``min_requests`` ended inside the window and it lasted ``min_duration_s``.
    """

    def __init__(self, concurrency: int, min_requests: int, min_duration_s: float) -> None:
        self.concurrency = concurrency
        self.min_requests = min_requests
        self.min_duration_ns = int(min_duration_s * 1e9)
        self._first_starts: dict[int, int] = {}
        self.inside = 0

    @property
    def start_ns(self) -> int | None:
        if len(self._first_starts) < self.concurrency:
            return None
        return max(self._first_starts.values())

    def started(self, slot: int, start_ns: int) -> None:
        self._first_starts.setdefault(slot, start_ns)

    def finished(self, r: RequestRecord) -> None:
        start = self.start_ns
        if start is not None and r.start_ns >= start:
            self.inside += 1

    def enough(self, now_ns: int) -> bool:
        start = self.start_ns
        if start is None:
            return False
        return self.inside >= self.min_requests and now_ns - start >= self.min_duration_ns
