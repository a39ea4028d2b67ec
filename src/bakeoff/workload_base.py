"""What every workload kind shares: the strict base model, lengths, cost, the plan hook.

``Strict`` is the base of every user-written section (unknown keys are errors);
:class:`WorkloadBase` declares what each kind in :mod:`bakeoff.workload_specs` provides
(plans, cost, longest request, rehearsal form) and the fields all kinds have.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from bakeoff.workloads import PlanBuilder, RunPlan

Endpoint = Literal["completions", "chat"]


class Strict(BaseModel):
    """Base model: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class LengthDist(Strict):
    """A token-length distribution: fixed, uniform in [min, max], or normal(mean, std) clipped."""

    dist: Literal["fixed", "uniform", "normal"] = "fixed"
    mean: Annotated[int, Field(gt=0)] = 128
    min: Annotated[int, Field(gt=0)] | None = None
    max: Annotated[int, Field(gt=0)] | None = None
    std: Annotated[float, Field(ge=0)] = 0.0

    @model_validator(mode="after")
    def _check_bounds(self) -> LengthDist:
        if self.dist == "uniform" and (self.min is None or self.max is None):
            raise ValueError("uniform lengths need both 'min' and 'max'")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"'min' ({self.min}) is larger than 'max' ({self.max})")
        return self

    @property
    def upper(self) -> int:
        """Largest length this distribution can produce (for context-length checks)."""
        if self.max is not None:
            return self.max
        if self.dist == "normal":
            return int(self.mean + 4 * self.std)
        return self.mean


def _as_length(value: object) -> object:
    """Let users write ``input_len: 256`` as shorthand for a fixed length."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"length must be a positive number of tokens, got {value}")
        return {"dist": "fixed", "mean": value}
    return value


# A rehearsal streams at most this many tokens per request: enough chunks to exercise
# every protocol path, few enough that concurrency 256 stays quick on two cores.
REHEARSAL_MAX_OUTPUT = 32


def rehearsal_length(dist: LengthDist) -> LengthDist:
    if dist.upper <= REHEARSAL_MAX_OUTPUT:
        return dist
    return LengthDist(dist="fixed", mean=REHEARSAL_MAX_OUTPUT)


@dataclass(frozen=True)
class WorkloadCost:
    """What a workload asks of a server, for estimates (:mod:`bakeoff.progress`).

    ``decode_steps`` become seconds at an accelerator's per-token time; ``fixed_s`` (open-loop
    arrivals, think times, fixed durations) takes the same wall time anywhere.
    """

    requests: int
    decode_steps: float
    fixed_s: float


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

    def for_rehearsal(self) -> WorkloadBase:
        """A few requests of the same shape: a rehearsal proves the path, it measures nothing."""
        return self.model_copy(update={"warmup_requests": min(self.warmup_requests, 2)})

    def plans(self, builder: PlanBuilder) -> list[RunPlan]:
        """Every run plan of this workload, from its seed: the same plans on every call."""
        return self._plans(builder, random.Random(self.seed), self.model_dump(mode="json"))

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: dict[str, Any]) -> list[RunPlan]:
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
