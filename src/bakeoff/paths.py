"""Where bakeoff finds what it ships and where it writes: one resolution for every install.

What ships with bakeoff -- backends, notebooks, campaigns, docker files, quality prompt
sets, sample traces, the trained presets' weights (the project's top-level folders,
:data:`SHIPPED_FOLDERS`) and the report templates -- resolves the same way from a source
checkout, an editable install and a wheel: through :mod:`importlib.resources`, where a
wheel carries the top-level folders as ``bakeoff/_shipped/NAME`` (pyproject.toml maps
them there), and otherwise from the checkout the package was imported from.

What belongs to the user resolves against the working directory, each with an
environment variable that wins:

================ ========================= ==============================================
what             variable                  default
================ ========================= ==============================================
extra backends   ``BAKEOFF_BACKENDS_DIR``  ``./backends`` (when it exists): adds a backend,
                                           or overrides a shipped one of the same name
models           ``BAKEOFF_MODELS_DIR``    ``./models``
reports          ``BAKEOFF_REPORTS_DIR``   ``./reports``
user cache       ``BAKEOFF_CACHE_DIR``     ``$XDG_CACHE_HOME/bakeoff``
================ ========================= ==============================================

Notebook kernels run with a campaign folder as their working directory, so
:func:`kernel_environment` pins every working-directory default to an absolute path for
the kernels a campaign starts.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
from pathlib import Path

from bakeoff.errors import SpecError

SHIPPED_FOLDERS = ("backends", "notebooks", "campaigns", "docker", "quality", "traces", "pretrained")
BACKENDS_ENV = "BAKEOFF_BACKENDS_DIR"
MODELS_ENV = "BAKEOFF_MODELS_DIR"
REPORTS_ENV = "BAKEOFF_REPORTS_DIR"
# The package folder inside site-packages that holds the top-level folders in a wheel.
_PACKAGED = "_shipped"


def package_root() -> Path:
    """The installed ``bakeoff`` package folder (a real folder: bakeoff is not zip-safe)."""
    root = importlib.resources.files("bakeoff")
    if not isinstance(root, Path):
        raise SpecError("bakeoff is installed as a zip archive; install it as a folder (pip install, not zipapp)")
    return root


def checkout_root() -> Path | None:
    """The source checkout this package was imported from (editable or PYTHONPATH), if any."""
    candidate = package_root().resolve().parents[1]
    return candidate if (candidate / "pyproject.toml").is_file() and (candidate / "src" / "bakeoff").is_dir() else None


def shipped(name: str) -> Path:
    """A top-level project folder as shipped: the wheel's copy, else the checkout's."""
    if name not in SHIPPED_FOLDERS:
        raise ValueError(f"{name!r} is not shipped; shipped folders: {', '.join(SHIPPED_FOLDERS)}")
    packaged = package_root() / _PACKAGED / name
    if packaged.is_dir():
        return packaged
    checkout = checkout_root()
    if checkout is not None and (checkout / name).is_dir():
        return checkout / name
    raise SpecError(f"bakeoff's {name}/ folder is missing from this install ({packaged}); reinstall bakeoff")


def templates_dir() -> Path:
    """The nbconvert templates (package data in every install)."""
    return package_root() / "templates"


def notebook(name: str) -> Path:
    """``bench.ipynb`` or ``compare.ipynb`` as shipped."""
    path = shipped("notebooks") / name
    if not path.is_file():
        raise SpecError(f"no notebook {name!r} in {path.parent}")
    return path


KERNEL_NAME = "bakeoff"


def notebook_kernel() -> str:
    """The Jupyter kernel notebooks execute with: ``bakeoff`` when it runs this interpreter.

    scripts/bootstrap.sh installs the named kernel into the venv (``ipykernel install
    --sys-prefix --name bakeoff``), which is what JupyterLab offers for the notebooks. A
    ``bakeoff`` kernel of another environment would run another bakeoff, so then (and where
    none is installed, as in a plain ``pip install``) it is ipykernel's own ``python3``,
    which is always this interpreter.
    """
    # Deferred: the report extra; every module imports paths
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    except NoSuchKernel:
        return "python3"
    runs = Path(spec.argv[0]) if spec.argv else None
    same = runs is not None and runs.absolute() == Path(sys.executable).absolute()
    return KERNEL_NAME if same else "python3"


def _from_env(variable: str) -> Path | None:
    value = os.environ.get(variable)
    return Path(value).expanduser().resolve() if value else None


def user_backends_dir() -> Path | None:
    """The user's own backends folder: ``$BAKEOFF_BACKENDS_DIR``, else ``./backends`` if it exists.

    ``./backends`` of a checkout is the shipped folder itself, not an overlay.
    """
    explicit = _from_env(BACKENDS_ENV)
    if explicit is not None:
        if not explicit.is_dir():
            raise SpecError(f"{BACKENDS_ENV}={explicit}: not a folder; point it at a folder of backend YAML files")
        return explicit
    local = Path.cwd() / "backends"
    if local.is_dir() and local.resolve() != shipped("backends").resolve():
        return local.resolve()
    return None


def backend_dirs() -> list[Path]:
    """Where backend YAML files are looked up, first match wins: the user's folder, then shipped."""
    user = user_backends_dir()
    return [user, shipped("backends")] if user is not None else [shipped("backends")]


def models_dir() -> Path:
    """Generated models: ``$BAKEOFF_MODELS_DIR``, else ``./models``."""
    return _from_env(MODELS_ENV) or Path.cwd().resolve() / "models"


def reports_dir() -> Path:
    """Campaign output folders: ``$BAKEOFF_REPORTS_DIR``, else ``./reports``."""
    return _from_env(REPORTS_ENV) or Path.cwd().resolve() / "reports"


def campaign_file(ref: Path) -> Path:
    """A campaign given as a path, or by the name of a shipped one (``cpu-demo``)."""
    if ref.is_file():
        return ref
    if ref.parent == Path("."):
        stem = ref.name.removesuffix(".yaml").removesuffix(".yml")
        candidate = shipped("campaigns") / f"{stem}.yaml"
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(p.stem for p in shipped("campaigns").glob("*.yaml")))
    raise SpecError(f"campaign file not found: {ref} (looked in {Path.cwd()}); shipped campaigns: {known}")


def user_cache_dir() -> Path:
    """``$BAKEOFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/bakeoff`` (``~/.cache/bakeoff``).

    Image build times, TensorRT-LLM engines and the llama.cpp build live here, shared by
    every checkout on the machine, so a fresh clone (CI) does not rebuild them.
    """
    base = os.environ.get("BAKEOFF_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "bakeoff"
