"""A campaign before anything runs: its cells, every check, and the plans written once.

A cell is one server configuration (backend + knobs) with one workload, and one repeat of
that pair. :func:`expand` makes the cells in the order they run (:func:`order_repeats`),
checking knobs, context lengths, metric needs, draft models and KV dtypes;
:func:`validate_campaign` is that check on its own (``bakeoff campaign validate``), and
:func:`prepare` adds the campaign copy and the request plans every backend replays.
Running the cells is :mod:`bakeoff.campaign.execute`.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from bakeoff.backends.knobs import apply_pins
from bakeoff.backends.kv_pool import apply_kv_pool
from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import BackendSpec, KnobValue, load_backend
from bakeoff.campaign import quality
from bakeoff.campaign.campaign_input import CampaignInput, as_input
from bakeoff.campaign.rehearsal import write_marker
from bakeoff.campaign.specs import CampaignSpec, campaign_copy, load_campaign
from bakeoff.errors import KnobError, SpecError
from bakeoff.host.cpu_checks import check_cpu_needs, host_cpu_flags
from bakeoff.host.gpu_checks import (
    KvDtype,
    check_draft_models,
    check_kv_dtypes,
    check_model_dtype,
    effective_kv_dtype,
)
from bakeoff.host.gpus import gpu_available
from bakeoff.measure.auth import request_headers
from bakeoff.models.model_source import resolve_model
from bakeoff.models.presets import resolve_model_dir
from bakeoff.observe.telemetry import has_prefix_cache_counters
from bakeoff.results.layout import CAMPAIGN_COPY, REHEARSAL_MARKER, cell_folder_name
from bakeoff.results.store import atomic_write_bytes
from bakeoff.serving import launchers
from bakeoff.serving.engine_env import engine_python
from bakeoff.serving.images import image_with_tag
from bakeoff.serving.stand_in_quality import StandIn
from bakeoff.workloads.kinds import MultiTurn, Trace, Workload
from bakeoff.workloads.plan_store import plan_inputs, plans_match, save_plans
from bakeoff.workloads.plans import PlanBuilder
from bakeoff.workloads.prompts import PromptFactory, load_tokenizer
from bakeoff.workloads.traces.plan import check_fits


@dataclass
class Cell:
    server: ServerConfig
    backend: BackendSpec
    workload: Workload
    # Authorization (from api_key_env) and extra headers: sent, never written anywhere.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    draft_dir: Path | None = None  # model.draft_path: mounted at /draft for speculative knobs
    client_processes: int | None = None  # load-generator processes per run; None: decided from the warm-up
    repeat: int = 1  # which repeat of the server x workload pair (1-based); each has its own folder
    stand_in: StandIn | None = None  # a rehearsal's quality answers (bakeoff.campaign.rehearsal.stand_in_for)

    @property
    def rehearsed(self) -> bool:
        """A rehearsal's cell (its server on the rehearsal launcher): GPU containers replaced by stand-ins."""
        return self.server.rehearsed

    @property
    def cell_id(self) -> str:
        return cell_folder_name(self.server.label, self.workload.label, self.repeat)


def order_repeats(cells: list[Cell], repeats: int, interleave: bool) -> list[Cell]:
    """Every cell ``repeats`` times: round 1 of all cells, then round 2, ... (or each cell's back to back).

    Interleaved, a slow drift of the machine (heat, page cache, a neighbour) spreads over
    every server instead of landing on whichever ran last, and the order is counterbalanced:
    even rounds run the cells in reverse (a b / b a / a b), so no server always runs first.
    """
    if interleave:
        return [replace(c, repeat=r) for r in range(1, repeats + 1) for c in (cells if r % 2 else cells[::-1])]
    return [replace(c, repeat=r) for c in cells for r in range(1, repeats + 1)]


def _context_limit(server: ServerConfig, model_dir: Path | None, declared: int | None) -> int | None:
    if "max_model_len" in server.knobs:
        return int(server.knobs["max_model_len"])
    folder = server.model_path or model_dir
    if folder is not None and (folder / "config.json").is_file():
        value = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
        return int(value) if value else declared
    return declared


def check_metric_support(where: str, wl: Workload, backend: BackendSpec) -> None:
    # A hit-rate gauge (last batch only) does not count: it cannot verify a run.
    counted = has_prefix_cache_counters(backend) or backend.request.reports_cached_tokens
    if isinstance(wl, MultiTurn) and wl.verify_reuse and not counted:
        raise SpecError(
            f"{where}.verify_reuse: backend {backend.name!r} exposes no prefix-cache counters "
            "and no cached_tokens in usage; set verify_reuse: false for it"
        )


# A release tag (v0.31.0, 1.3.0rc14, v0.5.18-cu129): the framework version it runs.
_RELEASE_TAG = re.compile(r"^v?(\d+\.\d+\.\d+[A-Za-z0-9.]*?)(?:-cu\d+)?$")


def with_image_tag(backend: BackendSpec, tag: str | None, where: str) -> BackendSpec:
    """The backend with the campaign's image tag (a new release is a config change), its CUDA variants too.

    A tag naming a release also becomes the backend's version, so refusals quote it and the
    run records it; another tag (``latest``, a build name) keeps the declared version.
    """
    if tag is None:
        return backend
    if backend.container is None:
        raise SpecError(f"{where}: backend {backend.name!r} runs as a process, not an image; remove image_tag")

    container = backend.container.model_copy(
        update={
            "image": image_with_tag(backend.container.image, tag),
            "cuda_images": {m: image_with_tag(i, tag) for m, i in backend.container.cuda_images.items()},
        }
    )
    release = _RELEASE_TAG.match(tag)
    version = release.group(1) if release else backend.version
    return backend.model_copy(update={"container": container, "version": version})


def expand(spec: CampaignSpec, model_dir: Path | None, only: list[str] | None = None) -> list[Cell]:
    """Servers x workloads, with every knob, context length and metric need checked."""
    labels = [s.label for s in spec.servers]
    unknown = sorted(set(only or []) - set(labels))
    if unknown:
        raise SpecError(f"--only {', '.join(unknown)}: no such server label; labels: {', '.join(labels)}")
    cells = []
    launches: list[tuple[str, BackendSpec, dict[str, KnobValue]]] = []
    kv_dtypes: list[KvDtype] = []
    backends = [
        with_image_tag(load_backend(s.backend), s.image_tag, f"servers[{i}].image_tag")
        for i, s in enumerate(spec.servers)
    ]
    # Pinned knobs (vLLM's async scheduling where speculative methods are compared) are
    # written into the server's knobs, so the run records and renders them like set ones.
    pinned = apply_pins([(b, dict(s.knobs)) for b, s in zip(backends, spec.servers, strict=True)])
    # One KV-pool intent becomes each framework's own memory knob (bakeoff.backends.kv_pool), likewise written in.
    sized = apply_kv_pool(
        spec.kv_pool,
        [
            (f"servers[{i}] ({s.label})", b, k)
            for i, (s, b, k) in enumerate(zip(spec.servers, backends, pinned, strict=True))
        ],
    )
    servers = [s.model_copy(update={"knobs": k}) for s, k in zip(spec.servers, sized, strict=True)]
    # The CPU engines bakeoff starts run on this host: a knob value their build lacks kernels for is refused here.
    flags = host_cpu_flags()
    for i, (server, backend) in enumerate(zip(servers, backends, strict=True)):
        where = f"servers[{i}]"
        if backend.accelerator == "gpu" and not spec.gpu:
            raise SpecError(f"{where}.backend: {backend.name} needs a GPU; set gpu: true in the campaign")
        try:
            render_launch(backend, server.knobs, model="/model", served_model_name="m", port=8000)
        except KnobError as exc:  # located as a schema error is: the path of the knobs the user wrote
            raise KnobError(f"servers.{i}.knobs ({server.label}): {exc}") from None
        check_model_dtype(where, backend, dict(server.knobs), server.model_path or model_dir)
        if backend.accelerator == "cpu" and server.url is None:
            check_cpu_needs(f"{where}.knobs.", backend, dict(server.knobs), flags)
        headers = request_headers(
            server.api_key_env, server.headers, where=f"{where}.api_key_env", where_headers=f"{where}.headers"
        )
        launches.append((where, backend, dict(server.knobs)))
        kv_dtypes.append(effective_kv_dtype(server.label, dict(server.knobs), server.model_path or model_dir))
        limit = _context_limit(server, model_dir, spec.model.context_len)
        for j, wl in enumerate(spec.workloads):
            if isinstance(wl, Trace):  # counts the trace's rows that do not fit, or clips them
                check_fits(wl, limit, f"workloads[{j}] ({wl.label})", f"{where} ({server.label})")
            elif limit is not None and (need := wl.longest_request()) > limit:
                raise SpecError(
                    f"workloads[{j}] ({wl.label}): prompt + output need up to {need} tokens but "
                    f"{where} ({server.label}) accepts {limit}; shorten the workload or raise max_model_len"
                )
            check_metric_support(f"workloads[{j}]", wl, backend)
            if only and server.label not in only:
                continue
            procs = None if spec.client_processes == "auto" else spec.client_processes
            cells.append(Cell(server, backend, wl, headers, spec.model.draft_path, procs))
    if spec.ladder is not None:  # every step's knobs, before the baseline starts
        base = spec.servers[0]
        backend = load_backend(base.backend)
        knobs = dict(base.knobs)
        for i, step in enumerate(spec.ladder.steps):
            # Each step on top of every earlier one: a rolled-back step only leaves out knobs.
            knobs = {**knobs, **step.knobs}
            try:
                render_launch(backend, knobs, model="/model", served_model_name="m", port=8000)
                if backend.accelerator == "cpu" and base.url is None:
                    check_cpu_needs(f"ladder.steps[{i}].knobs.", backend, knobs, flags)
            except SpecError as exc:
                raise SpecError(f"ladder.steps[{i}] ({step.name}): {exc}") from exc
            launches.append((f"ladder.steps[{i}]", backend, dict(knobs)))
    check_draft_models(launches, spec.model.draft_path)
    check_kv_dtypes(kv_dtypes)
    if spec.quality is not None:
        quality.check_spec(spec.quality)
    return order_repeats(cells, spec.planned_repeats, spec.interleave)


def rehearsal_cells(cells: list[Cell]) -> list[Cell]:
    """The cells with their servers on the rehearsal launcher (a rehearsal's pre-flight of the campaign as written)."""
    return [replace(c, server=c.server.for_rehearsal()) for c in cells]


def validate_campaign(path: Path) -> list[Cell]:
    """Everything short of running: schema, backends, knobs, context lengths, metrics.

    Model folders are checked when the campaign can run on this machine; a GPU campaign
    validated on a CPU machine is checked against ``model.context_len`` instead.
    """
    spec = load_campaign(path)
    model_dir: Path | None
    try:
        model_dir = resolve_model(spec.model).local_dir
        for i, server in enumerate(spec.servers):
            if server.model_path is not None:
                resolve_model_dir(None, server.model_path, field=f"servers[{i}].model_path")
        if spec.model.draft_path is not None:
            resolve_model_dir(None, spec.model.draft_path, field="model.draft_path")
    except SpecError:
        if spec.model.path is not None and not (spec.gpu and not gpu_available()):
            raise
        model_dir = None  # a preset not generated yet, or a GPU model that lives elsewhere
    return expand(spec, model_dir)


def prepare(
    campaign: Path | CampaignInput, out_dir: Path, only: list[str] | None = None
) -> tuple[CampaignSpec, list[Cell]]:
    """Validate, copy the campaign and write every workload's plan once, for all backends.

    A rehearsal copies the scaled-down campaign it actually runs, beside its marker file.
    """
    run = as_input(campaign)
    spec = run.spec
    source = resolve_model(spec.model)
    cells = expand(spec, source.local_dir, only)
    for cell in cells:
        if cell.backend.python == "engine" and launchers.server_kind(cell.backend, cell.server).local_engine:
            engine_python()  # before any server starts: a missing engine environment names its fix
    out_dir.mkdir(parents=True, exist_ok=True)
    if run.stood_in is not None:
        text = yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)
        atomic_write_bytes(out_dir / CAMPAIGN_COPY, text.encode())
        write_marker(out_dir, run.path, run.stood_in)
    else:
        atomic_write_bytes(out_dir / CAMPAIGN_COPY, campaign_copy(run.path, spec))
        (out_dir / REHEARSAL_MARKER).unlink(missing_ok=True)
    limits = [_context_limit(s, source.local_dir, spec.model.context_len) for s in spec.servers]
    builder = PlanBuilder(
        PromptFactory(load_tokenizer(source.tokenizer_dir())),
        context_limit=min((n for n in limits if n is not None), default=None),
    )
    tokenizer_file = source.tokenizer_dir() / "tokenizer.json"
    # Warm repeats: round r's own requests (seed + r - 1), the same for every server in it; a
    # warm server has already seen round 1's.
    rounds = range(1, spec.planned_repeats + 1) if spec.warm_repeats else range(1, 2)
    for wl in spec.workloads:
        for r in rounds:
            planned = wl if r == 1 else wl.model_copy(update={"seed": wl.seed + r - 1})
            folder = plans_dir(out_dir, wl.label, r, warm=spec.warm_repeats)
            # Plans are made once and replayed on re-runs, unless the workload or what it was planned from changed.
            inputs = plan_inputs(planned, tokenizer_file, builder.context_limit)
            if not plans_match(folder, planned.model_dump(mode="json"), inputs):
                shutil.rmtree(folder, ignore_errors=True)
                save_plans(builder.build(planned), folder, inputs)
    return spec, cells


def plans_dir(campaign_dir: Path, workload: str, repeat: int = 1, *, warm: bool = False) -> Path:
    """Where a cell's request plans are: the workload's, or with warm repeats its round's (round 1: the same)."""
    if warm and repeat > 1:
        return campaign_dir / "plans-by-round" / f"r{repeat}" / workload
    return campaign_dir / "plans" / workload
