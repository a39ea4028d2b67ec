"""The parameter checks ``bench.ipynb`` runs first: what to set, instead of a traceback.

``bench.ipynb`` both drives a campaign cell (``bakeoff campaign run`` executes it with
``measure=True``) and shows that cell's saved runs when a person opens it later. Opened
on its own, with the default parameters, it must say which values to set; re-run on saved
results, it must never relaunch the server and overwrite the runs the report was built
from. :func:`bench_ready` decides, and says why in Markdown when the answer is no.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bakeoff.results.layout import CAMPAIGN_COPY, CELL_SEPARATOR, cell_folder_name
from bakeoff.results.store import SUMMARY


@dataclass(frozen=True)
class GuardResult:
    """Whether the notebook goes on, and what it tells the reader either way."""

    ready: bool
    message: str


def _cells(campaign: Path) -> list[str]:
    folder = campaign / "cells"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _saved_runs(cell_dir: Path) -> list[str]:
    runs = cell_dir / "runs"
    return sorted(p.name for p in runs.iterdir() if (p / SUMMARY).is_file()) if runs.is_dir() else []


def _choices(campaign: Path) -> str:
    cells = _cells(campaign)
    if not cells:
        return "It has no cells yet: run `bakeoff campaign run` for it first."
    pairs = [cell.split(CELL_SEPARATOR)[:2] for cell in cells if cell.count(CELL_SEPARATOR) == 1]
    listed = "\n".join(f"- `server_label = {s!r}`, `workload_name = {w!r}`" for s, w in pairs)
    return f"Its cells:\n{listed}"


def _campaign_folder(campaign_dir: str, unset: str) -> Path | GuardResult:
    """The campaign folder a notebook parameter names, or the result saying what to set."""
    if not campaign_dir:
        return GuardResult(False, unset)
    campaign = Path(campaign_dir).expanduser().resolve()
    if not (campaign / CAMPAIGN_COPY).is_file():
        return GuardResult(
            False,
            f"**`campaign_dir` = `{campaign}` is not a campaign folder** (no `{CAMPAIGN_COPY}` in it). "
            "Point it at `reports/NAME` as written by `bakeoff campaign run`.",
        )
    return campaign


def bench_ready(
    campaign_dir: str, server_label: str, workload_name: str, *, measure: bool, repeat: int = 1
) -> GuardResult:
    """Check bench.ipynb's parameters against the campaign folder; never starts anything."""
    campaign = _campaign_folder(
        campaign_dir,
        "**Nothing to show yet.** Set `campaign_dir` in the parameters cell to a campaign folder "
        "(`reports/NAME`, written by `bakeoff campaign run`), and `server_label` and `workload_name` "
        "to one of its cells, then run the notebook again. It shows that cell's saved runs; "
        "`measure = True` re-measures the cell instead (launches its server, replaces its runs).",
    )
    if isinstance(campaign, GuardResult):
        return campaign
    if not server_label or not workload_name:
        return GuardResult(
            False, f"**Set `server_label` and `workload_name`** to one cell of `{campaign}`. " + _choices(campaign)
        )
    cell_id = cell_folder_name(server_label, workload_name, repeat)
    if measure:
        return GuardResult(True, f"Measuring cell `{cell_id}`: its server is launched and its runs are replaced.")
    runs = _saved_runs(campaign / "cells" / cell_id)
    if not runs:
        return GuardResult(
            False,
            f"**No saved runs for cell `{cell_id}`** in `{campaign}`. {_choices(campaign)}\n\n"
            "To measure it here, set `measure = True` (launches the server; a campaign run does this).",
        )
    return GuardResult(
        True,
        f"Showing the {len(runs)} saved run(s) of cell `{cell_id}`; nothing is re-measured "
        "(set `measure = True` to launch the server and replace them).",
    )


def compare_ready(campaign_dir: str) -> GuardResult:
    """Check compare.ipynb's one parameter: a campaign folder with at least one saved run."""
    campaign = _campaign_folder(
        campaign_dir,
        "**Nothing to compare yet.** Set `campaign_dir` in the parameters cell to a campaign folder "
        "(`reports/NAME`, written by `bakeoff campaign run`) and run the notebook again; "
        "`bakeoff report reports/NAME` renders the same comparison to HTML.",
    )
    if isinstance(campaign, GuardResult):
        return campaign
    if not any(_saved_runs(campaign / "cells" / cell) for cell in _cells(campaign)):
        return GuardResult(False, f"**No saved runs in `{campaign}` yet.** Run `bakeoff campaign run` for it first.")
    return GuardResult(True, "")


class NotebookStop(Exception):
    """Ends a notebook's run quietly after it said what to set (no traceback in Jupyter)."""

    def _render_traceback_(self) -> list[str]:  # IPython's hook: render nothing
        return []


def stop_unless(guard: GuardResult) -> None:
    """Show the guard's message and stop the notebook (Run All too) when it is not ready."""
    from IPython.display import Markdown, display  # deferred: IPython is there only inside a notebook kernel

    if guard.message:
        display(Markdown(guard.message))  # type: ignore[no-untyped-call]
    if not guard.ready:
        raise NotebookStop(guard.message)
