"""Campaigns end to end: run every cell through its notebook, then the report.

The cells and their checks come from :mod:`bakeoff.campaign.cells`. ``bench.ipynb``
runs a cell (launch, load, save, its own plots) by calling :func:`run_cell`;
``compare.ipynb`` turns all cells into the comparison, exported to ``report.html``.
Everything a run needs is checked (:func:`bakeoff.campaign.cells.validate_campaign`)
before any server starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml

from bakeoff.analysis import saturation, verdict
from bakeoff.campaign import quality, resume, soak
from bakeoff.campaign.cells import Cell, expand, plans_dir, prepare
from bakeoff.campaign.cold_cache import CellServer
from bakeoff.campaign.doctor_run import refuse_on_problems, run_doctor
from bakeoff.campaign.ladder import LadderResult, StepOutcome, decide, outcome_of, waterfall_markdown
from bakeoff.campaign.preflight import preflight_cells, refuse_on_failure
from bakeoff.campaign.progress import CampaignProgress, cell_estimate, cell_result
from bakeoff.campaign.rehearsal import stand_in_for
from bakeoff.campaign.runner import RunTarget, execute_plan, salvage_runs
from bakeoff.campaign.smoke import run_smoke
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.campaign.warm import WarmServers
from bakeoff.errors import LaunchError, ServerDiedError, SmokeFailedError, SpecError
from bakeoff.history.archive import archive_after_run, history_root
from bakeoff.history.calibration import calibrate
from bakeoff.measure.client import ClientSettings, TokenCounter
from bakeoff.measure.metrics import cost_per_million_tokens, energy_cost_per_million_tokens
from bakeoff.measure.slo import resolve_slo, search_max_rate
from bakeoff.models.model_source import ModelSource, resolve_model
from bakeoff.notebook import kernelrun
from bakeoff.notebook.htmlexport import export_html
from bakeoff.notebook.kernelrun import kernel_environment
from bakeoff.observe.origin import versions
from bakeoff.paths import notebook, notebook_kernel, reports_dir
from bakeoff.results.layout import (
    AUTO_REPEATS,
    CAMPAIGN_COPY,
    LADDER_FILE,
    LADDER_MARKDOWN,
    PREFLIGHT_FILE,
    QUALITY_FILE,
    REHEARSAL_TAG,
    is_rehearsal,
    load_cells,
)
from bakeoff.results.smoke import SMOKE_FILE
from bakeoff.results.store import (
    CELL_INFO,
    SUMMARY,
    atomic_write_bytes,
    read_json,
    read_summary,
    write_json,
    write_summary,
)
from bakeoff.results.summary import Cost, Effort, RunSummary
from bakeoff.serving import launchers
from bakeoff.serving.containers import reap_containers
from bakeoff.serving.death_watch import watch_for
from bakeoff.serving.knobs import effective_dtypes
from bakeoff.serving.launch_render import RenderedLaunch
from bakeoff.serving.launchers import LaunchContext
from bakeoff.serving.preflight import PreflightResult
from bakeoff.serving.process import ServerHandle, reap_leftovers
from bakeoff.serving.server_config import ServerConfig
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
    return launchers.start_server(ctx, rehearse=cell.rehearse)


def cell_fingerprint(cell: Cell, campaign_dir: Path, *, warm: bool = False) -> dict[str, Any]:
    """What a finished cell's measurement depends on (:func:`bakeoff.campaign.resume.fingerprint`)."""
    return resume.fingerprint(
        plans_dir(campaign_dir, cell.workload.label, cell.repeat, warm=warm),
        cell.server.model_dump(mode="json"),
        cell.backend.model_dump(mode="json"),
        versions(cell.backend),
    )


def run_cell(
    campaign_dir: Path,
    server_label: str,
    workload_name: str,
    repeat: int = 1,
    *,
    check_quality: bool = True,
    warm: WarmServers | None = None,
) -> dict[str, Any]:
    """Launch one server, run one workload's plans, save runs and the cell's effort record.

    ``repeat``: which repeat of the pair to measure (its own cell folder; see :func:`order_repeats`).
    ``check_quality``: false skips the campaign's quality set (a tune's probe runs and repeats).
    ``warm``: the campaign's warm servers (``warm_repeats``): the server is started there the first
    time and kept up for the later rounds, instead of started and stopped here.
    """
    spec = load_campaign(campaign_dir / CAMPAIGN_COPY)
    source = resolve_model(spec.model)
    cell = _find_cell(spec, source, campaign_dir, server_label, workload_name, repeat)
    if cell.rehearse:  # the stand-in answers the quality set, and knows the checkpoint it stands in for
        cell = dataclasses.replace(cell, stand_in=stand_in_for(spec, campaign_dir, cell.server))
    cell_dir = campaign_dir / "cells" / cell.cell_id
    plans = load_plans(plans_dir(campaign_dir, workload_name, repeat, warm=spec.warm_repeats))
    tokenizer = load_tokenizer(source.tokenizer_dir())
    restarts: list[dict[str, Any]] = []  # restarts that emptied the prefix cache (cache_reset: restart)
    effort: dict[str, Any] = {"failed_start_attempts": [], "cache_restarts": restarts}
    summaries: dict[str, Any] = {}
    info = _started_info(cell, cell_dir)
    write_json(cell_dir / CELL_INFO, info)

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
        info["fingerprint"] = cell_fingerprint(cell, campaign_dir, warm=spec.warm_repeats)
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
    finally:
        info["effort"] = effort
        write_json(cell_dir / CELL_INFO, info)
        _attach(cell_dir, effort, cell.server.cost_per_hour_usd, spec.energy_usd_per_kwh)
    return summaries


def _find_cell(
    spec: CampaignSpec, source: ModelSource, campaign_dir: Path, server_label: str, workload_name: str, repeat: int
) -> Cell:
    """The campaign's cell of this server, workload and repeat."""
    for c in expand(spec, source.local_dir, rehearse=is_rehearsal(campaign_dir)):
        if c.server.label == server_label and c.workload.label == workload_name and c.repeat == repeat:
            return c
    raise SpecError(f"no cell {server_label} x {workload_name} (repeat {repeat}) in {campaign_dir / CAMPAIGN_COPY}")


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
        pid = handle.pid if handle.kind in ("process", "rehearsal") else None  # its CPU/RSS go into telemetry
        target = RunTarget(settings, cell.backend, server_info, slo, show_progress=False, watch=watch, server_pid=pid)
        target.client_processes = cell.client_processes
        target.gpus = pinned_indices(handle)  # NVML telemetry and energy from the server's own GPUs
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
    if isinstance(wl, OpenLoop) and wl.slo_search:
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
        level = plan.concurrency if plan.mode == "closed" else plan.rate if plan.mode == "open" else None
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
        "image_build_s": handle.extra.get("image_build_s"),
        "engine_build_s": handle.extra.get("engine_build_s"),
        "engine_build_step": handle.extra.get("engine_build_step"),
        # True: the engine came from the cache and engine_build_s is the original build's time.
        "engine_build_cached": handle.extra.get("engine_build_cached"),
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
            "gpus": handle.extra.get("gpus"),
        },
    }


def pinned_indices(handle: ServerHandle) -> list[int] | None:
    """The NVML indices of the GPUs a launcher pinned the server to (None: not a pinned GPU server)."""
    pinned = handle.extra.get("gpus")
    devices = pinned.get("devices") if isinstance(pinned, dict) else None
    if not isinstance(devices, list) or not all(isinstance(d, str) and d.isdigit() for d in devices):
        return None
    return [int(d) for d in devices]


def write_preflight(out: Path, checks: list[PreflightResult], *, skipped: bool) -> None:
    """What the pre-flight found per server (the image's own defaults among it), for each run's run.json."""
    servers = {c.label: c.to_json() for c in checks}
    write_json(out / PREFLIGHT_FILE, {"skipped": skipped, "servers": servers})


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


def run_campaign(
    path: Path,
    out_dir: Path | None = None,
    only: list[str] | None = None,
    *,
    rehearse: bool = False,
    fresh: bool = False,
    skip_preflight: bool = False,
    smoke: SmokeMode = "auto",
) -> Path:
    """Run every cell through ``bench.ipynb``, then ``compare.ipynb`` into ``report.html``.

    ``skip_preflight``: start the servers without parsing their launches first (for a launch
    the pre-flight cannot judge); said on the terminal and recorded in ``preflight.json``.
    ``smoke``: the smoke run (:mod:`bakeoff.campaign.smoke`) first; ``only`` runs nothing else
    and returns ``smoke.json``'s path; ``auto`` smokes real runs of GPU servers (see
    :func:`wants_smoke`). A failed smoke raises :class:`SmokeFailedError` before any cell.

    A rehearsal goes to ``reports/NAME-rehearsal`` unless told otherwise, never beside real runs.
    Cells the folder already holds, measured the same way, are skipped (:mod:`bakeoff.campaign.resume`);
    ``fresh`` measures everything again. Ctrl-C stops the running cell within seconds
    (:mod:`bakeoff.notebook.kernelrun`), keeps what it measured and renders no report.
    """
    loaded = load_campaign(path)
    name = loaded.name + ("-rehearsal" if rehearse else "")
    out = (out_dir or reports_dir() / name).resolve()
    if fresh:
        resume.start_over(out)
    if loaded.gpu and not rehearse:  # the host, model and images, in seconds, before any pull (bakeoff doctor)
        refuse_on_problems(run_doctor(path), path)
    if loaded.ladder is not None:
        if only:
            raise SpecError("--only: a ladder runs its steps in order from the baseline; drop --only")
        return _run_ladder(path, loaded, out, rehearse=rehearse)
    spec, cells = prepare(path, out, only, rehearse=rehearse)
    # Each launch parsed by its framework (in its image, or a rehearsal stand-in) before any
    # server starts: a flag the release refuses costs seconds here, not a GPU start-up.
    checks = [] if skip_preflight else preflight_cells(cells, rehearse=rehearse, automatic=True)
    if skip_preflight:
        print("preflight: skipped (--skip-preflight): no launch was parsed before its server starts", file=sys.stderr)
    for check in checks:
        if check.status != "skipped":
            print(f"preflight: {check.line()}", file=sys.stderr)
    write_preflight(out, checks, skipped=skip_preflight)
    refuse_on_failure(checks, path)
    # What a campaign killed hard (SIGKILL, a lost machine) left: its servers, its unfinished runs.
    reap_leftovers(out / "cells")
    reap_containers(out / "cells")
    salvage_runs(out / "cells", resolve_slo(spec.slo))
    if wants_smoke(smoke, cells, rehearse=rehearse):
        smoked = smoke_campaign(spec, cells, out, rehearse=rehearse)
        if smoke == "only":
            return smoked
    failures: list[str] = []
    tag = REHEARSAL_TAG if rehearse else ""
    measured = calibrate(history_root())  # the history's start-up and decode figures, where it has them
    estimates = [cell_estimate(c, spec.measure_warm_restart, measured, warm=spec.warm_repeats) for c in cells]
    progress = CampaignProgress(estimates, tag=tag)
    with kernel_environment():
        try:
            _run_cells(cells, out, failures, progress, spec)
        except KeyboardInterrupt:
            print(
                f"interrupted: finished cells and requests are kept in {out}; run the same command again "
                "to measure the rest (no report rendered)",
                file=sys.stderr,
            )
            raise
        finally:
            # A cell cut short (Ctrl-C, a killed kernel) cannot clean up after itself.
            reap_leftovers(out / "cells")
            reap_containers(out / "cells")
            salvage_runs(out / "cells", resolve_slo(spec.slo))
            print(progress.summary(), flush=True)
        report = render_report(out, failures)
    # Into the history, where the next run of this campaign cannot overwrite it (bakeoff.history.archive).
    archive_after_run(out, path)
    return report


SmokeMode = Literal["auto", "only", "off"]


def wants_smoke(mode: SmokeMode, cells: list[Cell], *, rehearse: bool) -> bool:
    """Whether a campaign run smokes its servers first.

    ``auto``: a real run with a GPU server bakeoff launches: there a failed start or a wrong
    metric name found hours in costs booked GPU time; a CPU cell's failure costs what its
    smoke would, and a rehearsal smokes when asked (``--smoke``), to stay quick.
    """
    if mode != "auto":
        return mode == "only"
    return not rehearse and any(c.backend.accelerator == "gpu" and c.server.url is None for c in cells)


def smoke_campaign(spec: CampaignSpec, cells: list[Cell], out: Path, *, rehearse: bool) -> Path:
    """Smoke-run every server (:mod:`bakeoff.campaign.smoke`); the path of ``smoke.json``, or the failure raised."""
    source = resolve_model(spec.model)

    def start(cell: Cell, run_dir: Path) -> contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]:
        return start_server(cell, source, spec.model.served_name, run_dir)

    result = run_smoke(cells, out, start, rehearse=rehearse)
    if not result.passed:
        raise SmokeFailedError(
            "the smoke run failed, so the campaign did not start: "
            + "; ".join(result.failures())
            + f" (every step: {out / SMOKE_FILE}; servers' logs under {out / 'smoke'}). "
            "Fix it and run again, or skip the smoke with --no-smoke"
        )
    return out / SMOKE_FILE


def _run_ladder(path: Path, spec: CampaignSpec, out: Path, *, rehearse: bool) -> Path:
    """Measure the baseline, then each ladder step on the last kept knobs (:mod:`bakeoff.campaign.ladder`).

    Each step becomes one more server of a plain campaign (``ladder-campaign.yaml``, no ladder
    section), measured alone, so the cells, the report and resuming work as for any campaign.
    """
    assert spec.ladder is not None
    base = spec.servers[0]
    tried: list[ServerConfig] = []
    failures: list[str] = []
    derived = out / "ladder-campaign.yaml"

    def measure(server: ServerConfig) -> StepOutcome:
        tried.append(server)
        plain = spec.model_copy(update={"servers": list(tried), "ladder": None})
        out.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(plain.model_dump(mode="json", exclude_none=True), sort_keys=False)
        atomic_write_bytes(derived, f"# written by bakeoff from {path.resolve()}: the ladder so far\n{text}".encode())
        _, cells = prepare(derived, out, [server.label], rehearse=rehearse)
        refuse_on_failure(preflight_cells(cells, rehearse=rehearse, automatic=True), derived)
        reap_leftovers(out / "cells")
        salvage_runs(out / "cells", resolve_slo(spec.slo))
        tag = REHEARSAL_TAG if rehearse else ""
        measured = calibrate(history_root())
        estimates = [cell_estimate(c, spec.measure_warm_restart, measured, warm=spec.warm_repeats) for c in cells]
        progress = CampaignProgress(estimates, tag=tag)
        _run_cells(cells, out, failures, progress, spec)
        print(progress.summary(), flush=True)
        done = [c for c in load_cells(out) if c.label == server.label]
        first = sorted((c for c in done if c.status == "ok"), key=lambda c: c.repeat)
        found = first[0].dir / QUALITY_FILE if first else None
        scores = read_json(found) if found is not None and found.is_file() else None
        return outcome_of(server.label, dict(server.knobs), done, scores)

    with kernel_environment():
        kept = baseline = measure(base)
        steps = []
        for step in spec.ladder.steps:
            server = base.model_copy(update={"label": step.name, "knobs": {**kept.knobs, **step.knobs}})
            outcome = measure(server)
            outcome.why = step.why
            decision = decide(spec.ladder, kept, outcome)
            steps.append((outcome, decision))
            verdict = "kept" if decision.kept else "rolled back: " + "; ".join(decision.reasons)
            print(f"ladder: {step.name} {verdict}", flush=True)
            if decision.kept:
                kept = outcome
        result = LadderResult(baseline, steps, spec.ladder)
        write_json(out / LADDER_FILE, result.to_json())
        atomic_write_bytes(out / LADDER_MARKDOWN, waterfall_markdown(result).encode())
        print(f"ladder: final {result.final.label}; chain {' -> '.join(result.chain)}", flush=True)
        report = render_report(out, failures)
    archive_after_run(out, path)
    return report


def round_ends(cells: list[Cell], index: int) -> bool:
    """Cell ``index`` is the last of its interleaved round."""
    return index + 1 == len(cells) or cells[index + 1].repeat != cells[index].repeat


def rounds(cells: list[Cell]) -> list[list[Cell]]:
    """The cells cut into their interleaved rounds, in order (what :func:`auto_stop` is asked after).

    A round ends where the next cell's repeat differs (:func:`round_ends`): the runs of equal repeats.
    """
    return [list(run) for _, run in itertools.groupby(cells, key=lambda cell: cell.repeat)]


def auto_stop(out: Path, spec: CampaignSpec, finished_round: int) -> bool:
    """``repeats: auto`` after a round: test every comparison; record and say whether to stop."""
    if spec.repeats != "auto" or finished_round < spec.min_repeats:
        return False
    left = verdict.undecided(verdict.verdicts(out))
    last = finished_round >= spec.planned_repeats
    if left and not last:
        print(f"repeats: auto — after round {finished_round}: {len(left)} comparison(s) undecided", flush=True)
        return False
    why = "max_repeats reached" if left else "every verdict decided"
    write_json(
        out / AUTO_REPEATS,
        {"rounds": finished_round, "max_repeats": spec.planned_repeats, "why": why, "undecided": left},
    )
    print(f"repeats: auto — stopping after round {finished_round}: {why}", flush=True)
    return True


def _run_cells(
    cells: list[Cell], out: Path, failures: list[str], progress: CampaignProgress, spec: CampaignSpec
) -> None:
    (out / AUTO_REPEATS).unlink(missing_ok=True)
    stopped: int | None = None
    with contextlib.ExitStack() as stack:
        # warm_repeats: every server started once, here, and stopped when the campaign ends or is interrupted.
        warm = stack.enter_context(WarmServers()) if spec.warm_repeats else None
        for index, cell in enumerate(cells):
            if stopped is not None:
                progress.skip(index, cell.cell_id, f"repeats: auto stopped after round {stopped}")
                continue
            _run_one(cells, index, out, failures, progress, warm)
            if warm is not None and _last_of_server(cells, index):
                warm.stop(cell.server.label)  # no later round needs it: free its memory and cores
            if round_ends(cells, index) and auto_stop(out, spec, cell.repeat):
                stopped = cell.repeat


def _last_of_server(cells: list[Cell], index: int) -> bool:
    return all(c.server.label != cells[index].server.label for c in cells[index + 1 :])


def _run_one(
    cells: list[Cell],
    index: int,
    out: Path,
    failures: list[str],
    progress: CampaignProgress,
    warm: WarmServers | None = None,
) -> None:
    import papermill  # deferred: the report extra; validating a campaign needs neither
    from nbclient.exceptions import DeadKernelError

    cell = cells[index]
    cell_dir = out / "cells" / cell.cell_id
    state = resume.cell_state(cell_dir, cell_fingerprint(cell, out, warm=warm is not None))
    line = ""
    if state.state == "complete":
        progress.skip(index, cell.cell_id, state.reason)
        return
    if state.state != "new":
        kept = resume.archive_attempt(cell_dir, state.reason)
        where = f" (the earlier attempt is kept in {kept.relative_to(out)})" if kept else ""
        line += f": {state.reason}; measuring it again{where}"
    cell_dir.mkdir(parents=True, exist_ok=True)
    progress.start(index, cell.cell_id, line)
    if warm is not None:
        # The warm server lives in this process, so the cell is measured here, not in a notebook kernel
        # (bench.ipynb opened later shows its runs as for any cell).
        try:
            run_cell(out, cell.server.label, cell.workload.label, cell.repeat, warm=warm)
        except (LaunchError, ServerDiedError) as exc:
            failures.append(cell.cell_id)
            progress.end(cell.cell_id, False, f"{type(exc).__name__}: {str(exc)[:300]}")
            warm.stop(cell.server.label)  # a later round starts it afresh, said in its effort
        else:
            progress.end(cell.cell_id, True, cell_result(cell_dir))
        return
    try:
        kernelrun.execute(
            notebook("bench.ipynb"),
            cell_dir / "bench.ipynb",
            {
                "campaign_dir": str(out),
                "server_label": cell.server.label,
                "workload_name": cell.workload.label,
                "repeat": cell.repeat,
                # The campaign measures; the same notebook opened later only shows the runs.
                "measure": True,
            },
            cell_dir,
            kernel_name=notebook_kernel(),
        )
    except papermill.PapermillExecutionError as exc:
        failures.append(cell.cell_id)
        progress.end(cell.cell_id, False, f"{exc.ename}: {str(exc.evalue)[:300]}")
    except DeadKernelError:
        failures.append(cell.cell_id)
        progress.end(cell.cell_id, False, "its notebook kernel died")
    else:
        progress.end(cell.cell_id, True, cell_result(cell_dir))


def render_report(out: Path, failures: list[str] | None = None) -> Path:
    """Execute ``compare.ipynb`` over the campaign folder and export it, code hidden, to HTML."""
    out = out.resolve()  # the notebook kernel runs with the campaign folder as its cwd

    with kernel_environment():
        parameters = {"campaign_dir": str(out)}
        kernel = notebook_kernel()
        kernelrun.execute(notebook("compare.ipynb"), out / "compare.ipynb", parameters, out, kernel_name=kernel)
    export_html(out / "compare.ipynb", out / "report.html")
    if failures:
        print(f"cells that failed: {', '.join(failures)} (see their bench.ipynb and server.log)", file=sys.stderr)
    return out / "report.html"
