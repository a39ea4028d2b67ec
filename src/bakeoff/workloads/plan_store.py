"""Turn a workload spec into request plans: the exact requests every backend receives.

A plan is generated once per campaign from the model's tokenizer and a seed, saved as
JSON beside the results, and replayed identically to every backend, so a comparison is
between servers, never between prompt sets. Multi-turn plans fix the user turns; the
assistant turns are the server's real replies, appended while the run goes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from bakeoff.errors import SpecError
from bakeoff.results.store import atomic_write_bytes
from bakeoff.workloads.kinds import Trace, Workload
from bakeoff.workloads.plans import RunPlan
from bakeoff.workloads.traces.loading import resolve_trace_path

PLAN_INDEX = "index.json"
PLAN_INPUTS = "inputs.json"


def plan_inputs(wl: Workload, tokenizer_file: Path | None, context_limit: int | None) -> dict[str, Any]:
    """What a plan depends on beyond its workload spec: a change to any of these re-plans.

    The tokenizer decides every prompt's tokens; the context limit decides what a trace
    clips; a trace's rows live in its file, not in the spec.
    """

    def digest(path: Path | None) -> str | None:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None and path.is_file() else None

    inputs: dict[str, Any] = {"tokenizer_sha256": digest(tokenizer_file), "context_limit": context_limit}
    if isinstance(wl, Trace):
        inputs["trace_sha256"] = digest(resolve_trace_path(wl.path))
    return inputs


def save_plans(plans: list[RunPlan], folder: Path, inputs: dict[str, Any] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for plan in plans:
        atomic_write_bytes(folder / f"{plan.name}.json", plan.to_json())
    atomic_write_bytes(folder / PLAN_INPUTS, orjson.dumps(inputs or {}))
    # The index keeps run order (c1, c4, c16), which file names sort wrongly; written last, it marks completion.
    atomic_write_bytes(folder / PLAN_INDEX, orjson.dumps([p.name for p in plans]))


def plans_match(folder: Path, workload: dict[str, Any], inputs: dict[str, Any] | None = None) -> bool:
    """True when ``folder`` holds plans made from exactly this workload spec and these inputs."""
    index = folder / PLAN_INDEX
    if not index.is_file():
        return False
    if inputs is not None:
        saved = folder / PLAN_INPUTS
        if not saved.is_file() or orjson.loads(saved.read_bytes()) != inputs:
            return False
    first = orjson.loads(index.read_bytes())[0]
    return bool(orjson.loads((folder / f"{first}.json").read_bytes())["workload"] == workload)


def load_plans(folder: Path) -> list[RunPlan]:
    index = folder / PLAN_INDEX
    if not index.is_file():
        raise SpecError(f"no request plans in {folder}; run the campaign (it writes them) first")
    return [RunPlan.from_json((folder / f"{name}.json").read_bytes()) for name in orjson.loads(index.read_bytes())]
