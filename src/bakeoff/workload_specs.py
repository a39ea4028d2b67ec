"""The workload kinds a campaign can run, as the user writes them, and their rehearsal forms.

Each kind is one pydantic model: a closed-loop concurrency sweep, open-loop rates,
multi-turn conversations over a shared prefix, long prompts mixed into interactive
traffic, and a production trace replay. :mod:`bakeoff.workloads` turns them into request
plans; :mod:`bakeoff.specs` holds the campaign around them. ``Strict`` is the base of
every user-written section: unknown keys fail loudly, naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


def _rehearsal_length(dist: LengthDist) -> LengthDist:
    if dist.upper <= REHEARSAL_MAX_OUTPUT:
        return dist
    return LengthDist(dist="fixed", mean=REHEARSAL_MAX_OUTPUT)


class _WorkloadBase(Strict):
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

    def for_rehearsal(self) -> _WorkloadBase:
        """A few requests of the same shape: a rehearsal proves the path, it measures nothing."""
        return self.model_copy(update={"warmup_requests": min(self.warmup_requests, 2)})


class _SampledLengths(_WorkloadBase):
    input_len: LengthDist
    output_len: LengthDist

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _lengths(cls, value: object) -> object:
        return _as_length(value)


class ConcurrencySweep(_SampledLengths):
    """Closed loop: each level keeps exactly N requests in flight, measured in its steady state.

    The first N starts are spread over ``ramp_s`` (no lock-step waves). A level sends
    ``requests_for(N)`` requests; with ``min_duration_s`` it goes on (from a reserve planned
    for it) until its steady-state window also lasts that long, or ``duration_s`` passes.
    The window must hold ``requests_for(N) - 2N`` requests (at least N): the ramp and the
    tail cost about N each (:mod:`bakeoff.window`); a level short of that is flagged.
    """

    kind: Literal["concurrency"] = "concurrency"
    levels: Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=1)]
    requests_per_level: Annotated[int, Field(gt=0)] | None = None
    requests_per_slot: Annotated[int, Field(gt=0)] = Field(
        default=10, description="requests per level = this x concurrency, unless requests_per_level is set"
    )
    min_duration_s: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="steady-state window length per level, at least (0: the request count decides)"
    )
    ramp_s: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="spread the first N starts over this long; default: one warm-up request's E2E"
    )
    duration_s: Annotated[float, Field(gt=0)] | None = Field(default=None, description="stop each level after this")

    def requests_for(self, concurrency: int) -> int:
        """Requests per level (ten per slot by default: the window keeps eight after ramp and tail)."""
        return self.requests_per_level or self.requests_per_slot * concurrency

    def window_requests(self, concurrency: int) -> int:
        """Requests the steady-state window must hold: the level's, less a ramp and a tail."""
        return max(self.requests_for(concurrency) - 2 * concurrency, concurrency)

    def for_rehearsal(self) -> ConcurrencySweep:
        # One request per slot: every level still reaches its concurrency.
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "requests_per_level": None,
                "requests_per_slot": 1,
                "duration_s": None,
                "min_duration_s": 0.0,
                "output_len": _rehearsal_length(self.output_len),
            }
        )


class OpenLoop(_SampledLengths):
    """Open loop: arrivals at a given rate regardless of completions, so queueing shows."""

    kind: Literal["open_loop"] = "open_loop"
    rates: Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)]
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    burstiness: Annotated[float, Field(gt=0)] = 1.0
    requests_per_rate: Annotated[int, Field(gt=0)] = 64
    max_concurrency: Annotated[int, Field(gt=0)] | None = None
    slo_search: bool = Field(default=False, description="then search the highest rate meeting the SLO")
    search_steps: Annotated[int, Field(ge=1, le=12)] = 4
    search_tolerance: Annotated[float, Field(gt=0)] = 0.15

    def for_rehearsal(self) -> OpenLoop:
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "requests_per_rate": min(self.requests_per_rate, 12),
                "search_steps": 1,
                "output_len": _rehearsal_length(self.output_len),
            }
        )


class MultiTurn(_WorkloadBase):
    """Conversations sharing one system prompt; each turn appends the real assistant reply."""

    kind: Literal["multi_turn"] = "multi_turn"
    endpoint: Endpoint = "chat"
    conversations: Annotated[int, Field(gt=0)] = 8
    turns: Annotated[int, Field(gt=0)] = 4
    system_prompt_len: Annotated[int, Field(gt=0)] = 1024
    user_len: Annotated[int, Field(gt=0)] = 64
    output_len: Annotated[int, Field(gt=0)] = 32
    concurrency: Annotated[int, Field(gt=0)] = 4
    think_time_s: Annotated[float, Field(ge=0)] = 0.0
    warmup_requests: Annotated[int, Field(ge=0)] = 0
    verify_reuse: bool = Field(default=True, description="needs server cache counters or usage")

    def for_rehearsal(self) -> MultiTurn:
        return self.model_copy(
            update={
                "conversations": min(self.conversations, 4),
                "turns": min(self.turns, 3),
                "concurrency": min(self.concurrency, 4),
                "think_time_s": 0.0,
                "output_len": min(self.output_len, REHEARSAL_MAX_OUTPUT),
            }
        )


class LongPromptMix(_WorkloadBase):
    """Short interactive requests at a steady rate with long prompts arriving among them."""

    kind: Literal["long_prompt_mix"] = "long_prompt_mix"
    short_rate: Annotated[float, Field(gt=0)] = 2.0
    short_requests: Annotated[int, Field(gt=0)] = 40
    short_input_len: Annotated[int, Field(gt=0)] = 64
    short_output_len: Annotated[int, Field(gt=0)] = 32
    long_every: Annotated[int, Field(gt=0)] = 8
    long_input_len: Annotated[int, Field(gt=0)] = 8000
    long_output_len: Annotated[int, Field(gt=0)] = 8

    def for_rehearsal(self) -> LongPromptMix:
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "short_requests": min(self.short_requests, 16),
                "short_output_len": min(self.short_output_len, REHEARSAL_MAX_OUTPUT),
                "long_output_len": min(self.long_output_len, REHEARSAL_MAX_OUTPUT),
            }
        )


TraceFormat = Literal["mooncake", "azure", "burstgpt", "bakeoff"]
MOONCAKE_BLOCK_SIZE = 512  # tokens per hash id in the Mooncake FAST'25 release


class Trace(_WorkloadBase):
    """Replay a production trace open loop: its arrivals (scaled), lengths and shared prefixes."""

    kind: Literal["trace"] = "trace"
    path: Path = Field(description="trace file; a relative path is looked up in the working directory, then the repo")
    format: TraceFormat
    time_scale: Annotated[float, Field(gt=0)] = Field(default=1.0, description="1.0 real time, 0.5 twice as fast")
    start_s: Annotated[float, Field(ge=0)] = Field(default=0.0, description="window start, trace seconds")
    duration_s: Annotated[float, Field(gt=0)] | None = Field(default=None, description="window length, trace seconds")
    max_requests: Annotated[int, Field(gt=0)] | None = None
    block_size: Annotated[int, Field(gt=0)] | None = Field(default=None, description="mooncake: tokens per hash id")
    models: list[str] = Field(default_factory=list, description="burstgpt: keep rows of these Model values")
    log_types: list[str] = Field(default_factory=list, description="burstgpt: keep rows of these Log Type values")
    clip_to_context: bool = Field(default=False, description="shorten requests beyond the served context")
    max_concurrency: Annotated[int, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _format_options(self) -> Trace:
        if self.block_size is not None and self.format != "mooncake":
            raise ValueError(f"block_size applies to format mooncake only (a {self.format} trace sets its own)")
        if (self.models or self.log_types) and self.format != "burstgpt":
            raise ValueError("models and log_types filter burstgpt traces only; remove them")
        return self

    @property
    def tokens_per_block(self) -> int:
        return self.block_size or MOONCAKE_BLOCK_SIZE

    def for_rehearsal(self) -> Trace:
        return self.model_copy(
            update={"warmup_requests": min(self.warmup_requests, 2), "max_requests": min(self.max_requests or 12, 12)}
        )


Workload = Annotated[ConcurrencySweep | OpenLoop | MultiTurn | LongPromptMix | Trace, Field(discriminator="kind")]
