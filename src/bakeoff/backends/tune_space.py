"""Knob spaces as data: which values ``bakeoff tune`` may try for a backend, and in what order.

A backend YAML's ``tune:`` block declares, per vocabulary knob, a range (``low``..``high``,
``log: true`` for knobs whose effect is multiplicative, ``step`` for ints) or a list of
``choices``, and *constraints* between knobs::

    tune:
      knobs:
        max_num_seqs: {low: 1, high: 64, log: true}
        max_num_batched_tokens: {low: 256, high: 8192, log: true}
        threads: {choices: [1, 2]}
      constraints:
        # vLLM refuses a token budget below the context limit when prefills are not chunked
        - {knob: max_num_batched_tokens, at_least: max_model_len, when: {chunked_prefill: false}}

A campaign's ``tune:`` section overrides single knobs' ranges and picks which knobs are
searched (:meth:`TuneSpace.merged`). Every bound and choice is checked against the backend's
own knob spec when the space is resolved (:func:`bakeoff.backends.knobs.resolve_space`), so a range
the framework cannot take fails before any server starts, naming the knob and the fix.

Knobs are searched in the advisor's cost order (:data:`COST_ORDER`, cheapest to try first:
batching caps and the token budget, then quantization, the KV-cache share, context limits,
parallelism); :func:`ordered` sorts a space that way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, model_validator

from bakeoff.schema import Strict

KnobValue = bool | int | float | str

Stage = Literal["caps", "quantization", "kv_share", "context", "parallelism", "other"]
COST_ORDER: tuple[Stage, ...] = ("caps", "quantization", "kv_share", "context", "parallelism")

# Which stage of the cost order each vocabulary knob belongs to (shared with the advisor).
KNOB_STAGE: dict[str, Stage] = {
    "max_num_seqs": "caps",
    "max_num_batched_tokens": "caps",
    "chunked_prefill": "caps",
    "kv_cache_dtype": "quantization",
    "quantization": "quantization",
    "dtype": "quantization",
    "gpu_memory_utilization": "kv_share",
    "kv_cache_space_gib": "kv_share",
    "max_model_len": "context",
    "tensor_parallel_size": "parallelism",
    "threads": "parallelism",
}


def stage_of(knob: str) -> Stage:
    return KNOB_STAGE.get(knob, "other")


class KnobRange(Strict):
    """One knob's search space: ``low``..``high`` (``log``, ``step``) or ``choices``."""

    low: float | None = None
    high: float | None = None
    log: bool = Field(default=False, description="sample on a log scale (effects that multiply)")
    step: Annotated[float, Field(gt=0)] | None = Field(default=None, description="grid step of a range")
    choices: Annotated[list[KnobValue], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> KnobRange:
        ranged = self.low is not None or self.high is not None
        if ranged == (self.choices is not None):
            raise ValueError("give either low and high (a range) or choices (a list), not both or neither")
        if ranged:
            if self.low is None or self.high is None:
                raise ValueError("a range needs both low and high")
            if self.low > self.high:
                raise ValueError(f"low ({self.low:g}) is above high ({self.high:g}); swap them")
            if self.log and self.low <= 0:
                raise ValueError("log: true needs low above 0")
            if self.log and self.step is not None:
                raise ValueError("log and step do not combine (Optuna samples a log range without a grid)")
        elif self.log or self.step is not None:
            raise ValueError("log and step apply to ranges, not choices")
        return self


class Constraint(Strict):
    """``knob`` >= / <= another knob (or a number), only where every ``when`` knob has its value."""

    knob: str
    at_least: str | float | None = None
    at_most: str | float | None = None
    when: dict[str, KnobValue] = Field(default_factory=dict)
    reason: str = ""

    @model_validator(mode="after")
    def _one_bound(self) -> Constraint:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("a constraint needs exactly one of at_least, at_most")
        return self

    def names(self) -> set[str]:
        other = self.at_least if self.at_least is not None else self.at_most
        return {self.knob, *self.when, *([other] if isinstance(other, str) else [])}

    def violated(self, knobs: Mapping[str, KnobValue], defaults: Mapping[str, KnobValue | None]) -> str | None:
        """Why these knob values break the constraint, or None (unset knobs read as the backend's default)."""

        def value(name: str) -> KnobValue | None:
            return knobs[name] if name in knobs else defaults.get(name)

        if any(value(k) != v for k, v in self.when.items()):
            return None
        mine, bound = value(self.knob), self.at_least if self.at_least is not None else self.at_most
        other = value(bound) if isinstance(bound, str) else bound
        if not _number(mine) or not _number(other):
            return None  # an unset context limit (the model's own) cannot be compared here
        assert isinstance(mine, int | float) and isinstance(other, int | float)
        broken = mine < other if self.at_least is not None else mine > other
        if not broken:
            return None
        sign = ">=" if self.at_least is not None else "<="
        cond = " when " + ", ".join(f"{k}={v}" for k, v in self.when.items()) if self.when else ""
        return f"{self.knob} {sign} {bound}{cond}" + (f" ({self.reason})" if self.reason else "")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class TuneSpace(Strict):
    """A backend's searchable knobs and the constraints between them."""

    knobs: dict[str, KnobRange] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)

    def named(self) -> set[str]:
        """Every knob the space searches or a constraint reads."""
        return set(self.knobs).union(*(c.names() for c in self.constraints))

    def merged(self, override: TuneSpace | None, only: list[str] | None) -> TuneSpace:
        """This space with a campaign's ranges replacing single knobs, cut to ``only`` where given."""
        knobs = {**self.knobs, **(override.knobs if override else {})}
        if only is not None:
            knobs = {k: knobs[k] for k in only if k in knobs}
        constraints = [*self.constraints, *(override.constraints if override else [])]
        return TuneSpace(knobs=knobs, constraints=constraints)


def ordered(space: TuneSpace) -> list[str]:
    """The space's knobs in cost order (then as written)."""
    rank = {stage: i for i, stage in enumerate((*COST_ORDER, "other"))}
    written = list(space.knobs)
    return sorted(written, key=lambda k: (rank[stage_of(k)], written.index(k)))
