"""The report's account of who drove each run and where: client processes, Ray nodes, retries.

Two tables for ``compare.ipynb``: :func:`client_table` (how many load-generator processes
sent each run's requests and the CPU headroom the busiest one had left, so a reader can
tell a server's latency from a saturated client's), and :func:`placement_table` (for
cells run with ``campaign run --ray``: the node, its GPU type and driver, and how many
times Ray had to run the cell again after losing its worker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.results.layout import load_cells

# Below this much CPU left on the busiest client process, latency figures carry its queueing.
LOW_HEADROOM = 0.2


def client_table(campaign_dir: Path) -> pd.DataFrame:
    """One row per run: client processes, how they were chosen, each one's CPU share, headroom."""
    rows: list[dict[str, Any]] = []
    for cell in load_cells(campaign_dir):
        for name, summary in cell.summaries.items():
            client = summary.client
            if client is None:
                continue
            rows.append(
                {
                    "cell": cell.dir.name,
                    "run": name,
                    "client processes": client.processes,
                    "chosen": client.decided_by,
                    "CPU per process %": ", ".join(f"{100 * u:.0f}" for u in client.cpu_util),
                    "headroom %": None if client.headroom is None else 100 * client.headroom,
                    "client-bound": client.headroom is not None and client.headroom < LOW_HEADROOM,
                }
            )
    return pd.DataFrame(rows)


def placement_table(campaign_dir: Path) -> pd.DataFrame:
    """Cells run on Ray: node, GPU type, driver, tries; empty for a campaign run on one host."""
    rows: list[dict[str, Any]] = []
    for cell in load_cells(campaign_dir):
        ray = cell.ray
        if not ray:
            continue
        node = ray.get("node") or {}
        lost = [t for t in ray.get("tries", []) if t.get("outcome") == "lost"]
        rows.append(
            {
                "cell": cell.dir.name,
                "host": node.get("hostname"),
                "node id": (node.get("node_id") or "")[:12],
                "GPU type": node.get("gpu_type"),
                "driver": node.get("gpu_driver"),
                "tries": len(ray.get("tries", [])),
                "retried after a lost worker on": ", ".join(str(t.get("hostname")) for t in lost) or None,
            }
        )
    return pd.DataFrame(rows)
