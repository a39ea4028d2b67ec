"""``bakeoff tune --ray``: a tune's cells as Ray tasks, its study on the driver.

The search is :mod:`bakeoff.campaign.tune`'s, unchanged: the driver holds the Optuna study
(its journal in the tune's folder), asks for a trial, tells its result, prunes and picks. What
moves to the cluster is each measurement: the untuned start, a trial's probe and full run, each
finalist's repeats are each one Ray task running :func:`bakeoff.cluster.ray_runner.run_cell_task`
with the resources :func:`bakeoff.cluster.ray_runner.cell_options` asks for (a GPU server's
``tensor_parallel_size`` GPUs, its ``gpu_type``), as ``campaign run --ray`` places cells. The
task starts the server and drives the load on the same node, and stamps the node into the
cell's provenance.

The tune folder must be one every node sees (a local Ray, or a shared mount): the trial servers
the driver appends to its ``campaign.yaml`` are read there by each task. A trial's error (a
launch that failed, a server that died) comes back as that error, so the trial is listed as
failed exactly as when it runs here; Ctrl-C cancels the running task, which tears its server
down, and the tune resumes from its journal on the next run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from bakeoff.campaign.campaign_input import CampaignInput
from bakeoff.campaign.cells import Cell
from bakeoff.campaign.specs import load_campaign
from bakeoff.campaign.tune import tune_campaign
from bakeoff.cluster.ray_runner import (
    CANCEL_GRACE_S,
    TRIES,
    CellJob,
    cell_options,
    connect,
    import_ray,
    passed_env,
    run_cell_task,
)
from bakeoff.cluster.ray_store import CAMPAIGN_COPY
from bakeoff.errors import LaunchError, ServerDiedError, SpecError


@dataclass
class RayCellRunner:
    """Measures one cell of a tune folder as a Ray task and waits for it (a :data:`CellRunner`)."""

    ray: ModuleType

    def __post_init__(self) -> None:
        self.task = self.ray.remote(run_cell_task)

    def __call__(self, out: Path, cell: Cell, check_quality: bool) -> dict[str, Any]:
        spec = load_campaign(out / CAMPAIGN_COPY)  # the trial servers added so far
        (out / "cells" / cell.cell_id / TRIES).unlink(missing_ok=True)  # a new submission, not a retry
        job = CellJob(str(out), None, cell.cell_id, check_quality)
        ref = self.task.options(**cell_options(cell, spec)).remote(job)
        try:
            answer: dict[str, Any] = self.ray.get(ref)
        except KeyboardInterrupt:
            # A plain cancel raises KeyboardInterrupt in the task: run_cell stops its server as a local Ctrl-C does.
            self.ray.cancel(ref)
            _, stuck = self.ray.wait([ref], timeout=CANCEL_GRACE_S)
            if stuck:
                self.ray.cancel(ref, force=True)
            raise
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, LaunchError | ServerDiedError | SpecError):
                raise cause from exc  # the trial fails as it would here; the tune goes on
            raise
        print(f"{cell.cell_id}: done on Ray ({answer['node']['hostname']})", flush=True)
        return answer


def tune_campaign_ray(
    campaign: Path | CampaignInput,
    out_dir: Path | None = None,
    *,
    address: str | None = None,
    fresh: bool = False,
) -> Path:
    """``bakeoff tune --ray``: the tune of :func:`bakeoff.campaign.tune.tune_campaign`, every cell a Ray task."""
    ray = import_ray()
    started = connect(ray, address, passed_env())
    try:
        return tune_campaign(campaign, out_dir, fresh=fresh, runner=RayCellRunner(ray))
    finally:
        if started:
            ray.shutdown()
