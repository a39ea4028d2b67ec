"""Pydantic models for the campaign a user writes: servers, model, SLO, policies; loading it.

Every model rejects unknown fields so a typo fails loudly, naming the field, before any
server starts. The workload kinds live in :mod:`bakeoff.workload_specs`, backend specs in
:mod:`bakeoff.backends`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from bakeoff.auth import env_name_problem, header_problem
from bakeoff.errors import SpecError
from bakeoff.workload_base import Strict
from bakeoff.workload_specs import OpenLoop, Trace, Workload

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
