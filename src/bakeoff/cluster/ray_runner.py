"""Campaigns on a Ray cluster: every cell a Ray task, placed where its resources are.

``bakeoff campaign run CAMPAIGN --ray [ADDRESS]`` plans the campaign on the driver as a
local run does (plans written once, cells already measured skipped, earlier attempts
archived: :mod:`bakeoff.campaign.resume`), then submits each remaining cell as one task that runs
:func:`bakeoff.campaign.cell_run.run_cell` on the node Ray picks. The task starts the cell's server
and drives its load itself, so server and load generator share a node and no network hop
enters the timings. What a cell asks Ray for (:func:`cell_options`):

- a GPU server: ``num_gpus`` = its ``tensor_parallel_size`` (Ray hands a GPU to one task
  at a time, and sets ``CUDA_VISIBLE_DEVICES``, so two cells never share one; the task's
  launcher pins the container to exactly those GPUs and meters only them,
  :mod:`bakeoff.serving.gpu_pinning`). A rehearsal asks for GPUs too where the cluster has
  any, so its recorded commands show the placement a GPU host would get; plus
  ``{"accelerator_type:H100": 0.001}`` when the server or campaign sets ``gpu_type``: the
  resource Ray puts on every node with that GPU, asked for in the fraction Ray's own
  ``accelerator_type=`` option uses, so it selects nodes without capping cells per node;
- CPUs: ``ray.cpus_per_cell``, default 1 for a GPU cell (its client) and 2 for a CPU
  engine (engine and client), at least one per fixed client process.

Independent cells run in parallel as far as the cluster's resources allow. With
``repeats: auto`` they go one interleaved round at a time: a round's cells in parallel, then the
rule a local run applies after each round (:func:`bakeoff.campaign.execute.auto_stop`), so
the campaign stops after the same round, and says why in the same ``repeats.json``. A worker or
node lost mid-cell fails that task alone; Ray runs it again up to ``ray.max_retries``
times (``ray.retry_exceptions`` also re-runs cells that failed with an error). The new
try finds what the lost one left (its try log, ``ray_tries.json``), reaps its server if it
ran on a node still alive, moves its partial runs to ``attempts/N`` with the reason, and
measures the cell again; ``cell.json`` lists every try and the report names the retries.
Finished cells are never re-run, in this campaign run or the next. Each run's provenance
gets the node id, GPU type and driver version (the image digest is there already).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from bakeoff.campaign import resume
from bakeoff.campaign.campaign_input import CampaignInput, as_input
from bakeoff.campaign.cell_run import run_cell
from bakeoff.campaign.cell_spec import cell_fingerprint, write_cell_spec
from bakeoff.campaign.cells import Cell, prepare
from bakeoff.campaign.doctor_run import refuse_on_problems, run_doctor
from bakeoff.campaign.execute import auto_stop, render_report, rounds
from bakeoff.campaign.progress import cell_result
from bakeoff.campaign.runner import salvage_runs
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.cluster.ray_store import CAMPAIGN_COPY, ResultStore
from bakeoff.errors import LaunchError, ServerDiedError, SpecError
from bakeoff.host.gpus import gpus
from bakeoff.paths import reports_dir
from bakeoff.results.cell_record import update_cell_record
from bakeoff.results.layout import AUTO_REPEATS, CELL_SPEC, REHEARSAL_MARKER
from bakeoff.results.store import CELL_INFO, RUN_INFO, SUMMARY, read_json, read_summary, write_json, write_summary
from bakeoff.serving.gpu_pinning import gpu_count
from bakeoff.serving.process import PID_FILE, reap_leftovers

INSTALL_HINT = "pip install 'bakeoff[ray]' (pins: pip install -c constraints.txt 'bakeoff[ray]')"
TRIES = "ray_tries.json"
CANCEL_GRACE_S = 30.0
RETRY_REASON = "Ray retried it"
# Non-secret settings a cell task needs on any node (an API key is never sent: see below).
_PASSED_ENV = ("BAKEOFF_BACKENDS_DIR", "BAKEOFF_MODELS_DIR", "BAKEOFF_REPORTS_DIR", "BAKEOFF_ENGINE_PYTHON")


def import_ray() -> ModuleType:
    """Ray, or a clear error saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise SpecError(f"--ray: Ray is not installed in this environment; {INSTALL_HINT}") from exc
    return ray


def check_ray_fields(spec: CampaignSpec, cells: list[Cell]) -> None:
    """``gpu_type`` only where a GPU server will run; named by field, before anything starts."""
    if spec.warm_repeats:
        # Each Ray task starts and stops its own server: none could stay warm for the next round.
        raise SpecError("warm_repeats: a Ray task per cell cannot keep a server up between rounds; run without --ray")
    for i, server in enumerate(spec.servers):
        backend = next((c.backend for c in cells if c.server.label == server.label), None)
        if server.gpu_type and backend is not None and backend.accelerator != "gpu":
            raise SpecError(
                f"servers[{i}].gpu_type: {backend.name} runs on CPU; remove gpu_type (it selects GPU nodes)"
            )


def _needs_gpu(cell: Cell, cluster_has_gpus: bool) -> bool:
    # An already running server (url) holds no GPU here; a rehearsal's stand-in takes the GPUs
    # its server would (so the rendered commands show Ray's placement) only where there are any.
    if cell.backend.accelerator != "gpu" or cell.server.url:
        return False
    return cluster_has_gpus or not cell.rehearsed


def cell_options(cell: Cell, spec: CampaignSpec, *, cluster_has_gpus: bool = False) -> dict[str, Any]:
    """The Ray task options of one cell: resources and retry policy."""
    gpu = _needs_gpu(cell, cluster_has_gpus)
    options: dict[str, Any] = {}
    if gpu:
        options["num_gpus"] = gpu_count(cell.backend, cell.server.knobs)
        gpu_type = cell.server.gpu_type or spec.gpu_type
        if gpu_type:
            options["resources"] = {f"accelerator_type:{gpu_type}": 0.001}
    cpus = spec.ray.cpus_per_cell or (1.0 if gpu or cell.server.url else 2.0)
    if cell.client_processes:
        cpus = max(cpus, float(cell.client_processes + (0 if gpu else 1)))
    options["num_cpus"] = cpus
    options["max_retries"] = spec.ray.max_retries
    options["retry_exceptions"] = [LaunchError, ServerDiedError] if spec.ray.retry_exceptions else False
    options["name"] = f"bakeoff:{cell.cell_id}"
    return options


@dataclass(frozen=True)
class CellJob:
    """What a cell task needs: where the campaign lives, and which cell it is."""

    local: str  # the campaign folder (shared store) or the driver's copy
    uri: str | None  # the object store, when there is one
    cell_id: str  # its hand-over is cells/ID/cell_spec.json there (bakeoff.campaign.cell_spec)
    check_quality: bool = True  # false: the campaign's quality set is left out (a tune's probes and repeats)


def node_facts() -> dict[str, Any]:
    """This node as the run's provenance names it: Ray node id, host, GPU type and driver."""
    facts: dict[str, Any] = {"hostname": platform.node(), "node_id": None, "gpu_type": None, "gpu_driver": None}
    try:
        import ray

        if ray.is_initialized():
            facts["node_id"] = ray.get_runtime_context().get_node_id()
            nodes = ray.nodes()  # type: ignore[no-untyped-call]
            mine = [n for n in nodes if n.get("NodeID") == facts["node_id"]]
            labels = [
                k.split(":", 1)[1] for k in (mine[0].get("Resources", {}) if mine else {}) if "accelerator_type:" in k
            ]
            facts["gpu_type"] = labels[0] if labels else None
    except ImportError:
        pass

    found = gpus()  # (name, driver) per GPU nvidia-smi lists on this node
    if found:
        facts["gpu_type"] = facts["gpu_type"] or found[0][0]
        facts["gpu_driver"] = found[0][1]
    return facts


def _reap_elsewhere(node_id: str, cell_dir: str) -> list[int]:
    return reap_leftovers(Path(cell_dir))


def _reap_earlier(earlier: dict[str, Any], cell_dir: Path, here: dict[str, Any]) -> str:
    """Kill the server a lost try left; say where it ran. Its process group lives on its node only."""
    node = earlier.get("node_id")
    where = f"node {node} ({earlier.get('hostname')}), pid {earlier.get('pid')}"
    if node is None or node == here["node_id"]:
        reap_leftovers(cell_dir)
        return where
    import ray  # deferred: the ray extra
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    if any(n.get("NodeID") == node and n.get("Alive") for n in nodes):
        # Pinned to that node (soft=False): a group id means nothing anywhere else.
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        reaper = ray.remote(_reap_elsewhere).options(num_cpus=0, scheduling_strategy=strategy)
        ray.get(reaper.remote(node, str(cell_dir)), timeout=60)
    for pid_file in cell_dir.rglob(PID_FILE):
        pid_file.unlink(missing_ok=True)  # a dead node's groups are gone with it
    return where


def run_cell_task(job: CellJob) -> dict[str, Any]:
    """Body of a cell's Ray task: take over from a lost try if there was one, then measure the cell."""
    store = ResultStore(Path(job.local), job.uri)
    here = node_facts()
    with store.working_copy(job.cell_id) as campaign_dir:
        cell_dir = campaign_dir / "cells" / job.cell_id
        log = read_json(cell_dir / TRIES) if (cell_dir / TRIES).is_file() else {"tries": []}
        tries: list[dict[str, Any]] = log["tries"]
        if tries:  # this submission ran before and its worker or node was lost mid-cell
            where = _reap_earlier(tries[-1], cell_dir, here)
            salvage_runs(cell_dir)
            resume.archive_attempt(cell_dir, f"{RETRY_REASON}: the worker running it was lost ({where})")
            tries[-1]["outcome"] = "lost"
        tries.append({**here, "pid": os.getpid(), "started_at": resume.now_iso()})
        write_json(cell_dir / TRIES, log)
        store.push_file(cell_dir / TRIES, f"cells/{job.cell_id}/{TRIES}")  # a lost node must not lose the log
        outcome = "ok"
        try:
            run_cell(cell_dir / CELL_SPEC, check_quality=job.check_quality)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            tries[-1]["outcome"] = outcome
            tries[-1]["finished_at"] = resume.now_iso()
            write_json(cell_dir / TRIES, log)
            stamp_cell(cell_dir, here, tries)
    return {"cell_id": job.cell_id, "node": here, "tries": len(tries)}


def stamp_cell(cell_dir: Path, node: dict[str, Any], tries: list[dict[str, Any]]) -> None:
    """Node provenance into every run of the cell (summary and run.json), tries into cell.json."""
    for path in sorted((cell_dir / "runs").glob(f"*/{SUMMARY}")):
        summary = read_summary(path)
        update = {k: node[k] for k in ("node_id", "gpu_type", "gpu_driver")}
        write_summary(path, summary.model_copy(update={"provenance": summary.provenance.model_copy(update=update)}))
        info_path = path.parent / RUN_INFO
        if info_path.is_file():
            write_json(info_path, {**read_json(info_path), "node": node})
    info_path = cell_dir / CELL_INFO
    if info_path.is_file():
        retried = sum(1 for t in tries if t.get("outcome") == "lost")
        update_cell_record(info_path, ray={"node": node, "tries": tries, "retried": retried})


def passed_env() -> dict[str, str]:
    """The settings every task gets (see ``_PASSED_ENV``), as this driver has them."""
    return {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}


# Ray's own start-up waits that a setting can lengthen, raised for a local start (an operator's
# value in the environment wins). The GCS writes its port within 30 s by default, a worker
# connects to its raylet within 10 s: a busy host (or a ``nice``d start on one) misses both.
_START_WAITS = {"RAY_gcs_server_port_wait_time_s": "120", "RAY_raylet_start_wait_time_s": "60"}
LOCAL_START_TRIES = 2


def connect(ray: ModuleType, address: str | None, env: dict[str, str], **local: Any) -> bool:
    """Join the cluster at ``address`` (or RAY_ADDRESS, or a new local one); True if this call started Ray.

    ``local``: further ``ray.init`` arguments for a new local cluster (``num_cpus``, ``resources``).
    """
    if ray.is_initialized():
        return False
    runtime_env = {"env_vars": env} if env else None
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        return True
    for name, value in _START_WAITS.items():
        os.environ.setdefault(name, value)  # inherited by the GCS, the raylet and the workers it starts
    # Two of a local start's deadlines are fixed in Ray (2.60): the raylet gives its dashboard
    # agent 15 s to write its port file and aborts otherwise, and ray.init gives the node 30 s to
    # register. On a loaded host the agent's Python start-up alone can take longer; the next
    # try starts against warm caches and usually the load has moved. What fails twice is said.
    for attempt in range(1, LOCAL_START_TRIES + 1):
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            ray.init(runtime_env=runtime_env, log_to_driver=False, include_dashboard=False, **local)
            return True
        except Exception as exc:
            if "timed out" not in str(exc).lower() and not isinstance(exc, TimeoutError):
                raise
            print(f"Ray's local start, try {attempt} of {LOCAL_START_TRIES}: {exc}", file=sys.stderr, flush=True)
            # A node that failed in ray.init is not Ray's to shut down: stop what this try started.
            ray.shutdown()
            _stop_new_children(before)
    raise LaunchError(
        f"Ray's local node did not start in {LOCAL_START_TRIES} tries: its raylet gives its dashboard agent "
        "15 s to start and this host is too busy for that; start one with `ray start --head` when the host "
        "is quieter and pass its address (--ray ADDRESS)"
    )


def _stop_new_children(before: set[int]) -> None:
    """Terminate (then kill) this process's children started since ``before`` was taken."""
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in started:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(started, timeout=10)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def run_campaign_ray(
    campaign: Path | CampaignInput,
    out_dir: Path | None = None,
    only: list[str] | None = None,
    *,
    address: str | None = None,
    store: str | None = None,
    fresh: bool = False,
) -> Path:
    """``campaign run --ray``: every cell a Ray task; then the report, rendered here.

    ``campaign``: a campaign file, run as written, or :func:`load_input`'s rehearsal of one.
    """
    ray = import_ray()
    run = as_input(campaign)
    results = ResultStore.open(store, out_dir or reports_dir() / (run.written.name + run.suffix))
    failures = run_cells_on_ray(ray, run, results, only, address=address, fresh=fresh)
    report = render_report(results.local, failures)
    results.push_file(report, "report.html")
    results.push_file(results.local / "compare.ipynb", "compare.ipynb")
    return report


def run_cells_on_ray(
    ray: ModuleType,
    campaign: Path | CampaignInput,
    results: ResultStore,
    only: list[str] | None = None,
    *,
    address: str | None = None,
    fresh: bool = False,
) -> list[str]:
    """Plan on the driver, run the cells still to measure as Ray tasks; return the failed cells."""
    out = results.local
    if fresh:
        resume.start_over(out)
        results.delete("cells")
    results.pull("cells", out / "cells")  # what earlier runs of this campaign measured
    run = as_input(campaign)
    if run.written.gpu and not run.rehearsal:
        # The host, model and images before any task pulls an image. It examines the driver's
        # host: on a one-node cluster (a local start) that is where the cells run; a remote
        # cluster's nodes are not examined from here.
        refuse_on_problems(run_doctor(run.path), run.path)
    spec, cells = prepare(run, out, only)
    check_ray_fields(spec, cells)
    results.push_file(out / CAMPAIGN_COPY, CAMPAIGN_COPY)
    if (out / REHEARSAL_MARKER).is_file():
        results.push_file(out / REHEARSAL_MARKER, REHEARSAL_MARKER)
    results.push(out / "plans", "plans")
    salvage_runs(out / "cells")
    started = connect(ray, address, passed_env())
    has_gpus = float(ray.cluster_resources().get("GPU", 0)) > 0
    task = ray.remote(run_cell_task)
    pending: dict[Any, Cell] = {}
    failures: list[str] = []
    began = time.monotonic()
    # Fixed repeats queue every cell at once. ``repeats: auto`` queues one interleaved round
    # (its cells in parallel), waits for it, then asks the serial path's rule (auto_stop)
    # whether every verdict is decided: a round never starts that the campaign would not run.
    batches = rounds(cells) if spec.repeats == "auto" else [cells]
    (out / AUTO_REPEATS).unlink(missing_ok=True)
    results.delete(AUTO_REPEATS)
    try:
        for number, batch in enumerate(batches):
            for cell in batch:
                ref = _submit(task, cell, spec, results, has_gpus)
                if ref is not None:
                    pending[ref] = cell
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                cell = pending.pop(done[0])
                failures += _finish(ray, done[0], cell, results, began)
            if auto_stop(out, spec, batch[-1].repeat):
                results.push_file(out / AUTO_REPEATS, AUTO_REPEATS)
                for cell in (c for later in batches[number + 1 :] for c in later):
                    print(f"{cell.cell_id}: skipped (repeats: auto stopped after round {batch[-1].repeat})", flush=True)
                break
    except KeyboardInterrupt:
        # A plain cancel raises KeyboardInterrupt inside each task: run_cell tears its server
        # down as a local Ctrl-C does. Only what ignores it is then killed.
        for ref in pending:
            ray.cancel(ref)
        _, stuck = ray.wait(list(pending), num_returns=len(pending), timeout=CANCEL_GRACE_S)
        for ref in stuck:
            ray.cancel(ref, force=True)
        print(f"interrupted: finished cells are kept in {results.where()}; run the same command again", file=sys.stderr)
        raise
    finally:
        results.pull("cells", out / "cells")
        salvage_runs(out / "cells")
        if started:
            ray.shutdown()
    return failures


def _submit(task: Any, cell: Cell, spec: CampaignSpec, results: ResultStore, has_gpus: bool) -> Any:
    """Queue one cell as a Ray task (its earlier partial attempt archived); None if it is measured already."""
    out = results.local
    cell_dir = out / "cells" / cell.cell_id
    prior = resume.cell_state(cell_dir, cell_fingerprint(cell, out))
    if prior.state == "complete":
        print(f"{cell.cell_id}: {prior.reason}; skipped", flush=True)
        return None
    if prior.state != "new":
        resume.archive_attempt(cell_dir, prior.reason)
    (cell_dir / TRIES).unlink(missing_ok=True)  # a fresh submission: earlier tries are not its retries
    write_cell_spec(out, spec, cell)  # what the task measures, pushed with the folder
    results.delete(f"cells/{cell.cell_id}")
    results.push(cell_dir, f"cells/{cell.cell_id}")
    job = CellJob(str(out), results.uri, cell.cell_id)
    options = cell_options(cell, spec, cluster_has_gpus=has_gpus)
    print(f"{cell.cell_id}: queued on Ray ({_describe(options)})", flush=True)
    return task.options(**options).remote(job)


def _describe(options: dict[str, Any]) -> str:
    parts = [f"{options['num_cpus']:g} CPU"]
    if options.get("num_gpus"):
        parts.append(f"{options['num_gpus']} GPU")
    parts += list(options.get("resources", {}))
    return ", ".join(parts)


def _finish(ray: ModuleType, ref: Any, cell: Cell, results: ResultStore, began: float) -> list[str]:
    """Print how a cell's task ended; return ``[cell_id]`` if it failed."""
    cell_dir = results.local / "cells" / cell.cell_id
    results.pull(f"cells/{cell.cell_id}", cell_dir)
    clock = f"[{time.monotonic() - began:.0f}s]"
    try:
        answer = ray.get(ref)
    except Exception as exc:  # a task error (RayTaskError) or a lost worker past its retries
        print(f"{clock} {cell.cell_id}: FAILED: {type(exc).__name__}: {str(exc).splitlines()[-1][:300]}", flush=True)
        return [cell.cell_id]
    tries = answer["tries"]
    retried = f", retried {tries - 1}x after a lost worker" if tries > 1 else ""
    node = answer["node"]["hostname"]
    print(f"{clock} {cell.cell_id}: done on {node}{retried}: {cell_result(cell_dir)}", flush=True)
    return []
