"""compare.ipynb opened with its default parameters says what to set and stops, quietly; a notebook
run to its end gets no SIGINT at kernel shutdown."""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
import papermill
import pytest

from bakeoff.notebook import kernelrun
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


# A process the notebook starts in the kernel's process group, as jupyter_client signals it: it
# writes down every SIGINT and SIGTERM it gets, and exits on SIGTERM (the kernel's own shutdown
# terminates its children).
SIGNAL_PROBE = """
import signal, sys, time
from pathlib import Path
log = Path(sys.argv[1])
def note(name, stop):
    def handler(*_):
        with log.open("a") as f:
            f.write(name + "\\n")
        if stop:
            sys.exit(0)
    return handler
signal.signal(signal.SIGINT, note("SIGINT", False))
signal.signal(signal.SIGTERM, note("SIGTERM", True))
log.write_text("ready\\n")
time.sleep(60)
"""


def test_a_notebook_run_to_its_end_gets_no_sigint_and_logs_no_keyboard_interrupt(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "signals.log"
    cell = f"""
        import subprocess, sys, threading, time
        from pathlib import Path
        probe = subprocess.Popen([sys.executable, "-c", {SIGNAL_PROBE!r}, {str(log)!r}])
        threading.Thread(target=probe.wait, daemon=True).start()  # reaped at once: no zombie to wait on
        while not Path({str(log)!r}).is_file():
            time.sleep(0.05)
    """
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(textwrap.dedent(cell))]
    book.metadata["kernelspec"] = {"name": notebook_kernel(), "display_name": "bakeoff", "language": "python"}
    nbformat.write(book, tmp_path / "in.ipynb")
    kernelrun.execute(tmp_path / "in.ipynb", tmp_path / "out.ipynb", {}, tmp_path, kernel_name=notebook_kernel())
    # jupyter_client interrupted every kernel it shut down: a SIGINT to the kernel's whole group, which a
    # kernel inside a handler logged as "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel".
    received = log.read_text().split()
    assert received == ["ready", "SIGTERM"], received  # the kernel's shutdown stopped it; nothing else came
    assert "KeyboardInterrupt" not in capfd.readouterr().err
