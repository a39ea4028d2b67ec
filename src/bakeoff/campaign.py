"""Campaigns end to end: validate, plan, run every cell through its notebook, report.

A cell is one server configuration (backend + knobs) with one workload. ``bench.ipynb``
runs a cell (launch, load, save, its own plots) by calling :func:`run_cell`;
``compare.ipynb`` turns all cells into the comparison, exported to ``report.html``.
Everything a run needs is checked by :func:`validate_campaign` before any server starts.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bakeoff import kernelrun, launchers, quality, resume
from bakeoff.archive import archive_after_run
from bakeoff.auth import request_headers
from bakeoff.backends import BackendSpec, KnobValue, load_backend
from bakeoff.cell_server import CellServer
from bakeoff.client import ClientSettings, TokenCounter
from bakeoff.containers import reap_containers
from bakeoff.engine_env import engine_python
from bakeoff.errors import LaunchError, ServerDiedError, SpecError
from bakeoff.gpu_checks import KvDtype, check_draft_models, check_kv_dtypes, effective_kv_dtype
from bakeoff.htmlexport import export_html
from bakeoff.launch import ServerHandle, reap_leftovers
from bakeoff.launch_render import RenderedLaunch, render_launch
from bakeoff.launchers import LaunchContext
from bakeoff.liveness import watch_for
from bakeoff.metrics import cost_per_million_tokens
from bakeoff.model_source import ModelSource, resolve_model
from bakeoff.modelgen import resolve_model_dir
from bakeoff.notebook_params import cell_folder_name
from bakeoff.paths import kernel_environment, notebook, notebook_kernel, reports_dir
from bakeoff.progress import CampaignProgress, cell_estimate, cell_result
from bakeoff.prompts import PromptFactory, load_tokenizer
from bakeoff.rehearsal import MARKER as REHEARSAL_MARKER
from bakeoff.rehearsal import is_rehearsal, rehearsal_spec, write_marker
from bakeoff.results import Cost, Effort, RunSummary
from bakeoff.runner import RunTarget, execute_plan, gpu_available, salvage_runs, versions
from bakeoff.slo import resolve_slo, search_max_rate
from bakeoff.specs import CampaignSpec, ServerConfig, Slo, campaign_copy, load_campaign
from bakeoff.store import SUMMARY, atomic_write_bytes, read_summary, write_json, write_summary
from bakeoff.telemetry import has_prefix_cache_counters
from bakeoff.traces.plan import check_fits
from bakeoff.workload_specs import MultiTurn, OpenLoop, Trace, Workload
from bakeoff.workloads import (
    PlanBuilder,
    RunPlan,
    load_plans,
    longest_request,
    plan_inputs,
    plans_match,
    save_plans,
)

CAMPAIGN_COPY = "campaign.yaml"
CELL_INFO = "cell.json"


@dataclass
class Cell:
    server: ServerConfig
    backend: BackendSpec
    workload: Workload
    rehearse: bool = False  # GPU containers replaced by reference-server stand-ins
    # Authorization (from api_key_env) and extra headers: sent, never written anywhere.
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    draft_dir: Path | None = None  # model.draft_path: mounted at /draft for speculative knobs
    client_processes: int | None = None  # load-generator processes per run; None: decided from the warm-up
    repeat: int = 1  # which repeat of the server x workload pair (1-based); each has its own folder

    @property
    def cell_id(self) -> str:
        return cell_folder_name(self.server.label, self.workload.label, self.repeat)


def order_repeats(cells: list[Cell], repeats: int, interleave: bool) -> list[Cell]:
    """Every cell ``repeats`` times: repeat 1 of all cells, then repeat 2, ... (or each cell's back to back).

    Interleaved, a slow drift of the machine (heat, page cache, a neighbour) spreads over
    every server instead of landing on whichever ran last.
    """
    if interleave:
        return [replace(c, repeat=r) for r in range(1, repeats + 1) for c in cells]
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


def with_image_tag(backend: BackendSpec, tag: str | None, where: str) -> BackendSpec:
    """The backend with the campaign's image tag (a new release is a config change), its CUDA variants too."""
    if tag is None:
        return backend
    if backend.container is None:
        raise SpecError(f"{where}: backend {backend.name!r} runs as a process, not an image; remove image_tag")
    from bakeoff.images import image_with_tag

    container = backend.container.model_copy(
        update={
            "image": image_with_tag(backend.container.image, tag),
            "cuda_images": {m: image_with_tag(i, tag) for m, i in backend.container.cuda_images.items()},
        }
    )
    return backend.model_copy(update={"container": container})


def expand(
    spec: CampaignSpec, model_dir: Path | None, only: list[str] | None = None, *, rehearse: bool = False
) -> list[Cell]:
    """Servers x workloads, with every knob, context length and metric need checked."""
    labels = [s.label for s in spec.servers]
    unknown = sorted(set(only or []) - set(labels))
    if unknown:
        raise SpecError(f"--only {', '.join(unknown)}: no such server label; labels: {', '.join(labels)}")
    cells = []
    launches: list[tuple[str, BackendSpec, dict[str, KnobValue]]] = []
    kv_dtypes: list[KvDtype] = []
    for i, server in enumerate(spec.servers):
        where = f"servers[{i}]"
        backend = with_image_tag(load_backend(server.backend), server.image_tag, f"{where}.image_tag")
        if backend.accelerator == "gpu" and not spec.gpu:
            raise SpecError(f"{where}.backend: {backend.name} needs a GPU; set gpu: true in the campaign")
        render_launch(backend, server.knobs, model="/model", served_model_name="m", port=8000)
        headers = request_headers(
            server.api_key_env, server.headers, where=f"{where}.api_key_env", where_headers=f"{where}.headers"
        )
        launches.append((where, backend, dict(server.knobs)))
        kv_dtypes.append(effective_kv_dtype(server.label, dict(server.knobs), server.model_path or model_dir))
        limit = _context_limit(server, model_dir, spec.model.context_len)
        for j, wl in enumerate(spec.workloads):
            if isinstance(wl, Trace):  # counts the trace's rows that do not fit, or clips them
                check_fits(wl, limit, f"workloads[{j}] ({wl.label})", f"{where} ({server.label})")
            elif limit is not None and (need := longest_request(wl)) > limit:
                raise SpecError(
                    f"workloads[{j}] ({wl.label}): prompt + output need up to {need} tokens but "
                    f"{where} ({server.label}) accepts {limit}; shorten the workload or raise max_model_len"
                )
            check_metric_support(f"workloads[{j}]", wl, backend)
            if only and server.label not in only:
                continue
            procs = None if spec.client_processes == "auto" else spec.client_processes
            cells.append(Cell(server, backend, wl, rehearse, headers, spec.model.draft_path, procs))
    check_draft_models(launches, spec.model.draft_path)
    check_kv_dtypes(kv_dtypes)
    if spec.quality is not None:
        quality.check_spec(spec.quality)
    return order_repeats(cells, spec.repeats, spec.interleave)


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
    path: Path, out_dir: Path, only: list[str] | None = None, *, rehearse: bool = False
) -> tuple[CampaignSpec, list[Cell]]:
    """Validate, copy the campaign and write every workload's plan once, for all backends.

    A rehearsal copies the scaled-down campaign it actually runs, beside its marker file.
    """
    spec = load_campaign(path)
    if rehearse:
        original, spec = spec, rehearsal_spec(spec)
    source = resolve_model(spec.model)
    cells = expand(spec, source.local_dir, only, rehearse=rehearse)
    for cell in cells:
        if cell.backend.python == "engine" and launchers.launcher_kind(cell.backend, cell.server) == "process":
            engine_python()  # before any server starts: a missing engine environment names its fix
    out_dir.mkdir(parents=True, exist_ok=True)
    if rehearse:
        text = yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)
        atomic_write_bytes(out_dir / CAMPAIGN_COPY, text.encode())
        write_marker(out_dir, path, original)
    else:
        atomic_write_bytes(out_dir / CAMPAIGN_COPY, campaign_copy(path, spec))
        (out_dir / REHEARSAL_MARKER).unlink(missing_ok=True)
    limits = [_context_limit(s, source.local_dir, spec.model.context_len) for s in spec.servers]
    builder = PlanBuilder(
        PromptFactory(load_tokenizer(source.tokenizer_dir())),
        context_limit=min((n for n in limits if n is not None), default=None),
    )
    tokenizer_file = source.tokenizer_dir() / "tokenizer.json"
    for wl in spec.workloads:
        folder = out_dir / "plans" / wl.label
        # Plans are made once and replayed on re-runs, unless the workload or what it was planned from changed.
        inputs = plan_inputs(wl, tokenizer_file, builder.context_limit)
        if not plans_match(folder, wl.model_dump(mode="json"), inputs):
            shutil.rmtree(folder, ignore_errors=True)
            save_plans(builder.build(wl), folder, inputs)
    return spec, cells


def start_server(
    cell: Cell, source: ModelSource, served_name: str, run_dir: Path
) -> contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]:
    """Launch a cell's server with the launcher its kind needs (:mod:`bakeoff.launchers`)."""
    if cell.server.model_path is not None:
        # This server's own packaging of the model (a ModelOpt export, an AWQ folder).
        source = ModelSource(hf_id=None, local_dir=cell.server.model_path)
    ctx = LaunchContext(cell.server, cell.backend, source, served_name, run_dir, cell.headers, cell.draft_dir)
    return launchers.start_server(ctx, rehearse=cell.rehearse)


def cell_fingerprint(cell: Cell, campaign_dir: Path) -> dict[str, Any]:
    """What a finished cell's measurement depends on (:func:`bakeoff.resume.fingerprint`)."""
    return resume.fingerprint(
        campaign_dir / "plans" / cell.workload.label,
        cell.server.model_dump(mode="json"),
        cell.backend.model_dump(mode="json"),
        versions(cell.backend),
    )


def run_cell(campaign_dir: Path, server_label: str, workload_name: str, repeat: int = 1) -> dict[str, Any]:
    """Launch one server, run one workload's plans, save runs and the cell's effort record.

    ``repeat``: which repeat of the pair to measure (its own cell folder; see :func:`order_repeats`).
    """
    spec = load_campaign(campaign_dir / CAMPAIGN_COPY)
    source = resolve_model(spec.model)
    everything = expand(spec, source.local_dir, rehearse=is_rehearsal(campaign_dir))
    cells = [
        c
        for c in everything
        if c.server.label == server_label and c.workload.label == workload_name and c.repeat == repeat
    ]
    if not cells:
        raise SpecError(f"no cell {server_label} x {workload_name} (repeat {repeat}) in {campaign_dir / CAMPAIGN_COPY}")
    cell = cells[0]
    cell_dir = campaign_dir / "cells" / cell.cell_id
    plans = load_plans(campaign_dir / "plans" / workload_name)
    tokenizer = load_tokenizer(source.tokenizer_dir())
    effort: dict[str, Any] = {"failed_start_attempts": []}
    summaries: dict[str, Any] = {}
    info: dict[str, Any] = {
        "server": cell.server.model_dump(mode="json"),
        "backend": cell.backend.name,
        "workload": workload_name,
        "repeat": repeat,
        "status": "running",
        "started_at": resume.now_iso(),
        # Attempts a resumed campaign moved aside before measuring this cell again.
        "earlier_attempts": resume.earlier_attempts(cell_dir),
    }
    write_json(cell_dir / CELL_INFO, info)
    restarts: list[dict[str, Any]] = []
    effort["cache_restarts"] = restarts  # restarts that emptied the prefix cache (cache_reset: restart)

    def start() -> contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]:
        return start_server(cell, source, spec.model.served_name, cell_dir)

    try:
        for attempt in range(1, spec.start_attempts + 1):
            try:
                with CellServer(start, cell.backend, restarts) as server:
                    if "server" not in effort:
                        handle, launch = server.current()
                        effort.update(_static_effort(cell, launch, handle))
                    _run_plans(cell, spec.slo, plans, tokenizer.count, server, cell_dir, effort, info, summaries)
                    if spec.quality is not None:  # after the speed runs, on the same server
                        settings = client_settings(cell, server.current()[0], tokenizer.count)
                        info["quality"] = quality.measure_cell(spec.quality, settings, cell_dir, cell.cell_id)["rates"]
                break
            except LaunchError as exc:
                # Failed starts (a restart's too) are part of the engineering effort: record each, then retry.
                effort["failed_start_attempts"].append(str(exc)[:2000])
                if attempt == spec.start_attempts:
                    raise
        effort["cache_restart_s"] = sum(r["stop_s"] + r["start_s"] for r in restarts)
        if spec.measure_warm_restart and repeat > 1:
            # A later repeat's start found the caches a first start filled: it is the warm restart.
            effort["warm_restart_s"] = effort.get("cold_start_s")
        elif spec.measure_warm_restart and spec.repeats == 1:
            # A cache restart already was a warm restart: no extra one to time.
            effort["warm_restart_s"] = (
                restarts[0]["start_s"] if restarts else _time_restart(cell, source, spec.model.served_name, cell_dir)
            )
        info["status"] = "ok"
        info["fingerprint"] = cell_fingerprint(cell, campaign_dir)
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
        _attach(cell_dir, effort, cell.server.cost_per_hour_usd)
    return summaries


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
    campaign_slo: Slo,
    plans: list[RunPlan],
    count_tokens: TokenCounter,
    server: CellServer,
    cell_dir: Path,
    effort: dict[str, Any],
    info: dict[str, Any],
    summaries: dict[str, Any],
) -> None:
    """Every plan of the cell against the ready server, then the SLO search if asked for.

    Plans already in ``summaries`` ran on an earlier start of this cell and are skipped.
    """
    slo = resolve_slo(campaign_slo)

    def execute(plan: RunPlan) -> RunSummary:
        cache = server.prepare(plan)  # may restart the server: take the handle after it
        handle, _ = server.current()
        settings = client_settings(cell, handle, count_tokens)
        server_info = {**effort["server"], "base_url": handle.base_url, "startup_s": handle.startup_s}
        watch = lambda: watch_for(handle)  # noqa: E731 - a fresh watch per run
        pid = handle.pid if handle.kind in ("process", "rehearsal") else None  # its CPU/RSS go into telemetry
        target = RunTarget(settings, cell.backend, server_info, slo, show_progress=False, watch=watch, server_pid=pid)
        target.client_processes = cell.client_processes
        result = execute_plan(plan, target, cell_dir / "runs" / plan.name, cache_state=cache, repeat=cell.repeat)
        server.ran(plan)
        summaries[plan.name] = result
        return result

    for plan in plans:
        if plan.name not in summaries:
            execute(plan)
    wl = cell.workload
    if isinstance(wl, OpenLoop) and wl.slo_search:
        tried = {p.rate: summaries[p.name] for p in plans if p.rate is not None}
        info["slo_search"] = search_max_rate(plans[0], wl, slo, tried, execute)


def _static_effort(cell: Cell, launch: RenderedLaunch, handle: ServerHandle) -> dict[str, Any]:
    knob_costs = {k: cell.backend.knobs[k].change_needs for k in cell.backend.knobs}
    return {
        "cold_start_s": handle.startup_s,
        "image_build_s": handle.extra.get("image_build_s"),
        "engine_build_s": handle.extra.get("engine_build_s"),
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
            "command_line": handle.command_line,
            "kind": handle.kind,
            "image": handle.image,
            "image_digest": handle.image_digest,
            "base_url": handle.base_url,
        },
    }


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


def _attach(cell_dir: Path, effort: dict[str, Any], cost_per_hour: float | None) -> None:
    """Add the cell's effort (and cost) to every run summary of the cell."""
    public = Effort.model_validate({k: v for k, v in effort.items() if k != "server"})
    for path in sorted((cell_dir / "runs").glob(f"*/{SUMMARY}")):
        summary = read_summary(path)
        cost = Cost(
            usd_per_hour=cost_per_hour,
            usd_per_million_output_tokens=cost_per_million_tokens(cost_per_hour, summary.throughput.output_tok_s),
        )
        write_summary(path, summary.model_copy(update={"effort": public, "cost": cost}))


def run_campaign(
    path: Path,
    out_dir: Path | None = None,
    only: list[str] | None = None,
    *,
    rehearse: bool = False,
    fresh: bool = False,
) -> Path:
    """Run every cell through ``bench.ipynb``, then ``compare.ipynb`` into ``report.html``.

    A rehearsal goes to ``reports/NAME-rehearsal`` unless told otherwise, never beside real runs.
    Cells the folder already holds, measured the same way, are skipped (:mod:`bakeoff.resume`);
    ``fresh`` measures everything again. Ctrl-C stops the running cell within seconds
    (:mod:`bakeoff.kernelrun`), keeps what it measured and renders no report.
    """
    name = load_campaign(path).name + ("-rehearsal" if rehearse else "")
    out = (out_dir or reports_dir() / name).resolve()
    if fresh:
        resume.start_over(out)
    spec, cells = prepare(path, out, only, rehearse=rehearse)
    # What a campaign killed hard (SIGKILL, a lost machine) left: its servers, its unfinished runs.
    reap_leftovers(out / "cells")
    reap_containers(out / "cells")
    salvage_runs(out / "cells", resolve_slo(spec.slo))
    failures: list[str] = []
    progress = CampaignProgress([cell_estimate(c, spec.measure_warm_restart) for c in cells])
    with kernel_environment():
        try:
            _run_cells(cells, out, failures, progress)
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
    # Into the history, where the next run of this campaign cannot overwrite it (bakeoff.archive).
    archive_after_run(out, path)
    return report


def _run_cells(cells: list[Cell], out: Path, failures: list[str], progress: CampaignProgress) -> None:
    import papermill
    from nbclient.exceptions import DeadKernelError

    for index, cell in enumerate(cells):
        cell_dir = out / "cells" / cell.cell_id
        verdict = resume.cell_state(cell_dir, cell_fingerprint(cell, out))
        line = ""
        if verdict.state == "complete":
            progress.skip(index, cell.cell_id, verdict.reason)
            continue
        if verdict.state != "new":
            kept = resume.archive_attempt(cell_dir, verdict.reason)
            where = f" (the earlier attempt is kept in {kept.relative_to(out)})" if kept else ""
            line += f": {verdict.reason}; measuring it again{where}"
        cell_dir.mkdir(parents=True, exist_ok=True)
        progress.start(index, cell.cell_id, line)
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
