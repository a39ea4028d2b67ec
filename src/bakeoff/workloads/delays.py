"""Waits a workload schedules between calls (tool latency, think time): fixed or drawn, seconds.

``tool_latency_s: 0.5`` is shorthand for a fixed wait; ``{dist: exponential, mean_s: 0.5}``
and ``{dist: lognormal, mean_s: 0.5, sigma: 1}`` draw one per call from the workload's seed,
so every server sees the same waits. A lognormal's ``mean_s`` is its mean, not its median:
its long tail (the slow tool) is what makes one branch finish late.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Literal

from pydantic import Field

from bakeoff.schema import Strict


class Delay(Strict):
    """A wait in seconds: fixed, exponential or lognormal with the given mean."""

    dist: Literal["fixed", "exponential", "lognormal"] = "fixed"
    mean_s: Annotated[float, Field(ge=0)] = 0.0
    sigma: Annotated[float, Field(gt=0, le=3)] = 1.0

    def draw(self, rng: random.Random) -> float:
        if self.mean_s == 0 or self.dist == "fixed":
            return self.mean_s
        if self.dist == "exponential":
            return rng.expovariate(1.0 / self.mean_s)
        # mean = exp(mu + sigma^2 / 2)
        return rng.lognormvariate(math.log(self.mean_s) - self.sigma**2 / 2, self.sigma)


def as_delay(value: object) -> object:
    """Let users write ``think_time_s: 0.5`` for a fixed wait."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a wait must be >= 0 seconds, got {value}")
        return {"dist": "fixed", "mean_s": float(value)}
    return value
