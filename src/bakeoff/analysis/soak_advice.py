"""The cure the seed reports for memory that drifts over hours: cap ``max_model_len`` at the workload's need + 20%.

An engine that reserves for the longest context it accepts, while the traffic's requests are
much shorter and of very different lengths, is where the seed saw memory the weights and KV
pool do not explain grow until the process ran out (its fragmentation trap, §6.1). Its cure:
``max_model_len`` at what the workload really needs plus about 20%. This module decides, from
one soak run (:class:`bakeoff.analysis.soak.SoakResult`), whether that cap follows:

- only when the unaccounted memory's trend is **drifting** (its whole interval above the
  margin, :mod:`bakeoff.analysis.drift`): flat, undecided or unmeasured memory proposes nothing;
- the cap is ``ceil(1.2 x`` the longest request the workload can send``)`` (prompt + output,
  :meth:`bakeoff.workloads.base.WorkloadBase.longest_request`);
- not when the server's cap is at or under it already.

:func:`bakeoff.analysis.advisor.advise` turns a :class:`ContextCap` into its ``context`` step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from bakeoff.analysis.soak import UNACCOUNTED, SoakResult, soak_result
from bakeoff.results.layout import CellResult
from bakeoff.workloads.kinds import Soak

HEADROOM = 1.2  # the seed's "real need plus ~20%"


def context_cap(longest_request: int) -> int:
    """``max_model_len`` for a workload whose longest request is ``longest_request`` tokens."""
    return math.ceil(HEADROOM * longest_request)


@dataclass
class ContextCap:
    """The proposed cap, and the trend that calls for it."""

    proposed: int
    reason: str
    evidence: list[str]


def memory_cap(result: SoakResult, longest_request: int, current: object) -> ContextCap | str:
    """The cap a soak's drifting memory calls for, or why none follows."""
    found = result.trend_of(UNACCOUNTED)
    if found is None:
        return "the soak has no memory series (or no weights and KV pool to account for it): no cap follows"
    if found.verdict != "drifting":
        return f"the unaccounted memory is {found.verdict} over the soak ({found.line()}): no cap follows"
    cap = context_cap(longest_request)
    if isinstance(current, int) and not isinstance(current, bool) and current <= cap:
        return f"`max_model_len` is {current} already, at or under the workload's need + 20% ({cap})"
    reason = (
        f"The memory neither the weights nor the KV pool account for grew over the soak; cap the context at the "
        f"workload's longest request ({longest_request} tokens) + 20%, so the engine stops reserving for contexts "
        "this traffic never sends (the seed's cure for fragmentation)."
    )
    return ContextCap(cap, reason, [found.line()])


@dataclass
class SoakCell:
    """A measured soak: the cell, its workload and its first run read back."""

    cell: CellResult
    workload: Soak
    result: SoakResult


def soak_cells(cells: list[CellResult]) -> Iterator[SoakCell]:
    """The first soak run of each server and workload (lowest repeat first)."""
    seen: set[tuple[str, str]] = set()
    for cell in sorted(cells, key=lambda c: c.repeat):
        if (cell.label, cell.workload) in seen:
            continue
        for run, summary in cell.summaries.items():
            spec = summary.workload.spec if summary.workload is not None else None
            # A rehearsal's stand-in server says nothing about a framework's memory.
            if not spec or spec.get("kind") != "soak" or summary.rehearsal:
                continue
            result = soak_result(cell.dir / "runs" / run)
            try:
                workload = Soak.model_validate(spec)
            except ValidationError:
                continue  # a soak written by another version: its windows still show in the report
            if result is not None:
                seen.add((cell.label, cell.workload))
                yield SoakCell(cell, workload, result)
                break
