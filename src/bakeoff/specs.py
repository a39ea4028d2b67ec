"""Pydantic models for everything a user writes: campaigns, workloads, SLOs and models.

Every model rejects unknown fields so a typo fails loudly, naming the field, before any
server starts. Backend specs live in :mod:`bakeoff.backends`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bakeoff.auth import env_name_problem, header_problem
from bakeoff.errors import SpecError

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
    """Closed loop: each level keeps exactly N requests in flight."""

    kind: Literal["concurrency"] = "concurrency"
    levels: Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=1)]
    requests_per_level: Annotated[int, Field(gt=0)] | None = None
    requests_per_slot: Annotated[int, Field(gt=0)] = Field(
        default=10, description="requests per level = this x concurrency, unless requests_per_level is set"
    )
    duration_s: Annotated[float, Field(gt=0)] | None = None

    def requests_for(self, concurrency: int) -> int:
        """Default of ten requests per slot keeps each level past its ramp-up."""
        return self.requests_per_level or self.requests_per_slot * concurrency

    def for_rehearsal(self) -> ConcurrencySweep:
        # One request per slot: every level still reaches its concurrency.
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "requests_per_level": None,
                "requests_per_slot": 1,
                "duration_s": None,
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


Workload = Annotated[ConcurrencySweep | OpenLoop | MultiTurn | LongPromptMix, Field(discriminator="kind")]


SloPreset = Literal["mlperf-llama3.1-8b", "mlperf-llama2-70b", "mlperf-llama2-70b-interactive", "mlperf-llama3.1-405b"]


class Slo(Strict):
    """Service-level objectives; a request meets the SLO when it meets every bound set."""

    preset: SloPreset | None = Field(default=None, description="MLPerf-style TTFT/TPOT bounds")
    ttft_ms: Annotated[float, Field(gt=0)] | None = None
    tpot_ms: Annotated[float, Field(gt=0)] | None = None
    e2e_ms: Annotated[float, Field(gt=0)] | None = None


_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


class ModelRef(Strict):
    """Which model to serve: a generated preset, a Hugging Face folder, or a Hugging Face model id.

    ``hf_id`` (``meta-llama/Llama-3.1-8B-Instruct``) is served the way users run the
    official images: the id as the model argument, the user's Hugging Face cache mounted,
    ``HF_TOKEN`` passed through from the environment. See :mod:`bakeoff.model_source`.
    """

    preset: Literal["tiny", "small"] | None = None
    path: Path | None = None
    hf_id: str | None = Field(default=None, description="Hugging Face model id, e.g. org/name")
    served_name: str = "bakeoff-model"
    context_len: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="context length, for validating before the model folder is present"
    )
    draft_path: Path | None = Field(
        default=None,
        description="draft model folder (EAGLE head or small model) for speculative knobs; mounted at /draft",
    )

    @field_validator("hf_id")
    @classmethod
    def _hf_id(cls, value: str | None) -> str | None:
        if value is not None and (not _HF_ID.match(value) or ".." in value or "--" in value):
            raise ValueError(f"{value!r} is not a Hugging Face model id; write it as org/name")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelRef:
        if sum(v is not None for v in (self.preset, self.path, self.hf_id)) != 1:
            raise ValueError("set exactly one of 'preset' (tiny|small), 'path' or 'hf_id'")
        return self


_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_BASE_URL = re.compile(r"^https?://[^/\s:]+(:\d{1,5})?(/\S*)?$")


class ServerConfig(Strict):
    """One backend with one knob set: the unit that gets launched."""

    backend: str
    label: str = ""
    knobs: dict[str, bool | int | float | str] = Field(default_factory=dict)
    cost_per_hour_usd: Annotated[float, Field(ge=0)] | None = None
    model_path: Path | None = Field(
        default=None, description="this server's packaging of the campaign model (e.g. a ModelOpt checkpoint)"
    )
    url: str | None = Field(default=None, description="benchmark an already running server")
    api_key_env: str | None = Field(
        default=None, description="environment variable holding the server's API key (sent as a bearer token)"
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra headers on every request")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not _BASE_URL.match(value):
            raise ValueError(f"{value!r} is not a base URL; write it as http(s)://host[:port][/prefix]")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _api_key_env(cls, value: str | None) -> str | None:
        problem = None if value is None else env_name_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; name the variable, never the key itself")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            problem = header_problem(name, text)
            if problem is not None:
                raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_authorization(self) -> ServerConfig:
        if self.api_key_env is not None and any(n.lower() == "authorization" for n in self.headers):
            raise ValueError("api_key_env and headers.Authorization both set the key; keep one of them")
        return self

    @model_validator(mode="after")
    def _label(self) -> ServerConfig:
        if not self.label:
            self.label = self.backend
        if not _LABEL.match(self.label):
            raise ValueError(f"label {self.label!r} must be letters, digits, '.', '_' or '-'")
        return self


class CampaignSpec(Strict):
    """Servers x workloads, plus what the report needs to judge them."""

    name: str
    description: str = ""
    model: ModelRef
    servers: Annotated[list[ServerConfig], Field(min_length=1)]
    workloads: Annotated[list[Workload], Field(min_length=1)]
    slo: Slo = Field(default_factory=Slo)
    gpu: bool = False
    measure_warm_restart: bool = Field(default=True, description="start each server a second time")
    start_attempts: Annotated[int, Field(ge=1, le=5)] = Field(default=2, description="tries per server start")

    @model_validator(mode="after")
    def _slo_for_search(self) -> CampaignSpec:
        bounded = self.slo.preset or self.slo.ttft_ms or self.slo.tpot_ms or self.slo.e2e_ms
        for i, wl in enumerate(self.workloads):
            if isinstance(wl, OpenLoop) and wl.slo_search and not bounded:
                raise ValueError(f"workloads[{i}].slo_search needs an slo: set slo.preset or its bounds")
        return self

    @model_validator(mode="after")
    def _unique(self) -> CampaignSpec:
        for what, names in (
            ("servers[].label", [s.label for s in self.servers]),
            ("workloads[].name", [w.label for w in self.workloads]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{what} must be unique; repeated: {', '.join(dupes)}")
        return self


def format_validation_error(source: str, err: ValidationError) -> str:
    """Render pydantic errors as 'source: field.path: message' lines a user can act on."""
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"]) or "(top level)"
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check its spelling"
        lines.append(f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def load_campaign(path: Path) -> CampaignSpec:
    """Read and validate a campaign YAML, raising SpecError that names each bad field."""
    if not path.is_file():
        raise SpecError(f"campaign file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping at the top level")
    try:
        return CampaignSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(str(path), exc)) from exc
