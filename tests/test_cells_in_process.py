"""Cells measured in bakeoff's own process (``cell_notebooks=False``, ``--no-cell-notebooks``).

The same runs, records and report as through a notebook kernel per cell; no kernel starts, so
no cell's ``bench.ipynb`` is executed; and a cell whose measuring code raises fails alone, as a
kernel would have contained it, while the campaign goes on to the next cell and the report.
The kernel path itself: tests/test_resume.py (Ctrl-C through the kernel), tests/test_packaging.py
and tests/test_e2e_container.py (every cell's notebook).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from bakeoff.campaign import cell_run, execute
from bakeoff.campaign.cell_spec import read_cell_spec
from bakeoff.campaign.execute import run_campaign
from bakeoff.results.cell_record import read_cell_record
from bakeoff.results.layout import load_cells

BACKEND = """\
name: refinproc
display_name: reference server (in-process cells test)
runtime: process
accelerator: cpu
command: ["{python}", "-m", "bakeoff.ref.server", "--port", "{port}", "--model", "{served_model_name}",
          "--ttft-ms", "5", "--itl-ms", "5"]
health: {path: /health, timeout_s: 20, interval_s: 0.1}
cache_reset: {kind: none}
"""


def _campaign(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch, labels: tuple[str, ...], requests: int
) -> Path:
    """A campaign of reference servers (``labels``) on one concurrency level, its backend found by env."""
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "refinproc.yaml").write_text(BACKEND)
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(tmp_path / "backends"))
    servers = ", ".join(f"{{backend: refinproc, label: {label}}}" for label in labels)
    path = tmp_path / "c.yaml"
    path.write_text(
        f"name: inproc\nmodel: {{path: {model}, served_name: m}}\nservers: [{servers}]\n"
        f"workloads: [{{kind: concurrency, name: w, levels: [2], requests_per_level: {requests}, warmup_requests: 0,"
        " input_len: 8, output_len: 8, min_duration_s: 0}]\n"
        "measure_warm_restart: false\nrepeats: 1\n"
    )
    return path


def test_in_process_cells_measure_without_a_kernel_and_a_raising_cell_fails_alone(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _campaign(tmp_path, tiny_model, monkeypatch, ("a", "b", "c"), requests=6)
    real = execute.run_cell

    def run_cell(cell_spec: Path, **kw: Any) -> dict[str, Any]:
        if read_cell_spec(cell_spec).server.label == "b":
            raise RuntimeError("planted: b's measuring code raised")
        return real(cell_spec, **kw)

    monkeypatch.setattr(execute, "run_cell", run_cell)
    report = run_campaign(path, out_dir=tmp_path / "out", cell_notebooks=False)

    assert report.is_file()
    said = capsys.readouterr()
    assert "RuntimeError: planted: b's measuring code raised" in said.out, said.out
    assert "cells that failed: b__w" in said.err, said.err
    cells = {c.server["label"]: c for c in load_cells(tmp_path / "out")}
    for label in ("a", "c"):  # before and after the failed cell
        cell = cells[label]
        assert cell.status == "ok" and set(cell.summaries) == {"c2"}, (label, cell.status)
        assert cell.summaries["c2"].requests.ok == 6
        assert not (cell.dir / "bench.ipynb").exists()  # measured here: no kernel executed it


@pytest.mark.parametrize(
    ("raised", "status"), [(RuntimeError("planted fault"), "failed"), (asyncio.CancelledError(), "interrupted")]
)
def test_a_cell_ended_by_anything_else_records_what_ended_it(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, raised: BaseException, status: str
) -> None:
    """Not only the interrupt and a failed start: whatever ends a cell's measuring code leaves its
    record saying so (CI once found a Ctrl-C'd cell still "running", with no word of why)."""
    path = _campaign(tmp_path, tiny_model, monkeypatch, ("a",), requests=4)

    def measure(*args: Any, **kwargs: Any) -> None:
        raise raised

    monkeypatch.setattr(cell_run, "_measure_cell", measure)
    with contextlib.suppress(BaseException):  # how the campaign goes on is the other tests'
        run_campaign(path, out_dir=tmp_path / "out", cell_notebooks=False)
    record = read_cell_record(tmp_path / "out" / "cells" / "a__w" / "cell.json")
    assert record.status == status
    assert record.error is not None and record.error.startswith(type(raised).__name__)
