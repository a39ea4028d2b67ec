"""Execute a notebook with papermill so that Ctrl-C reaches the code running in its kernel.

Why a plain ``papermill.execute_notebook`` ignores Ctrl-C: jupyter_client starts the
kernel in a session of its own (``start_new_session``), so the terminal's SIGINT, sent to
bakeoff's process group, never reaches the kernel; and nbclient, while it executes,
replaces bakeoff's SIGINT handler with one that only schedules a polite kernel shutdown,
which a kernel busy measuring does not act on. The cell, its warm restart and the report
then all ran to the end.

Here papermill runs in a worker thread (nbclient installs no signal handler off the main
thread), and the main thread waits. On Ctrl-C it interrupts the kernel as Jupyter's
"interrupt" button does: SIGINT to the kernel process. Inside the kernel that is a
``KeyboardInterrupt`` in the measuring code, which stops the load, writes what was
measured, tears the server down and marks the cell interrupted. After ``grace_s`` (or a
second Ctrl-C) the kernel is killed instead; the campaign then reaps the server from its
recorded process group. Either way :func:`execute` raises ``KeyboardInterrupt``.

That is the only SIGINT a kernel gets: the one jupyter_client sends every kernel it shuts
down is left out (:mod:`.quiet_shutdown`), so a run nobody interrupted logs no
``KeyboardInterrupt caught in kernel``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from bakeoff.paths import BACKENDS_ENV, MODELS_ENV, models_dir, user_backends_dir
from bakeoff.serving.engine_env import ENGINE_PYTHON_ENV, find_engine_python

# Time the kernel gets to stop its load and tear its server down after the interrupt.
GRACE_S = 30.0


def kernel_processes() -> list[psutil.Process]:
    """This process's notebook kernels (children running ipykernel)."""
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any("ipykernel" in part for part in child.cmdline()):
                found.append(child)
    return found


def _signal_kernels(sig: signal.Signals) -> None:
    for kernel in kernel_processes():
        with contextlib.suppress(psutil.Error):
            kernel.send_signal(sig)


def execute(
    notebook: Path,
    output: Path,
    parameters: dict[str, Any],
    cwd: Path,
    *,
    kernel_name: str | None = None,
    grace_s: float = GRACE_S,
) -> None:
    """``papermill.execute_notebook`` that Ctrl-C interrupts within seconds (see the module doc).

    Errors of the notebook (``PapermillExecutionError``, ``DeadKernelError``) are raised
    as papermill raises them; an interrupt raises ``KeyboardInterrupt`` once the kernel
    has stopped.
    """
    import papermill  # deferred: the report extra, heavy to import

    from bakeoff.notebook.quiet_shutdown import QuietShutdownKernelManager  # jupyter_client: the report extra

    errors: list[BaseException] = []

    def work() -> None:
        try:
            papermill.execute_notebook(
                str(notebook),
                str(output),
                parameters=parameters,
                kernel_name=kernel_name,
                progress_bar=False,
                cwd=str(cwd),
                # The kernel warns at start that it runs over (local) TCP: one noise line per cell.
                extra_arguments=["--IPKernelApp.log_level=ERROR"],
                # No SIGINT to the kernel when nbclient shuts it down after the last cell.
                kernel_manager_class=QuietShutdownKernelManager,
            )
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    thread = threading.Thread(target=work, name=f"papermill-{notebook.stem}", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
    except KeyboardInterrupt:
        print(f"  interrupting {output.parent.name}: stopping the load and its server", file=sys.stderr, flush=True)
        _stop_kernel(thread, grace_s)
        raise
    if errors:
        raise errors[0]


def _stop_kernel(thread: threading.Thread, grace_s: float) -> None:
    _signal_kernels(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    try:
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(0.2)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: no more waiting
    if thread.is_alive():
        print("  the kernel did not stop in time: killing it", file=sys.stderr, flush=True)
        _signal_kernels(signal.SIGKILL)
        thread.join(5.0)


@contextlib.contextmanager
def kernel_environment() -> Iterator[None]:
    """Pin the working-directory defaults for notebook kernels, which run in campaign folders.

    A kernel inherits the environment, not the working directory: without this, a kernel
    would look for ``models/`` and ``backends/`` inside the campaign folder. Restored on exit.
    """

    pinned: dict[str, str] = {MODELS_ENV: str(models_dir())}
    user = user_backends_dir()
    if user is not None:
        pinned[BACKENDS_ENV] = str(user)
    engine = find_engine_python()
    if engine is not None:
        pinned[ENGINE_PYTHON_ENV] = str(engine)
    saved = {name: os.environ.get(name) for name in pinned}
    os.environ.update(pinned)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
