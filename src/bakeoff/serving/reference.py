"""Starting the reference server (:mod:`bakeoff.ref`) in its own process, for tests, benchmarks and rehearsals.

The reference server imports nothing of the harness and is started by argv like any
framework; this is the harness's side of that: the argv from :class:`RefOptions` fields,
a free port, and the same readiness wait a real server gets.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bakeoff.ref.options import MODEL, RefOptions
from bakeoff.ref.profiles import make_profile
from bakeoff.ref.server import option_flag
from bakeoff.serving.process import free_port, wait_ready


@contextlib.contextmanager
def serve_reference(
    model: str = MODEL,
    startup_timeout_s: float = 20.0,
    api_key_env: str | None = None,
    profile: str = "generic",
    warmup_s: float | None = None,
    canned: Path | None = None,
    **options: Any,
) -> Iterator[str]:
    """Start the reference server in its own process on a free port; yield its base URL.

    ``options`` are :class:`RefOptions` fields. ``api_key_env`` names the variable (in this
    process's environment, which the server inherits) holding the key it then requires.
    ``profile`` picks whose wire protocol it speaks (:mod:`bakeoff.ref.profiles`); it is
    ready once its ``/health`` answers 200 (SGLang's only after ``warmup_s``).
    The process is killed on exit: a graceful stop would wait for stalled streams.
    """
    RefOptions(**options)  # reject a typo here rather than as a failed start
    make_profile(profile, warmup_s)
    port = free_port()
    argv = [sys.executable, "-m", "bakeoff.ref.server", "--port", str(port), "--model", model, "--profile", profile]
    if warmup_s is not None:
        argv += ["--warmup-s", str(warmup_s)]
    if canned is not None:
        argv += ["--canned", str(canned)]
    headers = {}
    if api_key_env:
        argv += ["--api-key-env", api_key_env]
        headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
    for name, value in options.items():
        if isinstance(value, bool):
            argv.append(option_flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [option_flag(name), str(value)]
    base_url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bakeoff-ref-") as tmp:
        log_path = Path(tmp) / "refserver.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_ready(
                base_url + "/health",
                timeout_s=startup_timeout_s,
                interval_s=0.05,
                still_running=lambda: proc.poll() is None,
                log_path=log_path,
                what="reference server",
                headers=headers,
            )
            yield base_url
        finally:
            proc.kill()
            proc.wait()
