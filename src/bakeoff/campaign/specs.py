"""Pydantic models for the campaign a user writes: servers, model, SLO, policies; loading it.

Every model rejects unknown fields so a typo fails loudly, naming the field, before any
server starts. The workload kinds live in :mod:`bakeoff.workloads.kinds`, backend specs in
:mod:`bakeoff.backends.spec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from bakeoff.analysis.thresholds import parse_threshold, parse_thresholds
from bakeoff.backends.kv_pool import KvPool
from bakeoff.backends.server_config import ServerConfig
from bakeoff.campaign.ladder import LadderSpec
from bakeoff.campaign.quality import QualitySpec
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.errors import SpecError
from bakeoff.measure.slo import Slo
from bakeoff.models.model_source import MODEL_FORMS, PRESET_CHOICES, ModelRef, model_shorthand
from bakeoff.paths import models_dir
from bakeoff.schema import Strict, format_validation_error
from bakeoff.workloads.kinds import Trace, Workload


class RayPolicy(Strict):
    """How ``campaign run --ray`` schedules and retries cells (:mod:`bakeoff.cluster.ray_runner`)."""

    max_retries: Annotated[int, Field(ge=0, le=10)] = Field(
        default=2, description="re-runs of a cell whose worker or node was lost"
    )
    retry_exceptions: bool = Field(
        default=False, description="also re-run a cell that failed with an error (a failed start, a dead server)"
    )
    cpus_per_cell: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="CPUs a cell holds; default 1 for GPU cells, 2 for CPU engines (server + client)"
    )


# Workload kinds whose every run sends prompts no earlier run sent: what a warm server may measure.
WARM_KINDS = ("concurrency", "open_loop")


class CampaignSpec(Strict):
    """Servers x workloads, plus what the report needs to judge them."""

    name: str
    description: str = ""
    model: ModelRef
    servers: Annotated[list[ServerConfig], Field(min_length=1)]
    workloads: Annotated[list[Workload], Field(min_length=1)]
    slo: Slo = Field(default_factory=Slo)
    gpu: bool = False
    kv_pool: KvPool | None = Field(
        default=None,
        description="GPU campaigns: one KV-pool size for every server, mapped to each framework's own memory "
        "knob (bakeoff.backends.kv_pool)",
    )
    measure_warm_restart: bool = Field(default=True, description="start each server a second time")
    repeats: Annotated[int, Field(ge=1, le=20)] | Literal["auto"] = Field(
        default=3,
        description="measure every cell this many times (figures then carry Student-t intervals); auto: "
        "rounds of every cell from min_repeats until every verdict is decided or max_repeats is reached",
    )
    min_repeats: Annotated[int, Field(ge=2, le=20)] = Field(
        default=2, description="repeats: auto — rounds measured before the first test"
    )
    max_repeats: Annotated[int, Field(ge=2, le=20)] | None = Field(
        default=None, description="repeats: auto — the most rounds; each test then runs at 5% / the planned looks"
    )
    min_effect: float = Field(
        default=0.05,
        description="the practical margin of the verdict, e.g. 5%: a server wins only by at least this much, and "
        "two whose interval lies within ±min_effect are equivalent (bakeoff.analysis.significance)",
    )
    interleave: bool = Field(
        default=True,
        description="run repeat 1 of every cell, then repeat 2, ... so drift (heat, a filling disk cache) "
        "favours no server; false: each cell's repeats back to back. Every repeat starts its server afresh",
    )
    warm_repeats: bool = Field(
        default=False,
        description="start each server once and keep it up across the rounds: every round measures every server "
        "on its warm start, in the same interleaved order, round r sending its own fresh requests (the same to "
        "every server); the cold start is measured once. Sweeps of fresh prompts only (bakeoff.campaign.warm)",
    )
    stop_at_saturation: bool = Field(
        default=True,
        description="a load sweep stops raising the load once every server missed the SLO (or over-saturated: "
        "throughput flat while latency climbs) at a level; the levels above are reported as skipped",
    )
    start_attempts: Annotated[int, Field(ge=1, le=5)] = Field(default=2, description="tries per server start")
    energy_usd_per_kwh: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="electricity price: adds measured energy's cost per million output tokens"
    )
    memory_bandwidth_gbs: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="memory bandwidth (GB/s) for the decode roofline; default: GPU preset or measured"
    )
    gpu_type: str | None = Field(default=None, description="campaign run --ray: GPU model for every GPU server")
    ray: RayPolicy = Field(default_factory=RayPolicy)
    client_processes: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        default="auto", description="load-generator processes per run; auto: as many as the warm-up shows are needed"
    )
    quality: QualitySpec | None = Field(default=None, description="output checks after the speed runs")
    ladder: LadderSpec | None = Field(
        default=None, description="one knob at a time on top of servers[0], kept while quality holds"
    )
    tune: TuneSpec | None = Field(default=None, description="bakeoff tune: objective, load, budget, knob ranges")
    regression: dict[str, float] = Field(
        default_factory=dict,
        description="bakeoff compare's gate: metric -> threshold, e.g. {tpot_ms_p50: 5%} (bakeoff.analysis.thresholds)",
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_shorthand(cls, value: object) -> object:
        return model_shorthand(value)

    @field_validator("min_effect", mode="before")
    @classmethod
    def _min_effect(cls, value: object) -> object:
        effect = parse_threshold("min_effect", value, where="")
        if not 0 < effect < 1:
            raise ValueError(f"min_effect: {value!r} must lie between 0% and 100%, e.g. 5%")
        return effect

    @field_validator("regression", mode="before")
    @classmethod
    def _regression(cls, value: object) -> object:
        return parse_thresholds(value)

    @model_validator(mode="after")
    def _slo_for_search(self) -> CampaignSpec:
        bounded = self.slo.preset or self.slo.ttft_ms or self.slo.ttfa_ms or self.slo.tpot_ms or self.slo.e2e_ms
        for i, wl in enumerate(self.workloads):
            if wl.searches_slo and not bounded:
                raise ValueError(f"workloads[{i}].slo_search needs an slo: set slo.preset or its bounds")
        return self

    @model_validator(mode="after")
    def _kv_pool_on_gpu(self) -> CampaignSpec:
        if self.kv_pool is not None and not self.gpu:
            raise ValueError("kv_pool sizes GPU frameworks' KV pools; set gpu: true or use kv_cache_space_gib on CPU")
        return self

    @model_validator(mode="after")
    def _auto_repeats(self) -> CampaignSpec:
        if self.repeats != "auto":
            if self.max_repeats is not None:
                raise ValueError("max_repeats applies to repeats: auto; remove it or set repeats: auto")
            return self
        if self.max_repeats is None:
            raise ValueError("repeats: auto needs max_repeats (the most rounds it may run), e.g. max_repeats: 8")
        if self.max_repeats < self.min_repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) must be at least min_repeats ({self.min_repeats})")
        if not self.interleave:
            raise ValueError("repeats: auto tests after each round of every server; it needs interleave: true")
        return self

    @model_validator(mode="after")
    def _warm_repeats(self) -> CampaignSpec:
        if not self.warm_repeats:
            return self
        if not self.interleave:
            raise ValueError("warm_repeats keeps every server up through interleaved rounds; it needs interleave: true")
        for i, wl in enumerate(self.workloads):
            # A restart is the only cache reset some servers have (llama.cpp): a warm server cannot
            # give a run that replays prompts, or measures prefix reuse, the empty cache it needs.
            replays = wl.searches_slo
            if wl.kind not in WARM_KINDS or replays:
                what = "an SLO search replays one rate's prompts" if replays else f"kind {wl.kind} reuses prompts"
                raise ValueError(
                    f"workloads[{i}] ({wl.label}): warm_repeats cannot keep its server warm ({what}, which needs an "
                    f"empty prefix cache per run); use kinds {', '.join(WARM_KINDS)} or set warm_repeats: false"
                )
        return self

    @property
    def planned_repeats(self) -> int:
        """The most repeats a cell may get: ``repeats``, or ``max_repeats`` when auto."""
        if self.repeats == "auto":
            return self.max_repeats or self.min_repeats
        return self.repeats

    @model_validator(mode="after")
    def _tune_target(self) -> CampaignSpec:
        if self.tune is not None:
            self.tune.target(self.workloads)
        return self

    @model_validator(mode="after")
    def _ladder(self) -> CampaignSpec:
        if self.ladder is None:
            return self
        if len(self.servers) != 1:
            raise ValueError("a ladder climbs from one server: list only its baseline under servers")
        if self.quality is None:
            raise ValueError("a ladder judges every step's quality: add a quality section (e.g. prompts: trained)")
        taken = [s.name for s in self.ladder.steps if s.name == self.servers[0].label]
        if taken:
            raise ValueError(f"ladder.steps[].name {taken[0]!r} is the baseline's label; rename one")
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
    if all(p is None or Path(str(p)).expanduser().is_absolute() or str(p) in PRESET_CHOICES for p in written):
        return text
    dumped = yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)
    return f"# written by bakeoff from {path.resolve()}, relative model paths made absolute\n{dumped}".encode()


def _resolve_model_paths(spec: CampaignSpec, campaign_dir: Path) -> None:
    if spec.model.path is not None:
        spec.model.path = resolve_relative(spec.model.path, campaign_dir)
    if spec.model.draft_path is not None:
        # A preset name (draft_path: trained-draft) is that preset's folder in the models folder.
        name = str(spec.model.draft_path)
        spec.model.draft_path = (
            models_dir() / name if name in PRESET_CHOICES else resolve_relative(spec.model.draft_path, campaign_dir)
        )
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
        raise SpecError(format_validation_error(str(path), exc, CampaignSpec, {"model": MODEL_FORMS})) from exc
    _resolve_model_paths(spec, path.resolve().parent)
    return spec
