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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bakeoff import launchers
from bakeoff.auth import request_headers
from bakeoff.backends import BackendSpec, KnobValue, RenderedLaunch, load_backend, render_launch
from bakeoff.cell_server import CellServer
from bakeoff.client import ClientSettings, TokenCounter
from bakeoff.errors import LaunchError, SpecError
from bakeoff.gpu_checks import KvDtype, check_draft_models, check_kv_dtypes, effective_kv_dtype
from bakeoff.launch import ServerHandle, reap_leftovers
from bakeoff.launchers import LaunchContext
from bakeoff.metrics import cost_per_million_tokens
from bakeoff.model_source import ModelSource, resolve_model
from bakeoff.modelgen import REPO_ROOT, resolve_model_dir
from bakeoff.prompts import PromptFactory, load_tokenizer
from bakeoff.rehearsal import MARKER as REHEARSAL_MARKER
from bakeoff.rehearsal import is_rehearsal, rehearsal_spec, write_marker
from bakeoff.runner import RunTarget, execute_plan, gpu_available, salvage_runs
from bakeoff.slo import resolve_slo, search_max_rate
from bakeoff.specs import CampaignSpec, MultiTurn, OpenLoop, ServerConfig, Slo, Workload, load_campaign
from bakeoff.store import SUMMARY, atomic_write_bytes, read_json, write_json
from bakeoff.telemetry import has_prefix_cache_counters
from bakeoff.workloads import PlanBuilder, RunPlan, load_plans, longest_request, plans_match, save_plans

NOTEBOOKS = REPO_ROOT / "notebooks"
TEMPLATES = Path(__file__).resolve().parent / "templates"
REPORTS = REPO_ROOT / "reports"
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

    @property
    def cell_id(self) -> str:
        return f"{self.server.label}__{self.workload.label}"


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
        backend = load_backend(server.backend)
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
            need = longest_request(wl)
            if limit is not None and need > limit:
                raise SpecError(
                    f"workloads[{j}] ({wl.label}): prompt + output need up to {need} tokens but "
                    f"{where} ({server.label}) accepts {limit}; shorten the workload or raise max_model_len"
                )
            check_metric_support(f"workloads[{j}]", wl, backend)
            if only and server.label not in only:
                continue
            cells.append(Cell(server, backend, wl, rehearse, headers, spec.model.draft_path))
    check_draft_models(launches, spec.model.draft_path)
    check_kv_dtypes(kv_dtypes)
    return cells


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
    out_dir.mkdir(parents=True, exist_ok=True)
    if rehearse:
        text = yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)
        atomic_write_bytes(out_dir / CAMPAIGN_COPY, text.encode())
        write_marker(out_dir, path, original)
    else:
        shutil.copyfile(path, out_dir / CAMPAIGN_COPY)
        (out_dir / REHEARSAL_MARKER).unlink(missing_ok=True)
    builder = PlanBuilder(PromptFactory(load_tokenizer(source.tokenizer_dir())))
    for wl in spec.workloads:
        folder = out_dir / "plans" / wl.label
        # Plans are made once and replayed on re-runs, unless the workload itself changed.
        if not plans_match(folder, wl.model_dump(mode="json")):
            shutil.rmtree(folder, ignore_errors=True)
            save_plans(builder.build(wl), folder)
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


def run_cell(campaign_dir: Path, server_label: str, workload_name: str) -> dict[str, Any]:
    """Launch one server, run one workload's plans, save runs and the cell's effort record."""
    spec = load_campaign(campaign_dir / CAMPAIGN_COPY)
    source = resolve_model(spec.model)
    everything = expand(spec, source.local_dir, rehearse=is_rehearsal(campaign_dir))
    cells = [c for c in everything if c.server.label == server_label and c.workload.label == workload_name]
    if not cells:
        raise SpecError(f"no cell {server_label} x {workload_name} in {campaign_dir / CAMPAIGN_COPY}")
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
        "status": "running",
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
                break
            except LaunchError as exc:
                # Failed starts (a restart's too) are part of the engineering effort: record each, then retry.
                effort["failed_start_attempts"].append(str(exc)[:2000])
                if attempt == spec.start_attempts:
                    raise
        effort["cache_restart_s"] = sum(r["stop_s"] + r["start_s"] for r in restarts)
        if spec.measure_warm_restart:
            # A cache restart already was a warm restart: no extra one to time.
            effort["warm_restart_s"] = (
                restarts[0]["start_s"] if restarts else _time_restart(cell, source, spec.model.served_name, cell_dir)
            )
        info["status"] = "ok"
    except LaunchError as exc:
        info["status"] = "failed"
        info["error"] = str(exc)[:4000]
        raise
    finally:
        info["effort"] = effort
        write_json(cell_dir / CELL_INFO, info)
        _attach(cell_dir, effort, cell.server.cost_per_hour_usd)
    return summaries


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

    def execute(plan: RunPlan) -> dict[str, Any]:
        cache = server.prepare(plan)  # may restart the server: take the handle after it
        handle, _ = server.current()
        settings = ClientSettings(
            base_url=handle.base_url,
            model=handle.model,
            extra_body=dict(cell.backend.request.extra_body),
            request_timeout_s=cell.workload.request_timeout_s,
            stall_timeout_s=cell.workload.stall_timeout_s,
            count_tokens=count_tokens,
            min_tokens=cell.backend.request.min_tokens,
            headers=cell.headers,
        )
        server_info = {**effort["server"], "base_url": handle.base_url, "startup_s": handle.startup_s}
        target = RunTarget(settings, cell.backend, server_info, slo, show_progress=False)
        result = execute_plan(plan, target, cell_dir / "runs" / plan.name, cache_state=cache)
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
    public = {k: v for k, v in effort.items() if k != "server"}
    for path in sorted((cell_dir / "runs").glob(f"*/{SUMMARY}")):
        summary = read_json(path)
        summary["effort"] = public
        summary["cost"] = {
            "usd_per_hour": cost_per_hour,
            "usd_per_million_output_tokens": cost_per_million_tokens(
                cost_per_hour, summary["throughput"]["output_tok_s"]
            ),
        }
        write_json(path, summary)


def run_campaign(
    path: Path, out_dir: Path | None = None, only: list[str] | None = None, *, rehearse: bool = False
) -> Path:
    """Run every cell through ``bench.ipynb``, then ``compare.ipynb`` into ``report.html``.

    A rehearsal goes to ``reports/NAME-rehearsal`` unless told otherwise, never beside real runs.
    """
    name = load_campaign(path).name + ("-rehearsal" if rehearse else "")
    out = (out_dir or REPORTS / name).resolve()
    spec, cells = prepare(path, out, only, rehearse=rehearse)
    failures: list[str] = []
    try:
        _run_cells(cells, out, failures)
    finally:
        # A cell cut short (Ctrl-C, a killed kernel) cannot clean up after itself.
        reap_leftovers(out / "cells")
        salvage_runs(out / "cells", resolve_slo(spec.slo))
    return render_report(out, failures)


def _run_cells(cells: list[Cell], out: Path, failures: list[str]) -> None:
    import papermill
    from nbclient.exceptions import DeadKernelError

    for cell in cells:
        cell_dir = out / "cells" / cell.cell_id
        cell_dir.mkdir(parents=True, exist_ok=True)
        print(f"[{time.strftime('%H:%M:%S')}] cell {cell.cell_id}", flush=True)
        try:
            papermill.execute_notebook(
                str(NOTEBOOKS / "bench.ipynb"),
                str(cell_dir / "bench.ipynb"),
                parameters={
                    "campaign_dir": str(out),
                    "server_label": cell.server.label,
                    "workload_name": cell.workload.label,
                },
                progress_bar=False,
                cwd=str(cell_dir),
            )
        except papermill.PapermillExecutionError as exc:
            failures.append(cell.cell_id)
            print(f"  cell {cell.cell_id} failed: {exc.ename}: {exc.evalue}", file=sys.stderr)
        except DeadKernelError:
            failures.append(cell.cell_id)
            print(f"  cell {cell.cell_id} failed: its notebook kernel died", file=sys.stderr)


def render_report(out: Path, failures: list[str] | None = None) -> Path:
    """Execute ``compare.ipynb`` over the campaign folder and export it, code hidden, to HTML."""
    import papermill
    from nbconvert import HTMLExporter
    from nbformat import read

    out = out.resolve()  # the notebook kernel runs with the campaign folder as its cwd

    papermill.execute_notebook(
        str(NOTEBOOKS / "compare.ipynb"),
        str(out / "compare.ipynb"),
        parameters={"campaign_dir": str(out)},
        progress_bar=False,
        cwd=str(out),
    )
    exporter = HTMLExporter(
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
        extra_template_basedirs=[str(TEMPLATES)],
        template_name="offline",
    )
    with open(out / "compare.ipynb") as handle:
        body, _ = exporter.from_notebook_node(read(handle, as_version=4))
    atomic_write_bytes(out / "report.html", body.encode())
    if failures:
        print(f"cells that failed: {', '.join(failures)} (see their bench.ipynb and server.log)", file=sys.stderr)
    return out / "report.html"
