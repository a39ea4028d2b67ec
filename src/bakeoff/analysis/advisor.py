"""The tuning advisor: from the diagnosis, the next knob to turn, and the campaign that tests it.

For each measured server and workload, :func:`advise` walks the knobs in cost order —
cheapest to try first:

1. concurrency and batching caps (``max_num_seqs``, ``max_num_batched_tokens``,
   ``chunked_prefill``): a restart, nothing else changes;
2. quantization (``kv_cache_dtype``; weight ``quantization`` needs another checkpoint,
   so it is named, not written);
3. the KV-cache share (``gpu_memory_utilization``, ``kv_cache_space_gib``);
4. context limits (``max_model_len``);
5. parallelism (``tensor_parallel_size`` on GPU, ``threads`` on CPU).

and proposes the first change that addresses the diagnosed bound, that the backend has,
that its spec accepts (:func:`bakeoff.serving.knobs.check_knob`) and that differs from the value
measured. Each advice must follow from the series it cites
(:class:`bakeoff.analysis.diagnosis.Signals`):

- a batching cap is raised first, whatever the bound, when requests waited while the number
  running sat at the cap below the offered load (and the KV pool was not the reason);
- an 8-bit KV cache is proposed only when the KV pool was near full or requests were preempted,
  and only where the measured host can run it (its CPU flags, as the run recorded them, against
  the knob's ``needs_cpu``); passed over, the step proposed instead says why.

:func:`write_campaign` writes a campaign that runs the current configuration and the proposed
one side by side, on the diagnosed load level of the workload concerned only (the advised change
and nothing else), same model and SLO; ``bakeoff advise`` validates it before saying so.
:func:`write_tune_campaign` hands the advice to ``bakeoff tune`` instead: the current servers
with a ``tune:`` section searching just the advised knobs, around the proposed values.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bakeoff.analysis.diagnosis import Bound, Diagnosis, diagnose_cells
from bakeoff.analysis.roofline import efficiencies
from bakeoff.errors import BakeoffError, SpecError
from bakeoff.results.layout import CellResult, load_cells
from bakeoff.results.store import RUN_INFO, read_json
from bakeoff.serving.backends import BackendSpec, KnobValue, load_backend
from bakeoff.serving.cpu_checks import host_cpu_flags, refusal
from bakeoff.serving.knobs import check_knob
from bakeoff.serving.tune_space import COST_ORDER as COST_ORDER  # the one cost order, shared with tune


@dataclass
class Step:
    """One proposed change: which knob of which server, from what to what, and why."""

    server: str
    workload: str
    backend: str
    stage: str  # one of COST_ORDER
    knob: str
    current: KnobValue | None
    proposed: KnobValue
    reason: str
    diagnosis: Diagnosis
    knobs: dict[str, KnobValue] = field(default_factory=dict)  # the server's knobs as measured

    @property
    def label(self) -> str:
        text = str(self.proposed).replace(" ", "").replace("/", "-")
        return f"{self.server}-{self.knob}-{text}"[:80]

    def markdown(self) -> str:
        evidence = "; ".join(self.diagnosis.evidence) or "see the sweep"
        return (
            f"**{self.server} / {self.workload}** ({self.diagnosis.bound}-bound): set `{self.knob}` "
            f"{self.current!r} → {self.proposed!r} ({self.stage.replace('_', ' ')}). {self.reason} "
            f"Evidence: {evidence}."
        )


def _current(backend: BackendSpec, knobs: Mapping[str, KnobValue], name: str) -> KnobValue | None:
    if name in knobs:
        return knobs[name]
    spec = backend.knobs.get(name)
    return spec.default if spec is not None else None


Proposal = Callable[[BackendSpec, Mapping[str, KnobValue], Diagnosis], tuple[KnobValue, str] | None]


def _seqs_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cur = _current(backend, knobs, "max_num_seqs")
    if not isinstance(cur, int):
        return None
    target = max(cur * 2, int(d.level or 0))
    return target, "Let more requests share a batch: the engine had room while requests queued."


def _cap_binds(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    """Requests waited while running sat at the cap, below the offered load, and not for want of KV."""
    cur = _current(backend, knobs, "max_num_seqs")
    seen = d.signals
    if not isinstance(cur, int) or d.level is None or cur >= d.level or seen.kv_pressure or not seen.queued():
        return None
    if seen.running_max is None or seen.running_max < cur:
        return None
    return max(cur * 2, int(d.level)), (
        f"Requests waited ({seen.waiting_mean:.1f} on average) while running sat at the cap of {cur} "
        f"with {d.level:g} offered: let more requests share a batch."
    )


def _seqs_up_if_capped(
    backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis
) -> tuple[KnobValue, str] | None:
    # Batching still pays; a cap above the busiest level tested changes nothing there.
    cur = _current(backend, knobs, "max_num_seqs")
    if not isinstance(cur, int) or cur > (d.level or 0):
        return None
    return cur * 2, "Batching still pays and the sequence cap was reached: let more requests share a batch."


def _seqs_down(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cur = _current(backend, knobs, "max_num_seqs")
    if not isinstance(cur, int) or cur <= 1:
        return None
    bound = min(cur, int(d.level or cur))
    return max(bound // 2, 1), "Admit fewer requests at once so the running ones keep their KV cache (no preemption)."


def _budget_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cur = _current(backend, knobs, "max_num_batched_tokens")
    if not isinstance(cur, int):
        return None
    return cur * 2, "A larger prefill budget per step admits queued requests sooner."


def _kv_fp8(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    spec = backend.knobs.get("kv_cache_dtype")
    if spec is None or not spec.choices or not d.signals.kv_pressure:
        return None  # a KV pool with room to spare gains nothing from holding twice the tokens
    for choice in ("fp8", "fp8_e4m3", "q8_0"):
        if choice in spec.choices:
            return choice, "An 8-bit KV cache holds about twice the tokens and halves the KV bytes read per step."
    return None


def _share_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cur = _current(backend, knobs, "gpu_memory_utilization")
    if isinstance(cur, int | float) and not isinstance(cur, bool):
        target = round(min(float(cur) + 0.05, 0.95), 2)
        return (target, "More memory for the KV cache.") if target > cur else None
    return None


def _space_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cur = _current(backend, knobs, "kv_cache_space_gib")
    if isinstance(cur, int | float) and not isinstance(cur, bool) and cur > 0:
        return type(cur)(cur * 2), "Twice the CPU KV-cache space."
    return None


def _context_down(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cur = _current(backend, knobs, "max_model_len")
    if not isinstance(cur, int) or cur <= 1024:
        return None
    return cur // 2, "A shorter context limit lets more sequences' KV caches fit (check the workload still fits)."


def _tp_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cur = _current(backend, knobs, "tensor_parallel_size")
    return ((cur * 2), "Shard the model over twice the GPUs.") if isinstance(cur, int) else None


def _threads_all(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> tuple[KnobValue, str] | None:
    cores = os.cpu_count() or 1
    cur = _current(backend, knobs, "threads")
    # A negative count is the engine's own "all cores" (llama.cpp's -1); unset, vLLM-CPU binds all but one.
    if isinstance(cur, int) and (cur < 0 or cur >= cores):
        return None
    return cores, f"Bind all {cores} cores to compute."


# Tried first for every bound: the cheapest knob, when the series show it binding.
_FIRST: tuple[str, str, Proposal] = ("caps", "max_num_seqs", _cap_binds)

# bound -> (stage, knob, proposal) in cost order.
_PLAYBOOK: dict[Bound, tuple[tuple[str, str, Proposal], ...]] = {
    "memory": (
        ("caps", "max_num_seqs", _seqs_down),
        ("quantization", "kv_cache_dtype", _kv_fp8),
        ("kv_share", "gpu_memory_utilization", _share_up),
        ("kv_share", "kv_cache_space_gib", _space_up),
        ("context", "max_model_len", _context_down),
        ("parallelism", "tensor_parallel_size", _tp_up),
    ),
    "batching": (
        ("caps", "max_num_seqs", _seqs_up),
        ("caps", "max_num_batched_tokens", _budget_up),
    ),
    "scheduling": (
        ("caps", "max_num_batched_tokens", _budget_up),
        ("caps", "max_num_seqs", _seqs_up),
    ),
    "compute": (
        ("quantization", "kv_cache_dtype", _kv_fp8),
        ("parallelism", "tensor_parallel_size", _tp_up),
        ("parallelism", "threads", _threads_all),
    ),
    "bandwidth": (
        ("caps", "max_num_seqs", _seqs_up_if_capped),
        ("quantization", "kv_cache_dtype", _kv_fp8),
    ),
    # A fixed cost per step: bigger batches amortise it, where the cap holds them back.
    "overhead": (("caps", "max_num_seqs", _seqs_up_if_capped),),
    "unknown": (),
}


def next_step(
    diagnosis: Diagnosis,
    backend: BackendSpec,
    knobs: Mapping[str, KnobValue],
    cpu_flags: Collection[str] | None = None,
) -> Step | None:
    """The cheapest change that addresses the diagnosis and the backend accepts.

    ``cpu_flags``: the measured host's CPU flags. A value whose ``needs_cpu`` they lack (vLLM-CPU's
    fp8 KV cache without AVX-512 or AMX) is passed over, and the step taken instead says why;
    None checks nothing (the server decides).
    """
    passed_over: list[str] = []
    for stage, knob, propose in (_FIRST, *_PLAYBOOK[diagnosis.bound]):
        if knob not in backend.knobs:
            continue
        found = propose(backend, knobs, diagnosis)
        if found is None:
            continue
        value, reason = found
        try:
            value = check_knob(backend, knob, value)
        except BakeoffError:
            continue  # outside the knob's bounds or choices: try the next stage
        current = _current(backend, knobs, knob)
        if value == current:
            continue
        refused = refusal(backend, knob, value, cpu_flags) if cpu_flags is not None else None
        if refused is not None:
            passed_over.append(
                f"`{knob}` {value!r} was the natural step but is not proposed: on {backend.name}, {refused}."
            )
            continue
        return Step(
            diagnosis.server,
            diagnosis.workload,
            backend.name,
            stage,
            knob,
            current,
            value,
            " ".join([*passed_over, reason]),
            diagnosis,
            dict(knobs),
        )
    return None


def measured_cpu_flags(cell: CellResult) -> frozenset[str] | None:
    """The CPU flags of the host that measured ``cell`` (its runs' ``run.json``), else this host's."""
    for info in sorted(cell.dir.glob(f"runs/*/{RUN_INFO}")):
        flags = read_json(info).get("machine", {}).get("cpu_flags")
        if isinstance(flags, list):
            return frozenset(str(f) for f in flags)
    return host_cpu_flags()


def advise(campaign_dir: Path) -> list[Step]:
    """One step per diagnosed server and workload that has a next knob."""

    cells = load_cells(campaign_dir)
    by_key = {(c.label, c.workload): c for c in cells}
    steps = []
    for diagnosis in diagnose_cells(cells, efficiencies(campaign_dir)):
        cell = by_key[(diagnosis.server, diagnosis.workload)]
        backend = load_backend(cell.backend)
        step = next_step(diagnosis, backend, cell.knobs, measured_cpu_flags(cell))
        if step is not None:
            steps.append(step)
    return steps


# How the measured campaign repeated and judged (bakeoff.campaign.specs): the advice campaign
# repeats and decides the same way, so `repeats: auto` keeps its bounds.
REPEAT_KEYS = ("repeats", "min_repeats", "max_repeats", "min_effect")


def write_campaign(campaign_dir: Path, steps: list[Step], out: Path) -> Path:
    """A campaign running each advised server as measured and as proposed, on the workloads concerned."""
    if not steps:
        raise SpecError(f"{campaign_dir}: no advice to test (no measured diagnosis with a knob left to turn)")
    raw: dict[str, Any] = yaml.safe_load((campaign_dir / "campaign.yaml").read_text())
    servers_raw = {str(s.get("label") or s["backend"]): s for s in raw["servers"]}
    servers: list[dict[str, Any]] = []
    for step in steps:
        base = dict(servers_raw[step.server])
        if all(s.get("label", s["backend"]) != step.server for s in servers):
            servers.append({**base, "label": step.server})
        variant = {**base, "label": step.label, "knobs": {**(base.get("knobs") or {}), step.knob: step.proposed}}
        if all(s["label"] != variant["label"] for s in servers):
            servers.append(variant)
    workloads = _advised_workloads(raw, steps)
    keep = ("model", "slo", "gpu", "memory_bandwidth_gbs", "start_attempts", "interleave", *REPEAT_KEYS)
    advice = {
        "name": f"{raw['name']}-advice",
        "description": "Written by `bakeoff advise` from "
        + str(campaign_dir.resolve())
        + ": "
        + " ".join(f"{s.server}: {s.knob} {s.current!r} -> {s.proposed!r} ({s.diagnosis.bound}-bound)." for s in steps),
        **{k: raw[k] for k in keep if k in raw},
        "measure_warm_restart": False,  # the advice is about speed at a load: no restart timing
        "servers": servers,
        "workloads": workloads,
    }
    header = "# The next knob to turn, against the current configuration (bakeoff advise).\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump(advice, sort_keys=False))
    return out


def _advised_workloads(raw: dict[str, Any], steps: list[Step]) -> list[dict[str, Any]]:
    """The workloads the steps concern; a concurrency sweep cut to the levels the diagnoses cite."""
    levels: dict[str, set[int]] = {}
    for step in steps:
        cited = levels.setdefault(step.workload, set())
        if step.diagnosis.level is not None:
            cited.add(int(step.diagnosis.level))
    found = []
    for w in raw["workloads"]:
        name = str(w.get("name") or w.get("kind"))
        if name not in levels:
            continue
        if w.get("kind") == "concurrency" and levels[name] & set(w.get("levels") or []):
            w = {**w, "levels": sorted(levels[name] & set(w["levels"]))}
        found.append(w)
    return found


def _tune_range(backend: BackendSpec, step: Step) -> dict[str, Any]:
    """A search range around the measured and the proposed value of a step's knob."""
    spec = backend.knobs[step.knob]
    values = [v for v in (step.current, step.proposed) if v is not None]
    if spec.type in ("int", "float") and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        low, high = min(float(v) for v in values), max(float(v) for v in values)
        low, high = low / 2, high * 2
        if spec.minimum is not None:
            low = max(low, spec.minimum)
        if spec.maximum is not None:
            high = min(high, spec.maximum)
        if spec.type == "int":
            return {"low": max(int(low), 1), "high": int(high), "log": True}
        return {"low": round(low, 3), "high": round(high, 3)}
    return {"choices": list(dict.fromkeys(values))}


def write_tune_campaign(campaign_dir: Path, steps: list[Step], out: Path) -> Path:
    """The advice handed to ``bakeoff tune``: the advised servers as measured, searching the advised knobs."""
    if not steps:
        raise SpecError(f"{campaign_dir}: no advice to tune from (no measured diagnosis with a knob left to turn)")
    raw: dict[str, Any] = yaml.safe_load((campaign_dir / "campaign.yaml").read_text())
    servers_raw = {str(s.get("label") or s["backend"]): s for s in raw["servers"]}
    servers = [{**servers_raw[name], "label": name} for name in dict.fromkeys(s.server for s in steps)]
    first = steps[0]
    ranges: dict[str, Any] = {}
    for step in steps:
        ranges.setdefault(step.knob, _tune_range(load_backend(step.backend), step))
    tune: dict[str, Any] = {"workload": first.workload, "only": list(ranges), "knobs": ranges}
    if first.diagnosis.level is not None:
        tune["load"] = first.diagnosis.level
    keep = ("model", "slo", "gpu", "memory_bandwidth_gbs", "start_attempts", "quality")
    advice = {
        "name": f"{raw['name']}-advice",
        "description": "Written by `bakeoff advise --tune` from " + str(campaign_dir.resolve()),
        **{k: raw[k] for k in keep if k in raw},
        "measure_warm_restart": False,
        "servers": servers,
        "workloads": [w for w in raw["workloads"] if str(w.get("name") or w.get("kind")) == first.workload],
        "tune": tune,
    }
    header = "# The advised knobs, to search from here: bakeoff tune this-file (written by bakeoff advise --tune).\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump(advice, sort_keys=False))
    return out
