"""Campaigns end to end: run every cell through its notebook, then the report.

The cells and their checks come from :mod:`bakeoff.campaign.cells`. ``bench.ipynb``
runs a cell (launch, load, save, its own plots) by calling :func:`run_cell`
(:mod:`bakeoff.campaign.cell_run`, one cell measured; here, the cells in order);
``compare.ipynb`` turns all cells into the comparison, exported to ``report.html``.
Everything a run needs is checked (:func:`bakeoff.campaign.cells.validate_campaign`)
before any server starts.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from pathlib import Path
from typing import Literal

import yaml

from bakeoff.analysis import verdict
from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.server_config import ServerConfig
from bakeoff.campaign import resume
from bakeoff.campaign.campaign_input import CampaignInput, as_input
from bakeoff.campaign.cell_run import run_cell, start_server
from bakeoff.campaign.cell_spec import cell_fingerprint, write_cell_spec
from bakeoff.campaign.cells import Cell, prepare
from bakeoff.campaign.doctor_run import refuse_on_problems, run_doctor
from bakeoff.campaign.ladder import LadderResult, StepOutcome, decide, outcome_of, waterfall_markdown
from bakeoff.campaign.preflight_cells import preflight_cells, refuse_on_failure
from bakeoff.campaign.progress import CampaignProgress, cell_estimate, cell_result
from bakeoff.campaign.runner import salvage_runs
from bakeoff.campaign.smoke import run_smoke
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.campaign.warm import WarmServers
from bakeoff.conformance.preflight import PreflightResult
from bakeoff.errors import SmokeFailedError, SpecError
from bakeoff.history.archive import archive_after_run, history_root
from bakeoff.history.calibration import calibrate
from bakeoff.measure.slo import resolve_slo
from bakeoff.models.model_source import resolve_model
from bakeoff.notebook import kernelrun
from bakeoff.notebook.htmlexport import export_html
from bakeoff.notebook.kernelrun import kernel_environment
from bakeoff.paths import notebook, notebook_kernel, reports_dir
from bakeoff.results.layout import (
    AUTO_REPEATS,
    LADDER_FILE,
    LADDER_MARKDOWN,
    PREFLIGHT_FILE,
    QUALITY_FILE,
    load_cells,
)
from bakeoff.results.smoke import SMOKE_FILE
from bakeoff.results.store import (
    atomic_write_bytes,
    read_json,
    write_json,
)
from bakeoff.serving.containers import reap_containers
from bakeoff.serving.handle import ServerHandle
from bakeoff.serving.process import reap_leftovers


def write_preflight(out: Path, checks: list[PreflightResult], *, skipped: bool) -> None:
    """What the pre-flight found per server (the image's own defaults among it), for each run's run.json."""
    servers = {c.label: c.to_json() for c in checks}
    write_json(out / PREFLIGHT_FILE, {"skipped": skipped, "servers": servers})


def run_campaign(
    campaign: Path | CampaignInput,
    out_dir: Path | None = None,
    only: list[str] | None = None,
    *,
    fresh: bool = False,
    skip_preflight: bool = False,
    smoke: SmokeMode = "auto",
    cell_notebooks: bool = True,
) -> Path:
    """Run every cell through ``bench.ipynb``, then ``compare.ipynb`` into ``report.html``.

    ``campaign``: a campaign file, run as written, or :func:`load_input`'s rehearsal of one.

    ``skip_preflight``: start the servers without parsing their launches first (for a launch
    the pre-flight cannot judge); said on the terminal and recorded in ``preflight.json``.
    ``smoke``: the smoke run (:mod:`bakeoff.campaign.smoke`) first; ``only`` runs nothing else
    and returns ``smoke.json``'s path; ``auto`` smokes real runs of GPU servers (see
    :func:`wants_smoke`). A failed smoke raises :class:`SmokeFailedError` before any cell.

    A rehearsal goes to ``reports/NAME-rehearsal`` unless told otherwise, never beside real runs.
    Cells the folder already holds, measured the same way, are skipped (:mod:`bakeoff.campaign.resume`);
    ``fresh`` measures everything again. Ctrl-C stops the running cell within seconds
    (:mod:`bakeoff.notebook.kernelrun`), keeps what it measured and renders no report.
    ``cell_notebooks``: false measures each cell in this process instead of a notebook kernel of
    its own (seconds quicker a cell: no kernel start, no per-cell figure); the same runs and
    cell record are written, its ``bench.ipynb`` shows them when opened, and a cell whose
    measuring code raises is failed and the campaign goes on, as with a kernel.
    """
    run = as_input(campaign)
    path, loaded = run.path, run.written
    out = (out_dir or reports_dir() / (loaded.name + run.suffix)).resolve()
    if fresh:
        resume.start_over(out)
    if loaded.gpu and not run.rehearsal:  # the host, model and images, in seconds, before any pull (bakeoff doctor)
        refuse_on_problems(run_doctor(path), path)
    if loaded.ladder is not None:
        if only:
            raise SpecError("--only: a ladder runs its steps in order from the baseline; drop --only")
        return _run_ladder(run, out, in_process=not cell_notebooks)
    spec, cells = prepare(run, out, only)
    # Each launch parsed by its framework (in its image, or a rehearsal stand-in) before any
    # server starts: a flag the release refuses costs seconds here, not a GPU start-up.
    checks = [] if skip_preflight else preflight_cells(cells, automatic=True)
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
    if wants_smoke(smoke, cells):
        smoked = smoke_campaign(spec, cells, out)
        if smoke == "only":
            return smoked
    failures: list[str] = []
    measured = calibrate(history_root())  # the history's start-up and decode figures, where it has them
    estimates = [cell_estimate(c, spec.measure_warm_restart, measured, warm=spec.warm_repeats) for c in cells]
    progress = CampaignProgress(estimates, tag=run.tag)
    with kernel_environment():
        try:
            _run_cells(cells, out, failures, progress, spec, in_process=not cell_notebooks)
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


def wants_smoke(mode: SmokeMode, cells: list[Cell]) -> bool:
    """Whether a campaign run smokes its servers first.

    ``auto``: a real run with a GPU server bakeoff launches: there a failed start or a wrong
    metric name found hours in costs booked GPU time; a CPU cell's failure costs what its
    smoke would, and a rehearsal smokes when asked (``--smoke``), to stay quick.
    """
    if mode != "auto":
        return mode == "only"
    if any(c.rehearsed for c in cells):
        return False
    return any(c.backend.accelerator == "gpu" and c.server.url is None for c in cells)


def smoke_campaign(spec: CampaignSpec, cells: list[Cell], out: Path) -> Path:
    """Smoke-run every server (:mod:`bakeoff.campaign.smoke`); the path of ``smoke.json``, or the failure raised."""
    source = resolve_model(spec.model)

    def start(cell: Cell, run_dir: Path) -> contextlib.AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]:
        return start_server(cell, source, spec.model.served_name, run_dir)

    result = run_smoke(cells, out, start)
    if not result.passed:
        raise SmokeFailedError(
            "the smoke run failed, so the campaign did not start: "
            + "; ".join(result.failures())
            + f" (every step: {out / SMOKE_FILE}; servers' logs under {out / 'smoke'}). "
            "Fix it and run again, or skip the smoke with --no-smoke"
        )
    return out / SMOKE_FILE


def _run_ladder(run: CampaignInput, out: Path, *, in_process: bool = False) -> Path:
    """Measure the baseline, then each ladder step on the last kept knobs (:mod:`bakeoff.campaign.ladder`).

    Each step becomes one more server of a plain campaign (``ladder-campaign.yaml``, no ladder
    section), measured alone, so the cells, the report and resuming work as for any campaign
    (a rehearsal's step campaign rehearsed as the ladder is: :meth:`CampaignInput.derived`).
    """
    path, spec = run.path, run.written
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
        _, cells = prepare(run.derived(derived), out, [server.label])
        refuse_on_failure(preflight_cells(cells, automatic=True), derived)
        reap_leftovers(out / "cells")
        salvage_runs(out / "cells", resolve_slo(spec.slo))
        measured = calibrate(history_root())
        estimates = [cell_estimate(c, spec.measure_warm_restart, measured, warm=spec.warm_repeats) for c in cells]
        progress = CampaignProgress(estimates, tag=run.tag)
        _run_cells(cells, out, failures, progress, spec, in_process=in_process)
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
    cells: list[Cell],
    out: Path,
    failures: list[str],
    progress: CampaignProgress,
    spec: CampaignSpec,
    *,
    in_process: bool = False,
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
            _run_one(cells, index, out, spec, failures, progress, warm, in_process=in_process)
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
    spec: CampaignSpec,
    failures: list[str],
    progress: CampaignProgress,
    warm: WarmServers | None = None,
    *,
    in_process: bool = False,
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
    handed = write_cell_spec(out, spec, cell)  # what the kernel (or this process) measures
    progress.start(index, cell.cell_id, line)
    if warm is not None or in_process:
        # A warm server lives in this process, so its cell is measured here, not in a notebook kernel
        # (bench.ipynb opened later shows its runs as for any cell); so is every cell when asked.
        try:
            run_cell(handed, warm=warm)
        except Exception as exc:  # what a kernel would contain: the cell fails, the campaign goes on
            failures.append(cell.cell_id)
            progress.end(cell.cell_id, False, f"{type(exc).__name__}: {str(exc)[:300]}")
            if warm is not None:
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
