"""Pydantic models for everything a user writes: campaigns, workloads, SLOs and models.

Every model rejects unknown fields so a typo fails loudly, naming the field, before any
server starts. Backend specs live in :mod:`bakeoff.backends`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args

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


Workload = Annotated[
    ConcurrencySweep | OpenLoop | MultiTurn | LongPromptMix | Trace, Field(discriminator="kind")
]


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


MODEL_FORMS = (
    "write it as 'model: tiny' (a generated preset), 'model: models/my-model' (a folder), or as a "
    "mapping: {preset: tiny|small}, {path: FOLDER} or {hf_id: org/name}"
)


def model_shorthand(value: object) -> object:
    """``model: tiny`` is a preset, ``model: some/folder`` a folder; mappings pass through.

    A Hugging Face id is not guessed from a bare string (``org/name`` reads like a
    folder too): it needs ``{hf_id: org/name}``.
    """
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError(f"model is empty; {MODEL_FORMS}")
        return {"preset": text} if text in ("tiny", "small") else {"path": text}
    if value is not None and not isinstance(value, dict | ModelRef):
        kind = type(value).__name__
        raise ValueError(f"model must be a folder, a preset name or a mapping, got {kind}; {MODEL_FORMS}")
    return value


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
    image_tag: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description="container backends: this tag of the backend's image instead of its pinned one ('latest': "
        "pulled on every run; the digest actually run is recorded)",
    )
    gpu_type: str | None = Field(
        default=None, description="campaign run --ray: GPU model this server needs (Ray's accelerator type, e.g. H100)"
    )

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


class QualitySpec(Strict):
    """A fixed prompt set run at temperature 0 on every server after its speed runs (:mod:`bakeoff.quality`)."""

    prompts: str = Field(default="default", description="a set shipped in quality/ (by name) or a .jsonl file")
    baseline: Path | None = Field(
        default=None, description="a campaign folder whose quality answers the new ones are compared with"
    )
    concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    endpoint: Literal["chat", "completions"] = "chat"


class RayPolicy(Strict):
    """How ``campaign run --ray`` schedules and retries cells (:mod:`bakeoff.ray_runner`)."""

    max_retries: Annotated[int, Field(ge=0, le=10)] = Field(
        default=2, description="re-runs of a cell whose worker or node was lost"
    )
    retry_exceptions: bool = Field(
        default=False, description="also re-run a cell that failed with an error (a failed start, a dead server)"
    )
    cpus_per_cell: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="CPUs a cell holds; default 1 for GPU cells, 2 for CPU engines (server + client)"
    )


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
    repeats: Annotated[int, Field(ge=1, le=20)] = Field(
        default=3, description="measure every cell this many times; figures then carry bootstrap intervals"
    )
    interleave: bool = Field(
        default=True,
        description="run repeat 1 of every cell, then repeat 2, ... so drift (heat, a filling disk cache) "
        "favours no server; false: each cell's repeats back to back. Every repeat starts its server afresh",
    )
    start_attempts: Annotated[int, Field(ge=1, le=5)] = Field(default=2, description="tries per server start")
    memory_bandwidth_gbs: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="memory bandwidth (GB/s) for the decode roofline; default: GPU preset or measured"
    )
    gpu_type: str | None = Field(default=None, description="campaign run --ray: GPU model for every GPU server")
    ray: RayPolicy = Field(default_factory=RayPolicy)
    client_processes: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        default="auto", description="load-generator processes per run; auto: as many as the warm-up shows are needed"
    )
    quality: QualitySpec | None = Field(default=None, description="output checks after the speed runs")
    regression: dict[str, float] = Field(
        default_factory=dict,
        description="bakeoff compare's gate: metric -> threshold, e.g. {tpot_ms_p50: 5%} (bakeoff.thresholds)",
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_shorthand(cls, value: object) -> object:
        return model_shorthand(value)

    @field_validator("regression", mode="before")
    @classmethod
    def _regression(cls, value: object) -> object:
        from bakeoff.thresholds import parse_thresholds

        return parse_thresholds(value)

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


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold, through Annotated, list, dict and unions."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        found += [m for m in _models_in(arg) if m not in found]
    return found


def section_model(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model of the section at ``loc`` (a pydantic error location), when it is one model.

    List indexes are stepped over; a workload kind in the location (how pydantic names
    the member of a discriminated union) picks that member.
    """
    candidates: list[type[BaseModel]] = [root]
    for part in loc:
        if isinstance(part, int):
            continue
        holders = [c for c in candidates if part in c.model_fields]
        if holders:
            candidates = _models_in(holders[0].model_fields[part].annotation)
        else:
            candidates = [c for c in candidates if "kind" in c.model_fields and c.model_fields["kind"].default == part]
        if not candidates:
            return None
    return candidates[0] if len(candidates) == 1 else None


def _plain(message: str) -> str:
    """Pydantic names its classes in some messages; users never wrote those names."""
    return re.sub(r"Input should be a valid dictionary or instance of \w+", "expected a mapping (key: value)", message)


def format_validation_error(source: str, err: ValidationError, root: type[BaseModel] | None = None) -> str:
    """Render pydantic errors as 'source: field.path: message' lines a user can act on.

    An unknown key lists the valid keys of its section (``root`` is the model validated).
    """
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"]) or "(top level)"
        msg = _plain(item["msg"])
        if item["type"] == "extra_forbidden":
            section = section_model(root, tuple(item["loc"][:-1])) if root is not None else None
            valid = f"; valid keys here: {', '.join(section.model_fields)}" if section is not None else ""
            msg = f"unknown key; remove it or check its spelling{valid}"
        elif item["type"] in ("model_type", "model_attributes_type", "dict_type") and item["loc"][-1:] == ("model",):
            msg = f"{msg}; {MODEL_FORMS}"
        lines.append(f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def resolve_relative(path: Path, campaign_dir: Path) -> Path:
    """A relative model path: beside the campaign file if it is there, else in the working directory.

    The result is absolute either way, so an error about it names exactly the folder tried.
    """
    path = path.expanduser()
    if path.is_absolute():
        return path
    beside = (campaign_dir / path).resolve()
    return beside if beside.exists() else (Path.cwd() / path).resolve()


def campaign_copy(path: Path, spec: CampaignSpec) -> bytes:
    """What a campaign folder keeps as its ``campaign.yaml``: the user's file, comments and all.

    Relative model paths were resolved against the original file's folder, which the copy
    does not sit in: then the copy is the validated spec, with those paths made absolute.
    """
    text = path.read_bytes()
    raw = yaml.safe_load(text)
    model = raw.get("model")
    written = [model.get("path"), model.get("draft_path")] if isinstance(model, dict) else [model]
    written += [s.get("model_path") for s in raw.get("servers") or [] if isinstance(s, dict)]
    written += [w.get("path") for w in raw.get("workloads") or [] if isinstance(w, dict) and w.get("kind") == "trace"]
    if all(p is None or Path(str(p)).expanduser().is_absolute() or str(p) in ("tiny", "small") for p in written):
        return text
    dumped = yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)
    return f"# written by bakeoff from {path.resolve()}, relative model paths made absolute\n{dumped}".encode()


def _resolve_model_paths(spec: CampaignSpec, campaign_dir: Path) -> None:
    if spec.model.path is not None:
        spec.model.path = resolve_relative(spec.model.path, campaign_dir)
    if spec.model.draft_path is not None:
        spec.model.draft_path = resolve_relative(spec.model.draft_path, campaign_dir)
    for server in spec.servers:
        if server.model_path is not None:
            server.model_path = resolve_relative(server.model_path, campaign_dir)
    for wl in spec.workloads:
        if isinstance(wl, Trace):  # a trace file is found the way a model folder is
            wl.path = resolve_relative(wl.path, campaign_dir)


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
        spec = CampaignSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(str(path), exc, CampaignSpec)) from exc
    _resolve_model_paths(spec, path.resolve().parent)
    return spec
