"""Where bakeoff keeps things outside a checkout: the per-user cache of slow build steps."""

from __future__ import annotations

import os
from pathlib import Path


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
