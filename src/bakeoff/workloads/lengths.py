"""Token lengths a workload asks for: a fixed number, uniform or normal, and one drawn from them.

``input_len: 256`` is shorthand for a fixed length; :func:`sample_length` draws one from a
seeded generator, so every backend is sent the same lengths.
"""

from __future__ import annotations

import random
from typing import Annotated, Literal

from pydantic import Field, model_validator

from bakeoff.schema import Strict


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


def sample_length(dist: LengthDist, rng: random.Random) -> int:
    if dist.dist == "fixed":
        return dist.mean
    if dist.dist == "uniform":
        assert dist.min is not None and dist.max is not None
        return rng.randint(dist.min, dist.max)
    value = round(rng.gauss(dist.mean, dist.std))
    return max(dist.min or 1, min(dist.max or value, value))
