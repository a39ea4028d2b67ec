"""compare.ipynb opened with its default parameters says what to set and stops, quietly."""

from __future__ import annotations

from pathlib import Path

import papermill
import pytest

from bakeoff.notebook.guards import NotebookStop, compare_ready
from bakeoff.paths import notebook, notebook_kernel


def test_compare_ready_names_what_to_set(tmp_path: Path) -> None:
    assert not compare_ready("").ready and "campaign_dir" in compare_ready("").message
    assert "not a campaign folder" in compare_ready(str(tmp_path)).message
    (tmp_path / "campaign.yaml").write_text("name: x\n")
    assert "No saved runs" in compare_ready(str(tmp_path)).message
    # IPython renders no traceback for the stop: the message shown before it is all a reader sees.
    assert NotebookStop("x")._render_traceback_() == []


def test_compare_notebook_with_default_parameters_explains_instead_of_failing(tmp_path: Path) -> None:
    out = tmp_path / "compare.ipynb"
    with pytest.raises(papermill.PapermillExecutionError) as stopped:
        papermill.execute_notebook(
            str(notebook("compare.ipynb")), str(out), kernel_name=notebook_kernel(), progress_bar=False
        )
    assert stopped.value.ename == "NotebookStop"  # the planned stop, not a traceback from deeper down
    shown = out.read_text()
    assert "Nothing to compare yet" in shown and "campaign_dir" in shown
