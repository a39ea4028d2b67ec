"""What every workload kind shares: the strict base model, lengths, cost, the plan hook.

``Strict`` is the base of every user-written section (unknown keys are errors);
:class:`WorkloadBase` declares what each kind in :mod:`bakeoff.workloads.kinds` provides
(plans, cost, longest request, rehearsal form) and the fields all kinds have.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Literal, Self

from pydantic import Field, field_validator

from bakeoff.schema import Strict
from bakeoff.workloads.lengths import LengthDist, _as_length
from bakeoff.workloads.plans import PlanBuilder, RunPlan

Endpoint = Literal["completions", "chat"]


@dataclass(frozen=True)
class WorkloadCost:
    """What a workload asks of a server, for estimates (:mod:`bakeoff.campaign.progress`).

    ``decode_steps`` become seconds at an accelerator's per-token time; ``fixed_s`` (open-loop
    arrivals, think times, fixed durations) takes the same wall time anywhere. ``prompt_tokens``:
    the prompt tokens a closed loop makes the server prefill one after another (its next request
    waits for them), at an accelerator's per-token prefill time; an open loop's prefill hides in
    its fixed schedule.
    """

    requests: int
    decode_steps: float
    fixed_s: float
    prompt_tokens: float = 0.0


class WorkloadBase(Strict):
    name: str = Field(default="", description="label used in folder names; defaults to the kind")
    endpoint: Endpoint = "completions"
    seed: int = 0
    warmup_requests: Annotated[int, Field(ge=0)] = 2
    request_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    stall_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    temperature: Annotated[float, Field(ge=0)] = 0.0

    @property
    def label(self) -> str:
        return self.name or str(getattr(self, "kind", "workload"))

    @property
    def searches_slo(self) -> bool:
        """Whether its cell then searches the highest load meeting the SLO (replaying one load's prompts)."""
        return False

    def load_levels(self) -> list[float]:
        """The loads it sweeps (concurrency levels, request rates), which tune picks from; none by default."""
        return []

    def for_rehearsal(self) -> WorkloadBase:
        """A few requests of the same shape: a rehearsal proves the path, it measures nothing."""
        return self.model_copy(update={"warmup_requests": min(self.warmup_requests, 2)})

    def plans(self, builder: PlanBuilder) -> list[RunPlan]:
        """Every run plan of this workload, from its seed: the same plans on every call."""
        return self._plans(builder, random.Random(self.seed), self)

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:
        # ``spec`` is the workload itself: each plan carries it typed (RunPlan.workload).
        raise NotImplementedError(f"workload kind {type(self).__name__} makes no plans")

    def cost(self) -> WorkloadCost:
        raise NotImplementedError(f"workload kind {type(self).__name__} has no cost estimate")

    def longest_request(self) -> int:
        """Largest prompt + output tokens any request of the workload can need."""
        raise NotImplementedError(f"workload kind {type(self).__name__} has no longest request")


class SampledLengths(WorkloadBase):
    input_len: LengthDist
    output_len: LengthDist

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _lengths(cls, value: object) -> object:
        return _as_length(value)

    def longest_request(self) -> int:
        return self.input_len.upper + self.output_len.upper
