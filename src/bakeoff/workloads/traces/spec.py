"""A ``kind: trace`` workload's options: which trace, its format, window and filters.

The fields alone, so the trace loader and planner (:mod:`bakeoff.workloads.traces.loading`,
:mod:`bakeoff.workloads.traces.plan`) can read them; the kind that plans and costs a replay,
:class:`bakeoff.workloads.kinds.Trace`, extends this class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from bakeoff.workloads.base import WorkloadBase

TraceFormat = Literal["mooncake", "azure", "burstgpt", "bakeoff", "otel"]
MOONCAKE_BLOCK_SIZE = 512  # tokens per hash id in the Mooncake FAST'25 release
OTEL_BLOCK_SIZE = 16  # agent spans carry no ids: the cache block their inferred reuse is counted in


class TraceSpec(WorkloadBase):
    """The options of a trace replay: the file, its format, the window read and the filters."""

    kind: Literal["trace"] = "trace"
    path: Path = Field(description="trace file; a relative path is looked up in the working directory, then the repo")
    format: TraceFormat
    time_scale: Annotated[float, Field(gt=0)] = Field(default=1.0, description="1.0 real time, 0.5 twice as fast")
    start_s: Annotated[float, Field(ge=0)] = Field(default=0.0, description="window start, trace seconds")
    duration_s: Annotated[float, Field(gt=0)] | None = Field(default=None, description="window length, trace seconds")
    max_requests: Annotated[int, Field(gt=0)] | None = None
    block_size: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="mooncake: tokens per hash id; otel: the cache block reuse is counted in"
    )
    models: list[str] = Field(default_factory=list, description="burstgpt: keep rows of these Model values")
    log_types: list[str] = Field(default_factory=list, description="burstgpt: keep rows of these Log Type values")
    clip_to_context: bool = Field(default=False, description="shorten requests beyond the served context")
    max_concurrency: Annotated[int, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _format_options(self) -> TraceSpec:
        if self.block_size is not None and self.format not in ("mooncake", "otel"):
            raise ValueError(
                f"block_size applies to formats mooncake and otel only (a {self.format} trace sets its own)"
            )
        if (self.models or self.log_types) and self.format != "burstgpt":
            raise ValueError("models and log_types filter burstgpt traces only; remove them")
        return self

    @property
    def tokens_per_block(self) -> int:
        return self.block_size or (OTEL_BLOCK_SIZE if self.format == "otel" else MOONCAKE_BLOCK_SIZE)

    def for_rehearsal(self) -> TraceSpec:
        return self.model_copy(
            update={"warmup_requests": min(self.warmup_requests, 2), "max_requests": min(self.max_requests or 12, 12)}
        )
