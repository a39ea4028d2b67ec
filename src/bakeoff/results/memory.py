"""What a soak run's memory is made of: the weights and the KV pool, beside what the engine holds.

A :class:`MemoryAccount` is written once per soak run, before its load starts, as
``memory.json`` beside ``summary.json`` (by :mod:`bakeoff.observe.memory_account`). The engine's
memory over time is in the run's telemetry series (``rss_bytes`` for a local engine's process
tree, ``gpu_mem_used_bytes`` from NVML on its pinned GPUs); what neither the weights nor the
KV pool account for is the series minus these two constants
(:mod:`bakeoff.analysis.soak`). A part that could not be sized is None, with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from bakeoff.errors import ResultsError
from bakeoff.results.store import atomic_write_bytes

MEMORY_FILE = "memory.json"

MemorySource = Literal["rss", "nvml", "none"]


class MemoryAccount(BaseModel):
    """The constant parts of an engine's memory, and which series holds the whole."""

    # Which telemetry column is the engine's memory: its process tree's RSS (CPU) or NVML used (GPU).
    source: MemorySource
    weights_bytes: int | None = None
    weights_from: str = ""  # the files counted, or why none could be
    kv_pool_bytes: int | None = None
    kv_pool_tokens: int | None = None
    kv_bytes_per_token: float | None = None
    kv_pool_from: str = ""  # how the pool was sized (the server's own figure, or why not)
    notes: list[str] = []

    @property
    def accounted_bytes(self) -> int | None:
        """Weights plus the KV pool; None when either is unknown."""
        if self.weights_bytes is None or self.kv_pool_bytes is None:
            return None
        return self.weights_bytes + self.kv_pool_bytes


def write_memory(path: Path, account: MemoryAccount) -> None:
    atomic_write_bytes(path, account.model_dump_json(indent=2).encode())


def read_memory(path: Path) -> MemoryAccount:
    try:
        return MemoryAccount.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ResultsError(f"{path}: not a memory account bakeoff can read ({exc.error_count()} errors)") from exc
