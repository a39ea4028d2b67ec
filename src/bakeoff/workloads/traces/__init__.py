"""Production-trace replay: read public arrival/length traces, window them, plan them.

- :mod:`bakeoff.workloads.traces.rows`: the format-independent row, windows, prefix reuse from block ids.
- :mod:`bakeoff.workloads.traces.formats`: one parser per format (Mooncake, Azure, BurstGPT, bakeoff's
  own JSONL) and the bakeoff writer ``bakeoff trace convert`` uses.
- :mod:`bakeoff.workloads.traces.loading`: a ``kind: trace`` workload's trace, filtered and windowed.
- :mod:`bakeoff.workloads.traces.plan`: context checks and clipping, token-exact prompts built block by block.
- :mod:`bakeoff.workloads.traces.inspect`: what ``bakeoff trace inspect`` prints.
"""

from __future__ import annotations

from bakeoff.workloads.traces.rows import LoadedTrace, TraceRow

__all__ = ["LoadedTrace", "TraceRow"]
