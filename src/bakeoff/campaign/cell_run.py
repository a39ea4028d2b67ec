"""One cell measured: its server started, its plans run, its effort and record written.

:func:`run_cell` takes the cell's hand-over (``cell_spec.json``, :mod:`bakeoff.campaign.cell_spec`)
and is what ``bench.ipynb`` calls (through :mod:`bakeoff.campaign.execute`, which
drives the campaign's cells in order), what a Ray task runs (:mod:`bakeoff.cluster.ray_runner`)
and what a tune trial runs (:mod:`bakeoff.campaign.tune`): the cell's server is started with the
launcher its kind needs, each plan of its workload is run against it (a sweep's levels with their
saturation stop), and what the start and the build cost is kept beside the summaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bakeoff.analysis import saturation, verdict
from bakeoff.backends.knobs import effective_dtypes
from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.campaign import quality, resume, soak
from bakeoff.campaign.cell_spec import read_cell_spec
from bakeoff.campaign.cells import Cell
from bakeoff.campaign.cold_cache import CellServer
from bakeoff.campaign.rehearsal import stand_in_for
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.campaign.warm import WarmServers
from bakeoff.errors import LaunchError, ServerDiedError
from bakeoff.measure.client import ClientSettings, TokenCounter
from bakeoff.measure.load_modes import load_mode
from bakeoff.measure.metrics import cost_per_million_tokens, energy_cost_per_million_tokens
from bakeoff.measure.slo import resolve_slo, search_max_rate
from bakeoff.models.model_source import ModelSource, resolve_model
from bakeoff.results.cell_record import write_cell_record
from bakeoff.results.layout import PREFLIGHT_FILE
from bakeoff.results.store import (
    CELL_INFO,
    SUMMARY,
    read_json,
    read_summary,
    write_summary,
)
from bakeoff.results.summary import Cost, Effort, RunSummary
from bakeoff.serving import launchers
from bakeoff.serving.death_watch import watch_for
from bakeoff.serving.handle import ServerHandle
from bakeoff.serving.launchers import LaunchContext
from bakeoff.serving.trtllm_log import read_pytorch_build
from bakeoff.workloads.kinds import OpenLoop, Soak
from bakeoff.workloads.plan_store import load_plans
from bakeoff.workloads.plans import RunPlan
from bakeoff.workloads.prompts import load_tokenizer


def start_server(
    cell: Cell, source: ModelSource, served_name: str, run_dir: Path
) -> contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]:
    """Launch a cell's server with the launcher its kind needs (:mod:`bakeoff.serving.launchers`)."""
    if cell.server.model_path is not None:
        # This server's own packaging of the model (a ModelOpt export, an AWQ folder).
        source = ModelSource(hf_id=None, local_dir=cell.server.model_path)
    ctx = LaunchContext(
        cell.server, cell.backend, source, served_name, run_dir, cell.headers, cell.draft_dir, stand_in=cell.stand_in
    )
    return launchers.start_server(ctx)


def run_cell(
    cell_spec: Path,
    *,
    check_quality: bool = True,
    warm: WarmServers | None = None,
) -> dict[str, Any]:
    """Launch one server, run one workload's plans, save runs and the cell's effort record.

    ``cell_spec``: the cell's hand-over, ``CAMPAIGN/cells/ID/cell_spec.json``
    (:func:`bakeoff.campaign.cell_spec.write_cell_spec`), which holds everything it measures.
    ``check_quality``: false skips the campaign's quality set (a tune's probe runs and repeats).
    ``warm``: the campaign's warm servers (``warm_repeats``): the server is started there the first
    time and kept up for the later rounds, instead of started and stopped here.
    """
    handed = read_cell_spec(cell_spec)
    campaign_dir = cell_spec.parent.parent.parent  # CAMPAIGN/cells/ID/cell_spec.json
    spec = handed.campaign
    source = resolve_model(spec.model)
    # A rehearsal's servers are on the rehearsal launcher: the cell starts its stand-in.
    cell = handed.cell()
    if cell.rehearsed:  # the stand-in answers the quality set, and knows the checkpoint it stands in for
        cell = dataclasses.replace(cell, stand_in=stand_in_for(spec, campaign_dir, cell.server))
    cell_dir = campaign_dir / "cells" / cell.cell_id
    plans = load_plans(campaign_dir / handed.plans)
    tokenizer = load_tokenizer(source.tokenizer_dir())
    restarts: list[dict[str, Any]] = []  # restarts that emptied the prefix cache (cache_reset: restart)
    effort: dict[str, Any] = {"failed_start_attempts": [], "cache_restarts": restarts}
    summaries: dict[str, Any] = {}
    info = _started_info(cell, cell_dir)
    write_cell_record(cell_dir / CELL_INFO, info)

    def start() -> contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]:
        return start_server(cell, source, spec.model.served_name, cell_dir)

    if warm is not None:
        start = warm.starter(cell, start)

    try:
        for attempt in range(1, spec.start_attempts + 1):
            try:
                with CellServer(start, cell.backend, restarts) as server:
                    _measure_cell(
                        spec, cell, plans, tokenizer.count, server, cell_dir, effort, info, summaries, check_quality
                    )
                    if warm is not None:
                        warm.record(cell, effort)
                break
            except LaunchError as exc:
                # Failed starts (a restart's too) are part of the engineering effort: record each, then retry.
                effort["failed_start_attempts"].append(str(exc)[:2000])
                if attempt == spec.start_attempts:
                    raise
        _restart_effort(spec, cell, source, cell_dir, effort, restarts)
        info["status"] = "ok"
        info["fingerprint"] = handed.fingerprint
        info["finished_at"] = resume.now_iso()
    except (LaunchError, ServerDiedError) as exc:
        info["status"] = "failed"
        info["error"] = str(exc)[:4000]
        if isinstance(exc, ServerDiedError):
            info["server_died"] = exc.verdict
        raise
    except KeyboardInterrupt:
        info["status"] = "interrupted"
        raise
    except BaseException as exc:
        # Whatever else ends a cell early (an asyncio cancellation that outran the interrupt, a
        # bug) is recorded as such, never left "running" with nothing said; resume measures it again.
        info["status"] = "interrupted" if isinstance(exc, asyncio.CancelledError | SystemExit) else "failed"
        info["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        raise
    finally:
        info["effort"] = effort
        write_cell_record(cell_dir / CELL_INFO, info)
        _attach(cell_dir, effort, cell.server.cost_per_hour_usd, spec.energy_usd_per_kwh)
    return summaries


def _started_info(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """cell.json as the cell starts: what it is, and that it is running."""
    return {
        "server": cell.server.model_dump(mode="json"),
        "backend": cell.backend.name,
        "workload": cell.workload.label,
        "repeat": cell.repeat,
        "status": "running",
        "started_at": resume.now_iso(),
        # Attempts a resumed campaign moved aside before measuring this cell again.
        "earlier_attempts": resume.earlier_attempts(cell_dir),
    }


def _measure_cell(
    spec: CampaignSpec,
    cell: Cell,
    plans: list[RunPlan],
    count_tokens: TokenCounter,
    server: CellServer,
    cell_dir: Path,
    effort: dict[str, Any],
    info: dict[str, Any],
    summaries: dict[str, Any],
    check_quality: bool = True,
) -> None:
    """On a started server: its start-up effort (first start only), every plan, then the quality set."""
    if "server" not in effort:
        handle, launch = server.current()
        effort.update(_static_effort(cell, launch, handle))
        # What the image does with the knobs left unset, read by its own parser before the start.
        effort["server"]["image_defaults"] = image_defaults(cell_dir.parent.parent, cell.server.label)
    _run_plans(cell, spec, plans, count_tokens, server, cell_dir, effort, info, summaries)
    if spec.quality is not None and check_quality:  # after the speed runs, on the same server
        settings = client_settings(cell, server.current()[0], count_tokens)
        info["quality"] = quality.measure_cell(
            spec.quality,
            settings,
            cell_dir,
            cell.cell_id,
            prompt_logprobs=cell.backend.prompt_logprobs,
            backend=cell.backend.display_name,
        )["rates"]


def _restart_effort(
    spec: CampaignSpec,
    cell: Cell,
    source: ModelSource,
    cell_dir: Path,
    effort: dict[str, Any],
    restarts: list[dict[str, Any]],
) -> None:
    """The time cache restarts cost, and the warm restart where the campaign asks for it."""
    effort["cache_restart_s"] = sum(r["stop_s"] + r["start_s"] for r in restarts)
    if spec.warm_repeats:
        return  # one start per server: its cold start, on round 1's cell, is the only one
    if spec.measure_warm_restart and cell.repeat > 1:
        # A later repeat's start found the caches a first start filled: it is the warm restart.
        effort["warm_restart_s"] = effort.get("cold_start_s")
    elif spec.measure_warm_restart and spec.planned_repeats == 1:
        # A cache restart already was a warm restart: no extra one to time.
        effort["warm_restart_s"] = (
            restarts[0]["start_s"] if restarts else _time_restart(cell, source, spec.model.served_name, cell_dir)
        )


def client_settings(cell: Cell, handle: ServerHandle, count_tokens: TokenCounter | None) -> ClientSettings:
    """How a cell's requests are sent to its running server."""
    return ClientSettings(
        base_url=handle.base_url,
        model=handle.model,
        extra_body=dict(cell.backend.request.extra_body),
        request_timeout_s=cell.workload.request_timeout_s,
        stall_timeout_s=cell.workload.stall_timeout_s,
        count_tokens=count_tokens,
        min_tokens=cell.backend.request.min_tokens,
        headers=cell.headers,
    )


def _run_plans(
    cell: Cell,
    spec: CampaignSpec,
    plans: list[RunPlan],
    count_tokens: TokenCounter,
    server: CellServer,
    cell_dir: Path,
    effort: dict[str, Any],
    info: dict[str, Any],
    summaries: dict[str, Any],
) -> None:
    """Every plan of the cell against the ready server, then the SLO search if asked for.

    Plans already in ``summaries`` ran on an earlier start of this cell and are skipped. A load
    sweep stops raising the load once every server has saturated (:mod:`bakeoff.analysis.saturation`);
    the levels left out are recorded as skipped in ``info["saturation"]``, with where and why.
    """
    slo = resolve_slo(spec.slo)

    def execute(plan: RunPlan) -> RunSummary:
        cache = server.prepare(plan)  # may restart the server: take the handle after it
        handle, launch = server.current()
        if isinstance(cell.workload, Soak):  # its weights and KV pool, beside the memory series
            model_dir = cell.server.model_path or resolve_model(spec.model).local_dir
            soak.write_account(cell.backend, handle, launch, model_dir, cell_dir / "runs" / plan.name, cell.headers)
        settings = client_settings(cell, handle, count_tokens)
        server_info = {**effort["server"], "base_url": handle.base_url, "startup_s": handle.startup_s}
        watch = lambda: watch_for(handle)  # noqa: E731 - a fresh watch per run
        # A local server's CPU/RSS go into telemetry (pid is None for a container or an external server).
        target = RunTarget(
            settings, cell.backend, server_info, slo, show_progress=False, watch=watch, server_pid=handle.pid
        )
        target.client_processes = cell.client_processes
        target.gpus = handle.pinned_indices()  # NVML telemetry and energy from the server's own GPUs
        result = execute_plan(plan, target, cell_dir / "runs" / plan.name, cache_state=cache, repeat=cell.repeat)
        server.ran(plan)
        summaries[plan.name] = result
        return result

    def stop_here(result: RunSummary, below: RunSummary | None, level: float) -> str | None:
        why = saturation.saturation(result, below, slo) if spec.stop_at_saturation else None
        if why is None or not _everyone_saturated(cell, spec, cell_dir.parent.parent, level):
            return None
        return why

    stopped = run_sweep(plans, summaries, execute, stop_here)
    if stopped is not None:
        info["saturation"] = stopped
    wl = cell.workload
    if isinstance(wl, OpenLoop) and wl.searches_slo:  # search_max_rate takes the open loop itself
        tried = {p.rate: summaries[p.name] for p in plans if p.rate is not None and p.name in summaries}
        info["slo_search"] = search_max_rate(plans[0], wl, slo, tried, execute)


def run_sweep(
    plans: list[RunPlan],
    summaries: dict[str, Any],
    execute: Callable[[RunPlan], RunSummary],
    stop_here: Callable[[RunSummary, RunSummary | None, float], str | None],
) -> dict[str, Any] | None:
    """Run ``plans`` in order (those in ``summaries`` ran already); stop raising the load where ``stop_here`` says.

    ``stop_here(run, run at the level below, level)`` gives why the sweep may stop after this
    level. Plans without a load (conversations, traces) always run. Returns where and why it
    stopped with the plans skipped, or None when every plan ran.
    """
    below: RunSummary | None = None
    stopped: dict[str, Any] | None = None
    for plan in plans:
        level = load_mode(plan.mode).level(plan.concurrency, plan.rate)
        if stopped is not None and level is not None:
            stopped["skipped"].append(plan.name)
            continue
        result = summaries[plan.name] if plan.name in summaries else execute(plan)
        if level is None:
            continue
        why = stop_here(result, below, float(level))
        below = result
        if why is not None:
            stopped = {"after": plan.name, "why": why, "skipped": []}
    return stopped if stopped is not None and stopped["skipped"] else None


def _everyone_saturated(cell: Cell, spec: CampaignSpec, campaign_dir: Path, load: float) -> bool:
    """Every other server of the campaign saturated on this workload at or below ``load`` (earlier cells)."""
    runs = verdict.collect(campaign_dir)[0].get(cell.workload.label, ("", {}))[1]
    servers = [s.label for s in spec.servers]
    return saturation.sweep_may_stop(runs, servers, cell.server.label, load, resolve_slo(spec.slo))


def _static_effort(cell: Cell, launch: RenderedLaunch, handle: ServerHandle) -> dict[str, Any]:
    knob_costs = {k: cell.backend.knobs[k].change_needs for k in cell.backend.knobs}
    return {
        "cold_start_s": handle.startup_s,
        "image_build_s": handle.build.image_build_s,
        "engine_build_s": handle.build.engine_build_s,
        "engine_build_step": handle.build.engine_build_step,
        # True: the engine came from the cache and engine_build_s is the original build's time.
        "engine_build_cached": handle.build.engine_build_cached,
        # TensorRT-LLM's PyTorch flow builds at start (load, autotune, CUDA graphs): its log says how long.
        "pytorch_build": build.model_dump() if (build := read_pytorch_build(handle.log_path)) is not None else None,
        "flags_changed": len(launch.non_default),
        "non_default_knobs": launch.non_default,
        "config_lines": len(launch.config_text.splitlines()) if launch.config_text else 0,
        "knob_change_needs": knob_costs,
        # What the framework itself warns about for these knob values (e.g. vLLM without chunked prefill).
        "launch_warnings": list(launch.warnings),
        "server": {
            "backend": cell.backend.name,
            "label": cell.server.label,
            "knobs": launch.knobs,
            # Set or not, what each knob was (vLLM's async scheduling among them): the
            # framework's defaults move between releases, the record must not.
            "effective_knobs": launch.effective_knobs,
            "command_line": handle.command_line,
            "kind": handle.kind,
            "image": handle.image,
            "image_digest": handle.image_digest,
            "base_url": handle.base_url,
            "dtypes": effective_dtypes(cell.backend, dict(cell.server.knobs), handle.weight_types),
            "gpus": gpus.to_json() if (gpus := handle.placement.gpus) is not None else None,
        },
    }


def image_defaults(campaign_dir: Path, label: str) -> dict[str, Any] | None:
    """The defaults the server's image gave its pre-flight (None where no pre-flight read them)."""
    path = campaign_dir / PREFLIGHT_FILE
    found = read_json(path).get("servers", {}).get(label) if path.is_file() else None
    defaults = found.get("image_defaults") if isinstance(found, dict) else None
    return dict(defaults) if isinstance(defaults, dict) and defaults else None


def _time_restart(cell: Cell, source: ModelSource, served_name: str, cell_dir: Path) -> float | None:
    """Second start of the same server: caches (compiled kernels, page cache) are warm now."""
    if cell.server.url:
        return None  # not bakeoff's to restart
    started = time.monotonic()
    try:
        with start_server(cell, source, served_name, cell_dir / "restart"):
            return time.monotonic() - started
    except LaunchError:
        return None


def _attach(cell_dir: Path, effort: dict[str, Any], cost_per_hour: float | None, usd_per_kwh: float | None) -> None:
    """Add the cell's effort (and cost, energy's included at the campaign's price) to every run summary of the cell."""
    public = Effort.model_validate({k: v for k, v in effort.items() if k != "server"})
    for path in sorted((cell_dir / "runs").glob(f"*/{SUMMARY}")):
        summary = read_summary(path)
        per_token = summary.energy.j_per_output_token if summary.energy is not None else None
        cost = Cost(
            usd_per_hour=cost_per_hour,
            usd_per_million_output_tokens=cost_per_million_tokens(cost_per_hour, summary.throughput.output_tok_s),
            energy_usd_per_kwh=usd_per_kwh,
            energy_usd_per_million_output_tokens=energy_cost_per_million_tokens(per_token, usd_per_kwh),
        )
        write_summary(path, summary.model_copy(update={"effort": public, "cost": cost}))
