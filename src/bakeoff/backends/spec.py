"""Backend specs (``backends/*.yaml``): the models, the knob vocabulary and loading them.

A backend YAML declares how to start a serving framework, how to tell it is ready, where
its metrics are, and a *knob map* from bakeoff's one vocabulary of tuning knobs to the
backend's own flags, environment variables or config-file keys. Rendering refuses any
knob the backend lacks, or a value it does not accept, naming both, before anything runs.

A knob may also feed an *engine build* (TensorRT-LLM's engine flow): ``build_step`` names
the ``engine_build.steps`` entry its flag is appended to, and such a knob always costs a
rebuild to change. A ``tune:`` block declares the knob space ``bakeoff tune`` searches
(:mod:`bakeoff.backends.tune_space`). Rendering a launch or an engine build for one knob set is
:mod:`bakeoff.backends.launch_render`; the build itself, timed and cached, lives in
:mod:`bakeoff.serving.engine_build`.
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bakeoff.backends.tune_space import KnobValue as KnobValue  # re-exported: every knob value's type
from bakeoff.backends.tune_space import TuneSpace
from bakeoff.errors import SpecError
from bakeoff.paths import BACKENDS_ENV, backend_dirs, shipped
from bakeoff.schema import format_validation_error

# The shared vocabulary: every backend maps a subset of these, never anything else.
KNOB_VOCABULARY: dict[str, str] = {
    "max_num_seqs": "most requests batched together (running sequences)",
    "max_num_batched_tokens": "token budget of one scheduler step (prefill chunk size)",
    "gpu_memory_utilization": "memory share for weights + KV cache (meaning differs per backend)",
    "chunked_prefill": "split long prefills into chunks interleaved with decodes",
    "prefix_caching": "reuse KV cache of repeated prompt prefixes",
    "kv_cache_dtype": "KV cache element type",
    "quantization": "weight quantization method of the checkpoint",
    "speculative": "speculative decoding method",
    "max_model_len": "longest context (prompt + output) accepted",
    "tensor_parallel_size": "GPUs one model is sharded across",
    "kv_cache_space_gib": "CPU KV cache size in GiB (CPU backends)",
    "threads": "CPU threads used for compute (CPU backends)",
    "num_speculative_tokens": "tokens proposed per speculative step (with speculative set)",
    "dtype": "weight and activation precision (auto = the checkpoint's)",
    "enforce_eager": "no graph compilation or CUDA graphs: quicker starts, slower steps",
    "reasoning_parser": "split a reasoning model's thinking into its own stream field (which model family's tags)",
    "async_scheduling": "schedule the next step on the CPU while the GPU runs the current one",
}

# The backends that ship with bakeoff (bakeoff.paths resolves them for every kind of install).
BACKENDS_DIR = shipped("backends")

# Where a draft model for speculative decoding is expected inside the server's container;
# value maps write ``{draft_model}`` and rendering fills it in.
DRAFT_MOUNT = "/draft"

ChangeCost = Literal["nothing", "restart", "rebuild"]
# What a memory-share knob is a share of (backends.kv_pool maps one KV-pool intent through it).
MemoryBasis = Literal["total", "total_static", "free_after_load"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PinSpec(_Strict):
    """A knob whose framework default moves between releases or methods, set alike across a campaign."""

    knob: str = Field(description="when any server of this backend sets this knob to a method that renders")
    value: KnobValue = Field(description="every server of this backend leaving the pinned knob unset gets this")


class CpuNeed(_Strict):
    """The CPU features a knob value needs on the host its server runs on.

    Flags are spelled as ``/proc/cpuinfo`` spells them; the host must have every flag of at
    least one set in ``any_of`` (e.g. AVX-512's four, or AMX's tile flag).
    """

    any_of: list[list[str]] = Field(min_length=1, description="flag sets; the host needs every flag of one")
    reason: str = Field(min_length=1, description="why, from the framework's own code")


class GpuNeed(_Strict):
    """The GPU compute capability a knob value needs (``8.9`` is SM89: Ada; ``9.0``: Hopper)."""

    min_capability: float = Field(gt=0, description="lowest compute capability, as nvidia-smi's compute_cap")
    reason: str = Field(min_length=1, description="why, from the framework's own code")


class KnobSpec(_Strict):
    """How one vocabulary knob reaches a backend, and which values it accepts.

    ``value_map`` translates a vocabulary value to the native one: ``null`` renders
    nothing, a list renders as several argv words after the flag, a mapping becomes
    compact JSON for a flag (or a nested value for a config key).
    """

    type: Literal["int", "float", "bool", "str"]
    default: KnobValue | None = Field(description="the backend's own default when unset")
    flag: str | None = Field(default=None, description="value flag: '--flag VALUE'")
    true_flag: str | None = Field(default=None, description="bool: flag passed for true")
    false_flag: str | None = Field(default=None, description="bool: flag passed for false")
    env: str | None = Field(default=None, description="environment variable instead of a flag")
    config_key: str | None = Field(default=None, description="dotted key in the config file")
    build_step: int | None = Field(default=None, description="engine_build step the knob feeds")
    build_flag: str | None = Field(default=None, description="flag appended to that build step")
    model_file: bool = Field(
        default=False, description="renders nothing: the launcher picks the model file for this value"
    )
    value_map: dict[str, Any] = Field(default_factory=dict, description="vocabulary -> native")
    choices: list[KnobValue] | None = None
    minimum: float | None = None
    maximum: float | None = None
    change_needs: ChangeCost = "restart"
    always_set: bool = Field(default=False, description="render even when left at default")
    default_resolved: bool = Field(
        default=False,
        description="the framework declares None and resolves it at start to this default (read in its code)",
    )
    fills: str | None = Field(
        default=None, description="renders nothing itself: its value fills {this knob} in that knob's value"
    )
    refused_values: dict[str, str] = Field(
        default_factory=dict, description="value -> why this framework version cannot take it"
    )
    value_warnings: dict[str, str] = Field(
        default_factory=dict, description="value -> the framework's warning, carried into the report"
    )
    needs_model_dtype: list[str] = Field(
        default_factory=list, description="values the framework refuses unless the model dtype is the same"
    )
    needs_gpu: dict[str, GpuNeed] = Field(
        default_factory=dict, description="value -> the GPU compute capability the framework needs for it"
    )
    needs_cpu: dict[str, CpuNeed] = Field(
        default_factory=dict, description="value -> the host CPU features the framework needs for it"
    )
    pin_with: PinSpec | None = None
    memory_basis: MemoryBasis | None = Field(
        default=None,
        description="gpu_memory_utilization: what its share is of (total: weights + activations + KV; "
        "total_static: weights + KV; free_after_load: memory left after weights and buffers)",
    )
    note: str = ""

    @model_validator(mode="after")
    def _one_target(self) -> KnobSpec:
        targets = [self.flag, self.env, self.config_key, self.true_flag or self.false_flag, self.model_file or None]
        count = sum(t is not None for t in targets)
        if count > 1 or (count == 0 and self.build_step is None and self.fills is None):
            raise ValueError(
                "a knob needs exactly one of flag, true_flag/false_flag, env, config_key, model_file "
                "(or only build_step for a knob that exists in the engine build alone, "
                "or only fills for a knob that is a parameter of another)"
            )
        if self.fills is not None and count:
            raise ValueError("a knob with fills renders through the knob it fills; drop its own target")
        if (self.true_flag or self.false_flag) and self.type != "bool":
            raise ValueError("true_flag/false_flag only fit type: bool")
        if self.build_flag is not None and self.build_step is None:
            raise ValueError("build_flag needs build_step")
        if self.build_step is not None and self.change_needs != "rebuild":
            # Whatever is compiled into the engine can only change by building it again.
            raise ValueError("a knob baked into the engine (build_step) needs change_needs: rebuild")
        return self


class HealthSpec(_Strict):
    path: str = "/health"
    timeout_s: Annotated[float, Field(gt=0)] = 600.0
    interval_s: Annotated[float, Field(gt=0)] = 0.5


class IterationStatsSpec(_Strict):
    """A JSON endpoint of per-iteration engine stats (TensorRT-LLM's ``/metrics``)."""

    path: str = "/metrics"
    draining: bool = Field(default=True, description="each GET removes what it returned")
    # logical name -> dotted path inside one iteration record, e.g. kvCacheStats.cacheHitRate
    fields: dict[str, str] = Field(default_factory=dict)


class MetricsSpec(_Strict):
    path: str | None = "/metrics"
    format: Literal["prometheus", "json", "none"] = "prometheus"
    # logical name -> the backend's metric name (e.g. prefix_cache_hits -> vllm:prefix_cache_hits)
    names: dict[str, str] = Field(default_factory=dict)
    # Logical names whose counter the framework creates at its first increment: absent from a
    # scrape that answered, it stands at 0 (SGLang's cached_tokens_total before the first hit).
    lazy: list[str] = Field(default_factory=list)
    iteration_stats: IterationStatsSpec | None = None

    @model_validator(mode="after")
    def _lazy_are_mapped(self) -> MetricsSpec:
        unmapped = [n for n in self.lazy if n not in self.names]
        if unmapped:
            raise ValueError(f"metrics.lazy names {unmapped} that metrics.names does not map; add them or drop them")
        return self


class CacheResetSpec(_Strict):
    kind: Literal["http", "restart", "none"]
    method: Literal["GET", "POST"] = "POST"
    path: str | None = None
    env: dict[str, str] = Field(default_factory=dict, description="env the endpoint needs")


class RequestQuirks(_Strict):
    extra_body: dict[str, Any] = Field(default_factory=dict)
    rejects_unknown_fields: bool = False
    usage_in_stream: Literal["separate_chunk", "finish_chunk", "absent"] = "separate_chunk"
    reports_cached_tokens: bool = False
    # Send min_tokens = max_tokens: ignore_eos alone misses the extra EOS ids of some models.
    min_tokens: bool = False

    @model_validator(mode="after")
    def _min_tokens_in_body(self) -> RequestQuirks:
        if "min_tokens" in self.extra_body:
            raise ValueError("request.extra_body.min_tokens: use request.min_tokens: true (sent per request)")
        return self


class ContainerSpec(_Strict):
    image: str = Field(description="pinned tag; the digest is recorded at run time")
    gpus: bool = False
    ipc_host: bool = False
    shm_size: str | None = None
    ulimits: list[str] = Field(default_factory=list)
    container_port: int = 8000
    model_mount: str = "/model"
    build: str | None = Field(default=None, description="docker/ folder that builds the image")
    cuda_major: int | None = Field(default=None, description="CUDA major the image is built for (GPU images)")
    cuda_minor: int = Field(default=0, ge=0, description="CUDA minor of that build (12.9: cuda_minor 9)")
    cuda_images: dict[int, str] = Field(
        default_factory=dict, description="the same release built for other CUDA majors: major -> image"
    )


class ConfigFileSpec(_Strict):
    flag: str = Field(description="flag that points the server at the rendered file")
    filename: str = "options.yaml"
    base: dict[str, Any] = Field(default_factory=dict)


class EngineBuildSpec(_Strict):
    """TensorRT-LLM's engine flow: a separate, cached build step whose inputs key the cache.

    Steps run in ``image`` with ``{model}`` (the checkpoint, read-only), ``{checkpoint_dir}``
    and ``{engine_dir}`` filled in. The built engine folder is then served as the model.
    """

    image: str
    steps: list[list[str]] = Field(min_length=1)
    knobs_baked_in: list[str] = Field(default_factory=list)


class AuditSpec(_Strict):
    """Where ``bakeoff backends audit`` reads this framework's definitions from."""

    distribution: str | None = Field(description="the wheel's name on the package index; null: none is published")
    packages: list[str] = Field(default_factory=list, description="folders/files of the wheel that declare flags")
    note: str = Field(default="", description="said instead of an audit when there is no wheel")


class BackendSpec(_Strict):
    name: str
    display_name: str
    description: str = ""
    runtime: Literal["process", "container"]
    accelerator: Literal["cpu", "gpu"] = "cpu"
    version: str = ""
    python: Literal["harness", "engine"] = Field(
        default="harness",
        description="interpreter {python} renders to: the harness's, or the engine environment's",
    )
    model_format: Literal["hf", "gguf"] = Field(default="hf", description="gguf: converted first")
    prefix_cache_granularity: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="tokens per prefix-cache block: only whole shared blocks are reused (1: any shared token run)",
    )
    prompt_logprobs: bool = Field(
        default=False,
        description="its /v1/completions returns prompt logprobs (vLLM's prompt_logprobs): the quality set's "
        "perplexity items are scored there (bakeoff.campaign.perplexity)",
    )
    rehearsal_profile: Literal["vllm", "sglang", "trtllm"] | None = Field(
        default=None, description="reference-server profile that stands in for this backend in a rehearsal"
    )
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    container: ContainerSpec | None = None
    config_file: ConfigFileSpec | None = None
    engine_build: EngineBuildSpec | None = None
    health: HealthSpec = Field(default_factory=HealthSpec)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    cache_reset: CacheResetSpec = Field(default_factory=lambda: CacheResetSpec(kind="restart"))
    request: RequestQuirks = Field(default_factory=RequestQuirks)
    knobs: dict[str, KnobSpec] = Field(default_factory=dict)
    # vocabulary knobs this backend deliberately lacks -> why; quoted when one is asked for
    unsupported: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    audit: AuditSpec | None = None
    preflight: Literal["vllm", "sglang", "trtllm"] | None = Field(
        default=None, description="whose own parser `bakeoff campaign preflight` checks the rendered launch with"
    )
    tune: TuneSpace | None = Field(default=None, description="what bakeoff tune searches (backends.tune_space)")

    @model_validator(mode="after")
    def _consistent(self) -> BackendSpec:
        unknown = sorted((set(self.knobs) | set(self.unsupported)) - set(KNOB_VOCABULARY))
        if unknown:
            raise ValueError(f"knobs outside bakeoff's vocabulary: {', '.join(unknown)}")
        both = sorted(set(self.knobs) & set(self.unsupported))
        if both:
            raise ValueError(f"knobs both mapped and listed as unsupported: {', '.join(both)}")
        if self.tune is not None:
            unmapped = sorted(self.tune.named() - set(self.knobs))
            if unmapped:
                raise ValueError(f"tune names knobs this backend does not map: {', '.join(unmapped)}")
        if self.runtime == "container" and self.container is None:
            raise ValueError("runtime: container needs a 'container' section")
        if any(k.config_key for k in self.knobs.values()) and self.config_file is None:
            raise ValueError("knobs with config_key need a 'config_file' section")
        for name, knob in self.knobs.items():
            if knob.memory_basis is not None and name != "gpu_memory_utilization":
                raise ValueError(f"knob {name!r}: memory_basis belongs on gpu_memory_utilization only")
            if knob.fills is not None and knob.fills not in self.knobs:
                raise ValueError(f"knob {name!r} fills {knob.fills!r}, which this backend does not map")
            if knob.pin_with is not None and knob.pin_with.knob not in self.knobs:
                raise ValueError(
                    f"knob {name!r} is pinned with {knob.pin_with.knob!r}, which this backend does not map"
                )
        self._check_engine_knobs()
        return self

    def _check_engine_knobs(self) -> None:
        baked = {name for name, k in self.knobs.items() if k.build_step is not None}
        if baked and self.engine_build is None:
            raise ValueError("knobs with build_step need an 'engine_build' section")
        if self.engine_build is None:
            return
        listed = set(self.engine_build.knobs_baked_in)
        if listed != baked:
            raise ValueError(
                "engine_build.knobs_baked_in must list exactly the knobs with build_step; "
                f"listed {sorted(listed)}, with build_step {sorted(baked)}"
            )
        for name in baked:
            step = self.knobs[name].build_step
            assert step is not None
            if not 0 <= step < len(self.engine_build.steps):
                raise ValueError(f"knob {name!r}: build_step {step} is not an engine_build step")


# A folder of the user's own backend YAMLs, searched before the shipped ones.
BACKENDS_DIR_ENV = BACKENDS_ENV
# libyaml's parser where PyYAML was built with it (the same safe constructors, several times
# faster than the pure-Python one): a backend is read again by every command and cell.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _backend_dirs(directory: Path | None) -> list[Path]:
    # $BAKEOFF_BACKENDS_DIR or ./backends, then the shipped ones: see bakeoff.paths.
    return [directory] if directory is not None else backend_dirs()


def load_backend(name: str, directory: Path | None = None) -> BackendSpec:
    """Read ``NAME.yaml`` (``$BAKEOFF_BACKENDS_DIR`` first, then ``backends/``); an unknown name lists them."""
    dirs = _backend_dirs(directory)
    path = next((d / f"{name}.yaml" for d in dirs if (d / f"{name}.yaml").is_file()), dirs[-1] / f"{name}.yaml")
    if not path.is_file():
        known = ", ".join(sorted({p.stem for d in dirs for p in d.glob("*.yaml")})) or "none"
        raise SpecError(f"unknown backend {name!r}; known backends: {known}")
    # ${VAR} in a spec (e.g. ${NGC_REGISTRY} in TensorRT-LLM's image) comes from the
    # environment; unset ones stay visible and are refused when a launch needs them.
    text = string.Template(path.read_text()).safe_substitute(os.environ)
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError:
        raw = yaml.safe_load(text)  # raises again, with the pure-Python parser's quoted line and caret
    try:
        return BackendSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(str(path), exc)) from exc


def list_backends(directory: Path | None = None) -> list[str]:
    return sorted({p.stem for d in _backend_dirs(directory) for p in d.glob("*.yaml")})
