"""Small typed workloads for tests that build a :class:`~bakeoff.workloads.plans.RunPlan` by hand.

A plan carries its workload typed (the kind's model, not a dict); these are the kinds' smallest
valid specs, one per plan mode, for tests whose subject is not the workload.
"""

from __future__ import annotations

from bakeoff.workloads.kinds import ConcurrencySweep, MultiTurn, OpenLoop

CLOSED = ConcurrencySweep(levels=[1], input_len=8, output_len=8)
OPEN = OpenLoop(rates=[1.0], input_len=8, output_len=8)
SESSIONS = MultiTurn()
