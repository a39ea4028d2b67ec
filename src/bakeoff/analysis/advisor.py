"""The tuning advisor: from the diagnosis, the next knob to turn, and the campaign that tests it.

For each measured server and workload, :func:`advise` walks the knobs in cost order —
cheapest to try first, the seed's order:

1. batching caps and chunked prefill (``max_num_seqs``, ``max_num_batched_tokens``,
   ``chunked_prefill``): a restart, nothing else changes;
2. quantization: weights (``quantization``: FP8 on GPU, llama.cpp's q8_0, vLLM-CPU's int4
   checkpoints, all made by bakeoff or the engine, no calibration set) and the KV cache
   (``kv_cache_dtype``);
3. the KV-cache share (``gpu_memory_utilization``, ``kv_cache_space_gib``);
4. context limits (``max_model_len``);
5. parallelism (``tensor_parallel_size`` on GPU, ``threads`` on CPU);

and, for latency where the sweep measured a light load, speculative decoding (n-gram: no draft
model needed). Each bound has its own walk (:data:`_PLAYBOOK`): memory-bound servers get fewer
sequences, an 8-bit KV cache, more KV space, a shorter context, more GPUs; batching- and
scheduling-bound ones a higher cap, a larger token budget, chunked prefill; compute-bound ones
smaller weights, then more GPUs or cores; bandwidth-bound ones a cap that binds, smaller
weights, more GPUs, speculation; overhead-bound ones a cap that binds, idle cores, speculation.
The first change that the backend has, that its spec accepts
(:func:`bakeoff.backends.knobs.check_knob`) and that differs from the value measured is the step;
where none is left, :class:`Spent` says why, stage by stage. Each advice must follow from the
series it cites (:class:`bakeoff.analysis.diagnosis.Signals`):

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
from bakeoff.analysis.soak_advice import SoakCell, memory_cap, soak_cells
from bakeoff.backends.knobs import check_knob
from bakeoff.backends.spec import BackendSpec, KnobValue, load_backend
from bakeoff.backends.tune_space import COST_ORDER as COST_ORDER  # the one cost order, shared with tune
from bakeoff.errors import BakeoffError, SpecError
from bakeoff.host.cpu_checks import host_cpu_flags, refusal
from bakeoff.results.campaign_copy import CampaignCopy
from bakeoff.results.layout import CellResult, load_cells, read_campaign_copy
from bakeoff.results.store import RUN_INFO, read_json


@dataclass
class Step:
    """One proposed change: which knob of which server, from what to what, and why."""

    server: str
    workload: str
    backend: str
    stage: str  # one of COST_ORDER, or "speculation" (for latency at light load, after them)
    knob: str
    current: KnobValue | None
    proposed: KnobValue
    reason: str
    diagnosis: Diagnosis
    knobs: dict[str, KnobValue] = field(default_factory=dict)  # the server's knobs as measured
    level: float | None = None  # the load level the change is for (the diagnosis's, or the lightest)

    @property
    def label(self) -> str:
        text = str(self.proposed).replace(" ", "").replace("/", "-")
        return f"{self.server}-{self.knob}-{text}"[:80]

    def markdown(self) -> str:
        evidence = "; ".join(self.diagnosis.evidence) or "see the sweep"
        return (
            f"**{self.server} / {self.workload}** ({self.diagnosis.bound}-bound): set `{self.knob}` "
            f"{self.current!r} → {self.proposed!r} ({self.stage.replace('_', ' ')}"
            + (f", at concurrency {self.level:g}" if self.level is not None else "")
            + f"). {self.reason} "
            f"Evidence: {evidence}."
        )


def _current(backend: BackendSpec, knobs: Mapping[str, KnobValue], name: str) -> KnobValue | None:
    if name in knobs:
        return knobs[name]
    spec = backend.knobs.get(name)
    return spec.default if spec is not None else None


# A proposal's answer: candidate (value, reason) pairs, most wanted first, or why this knob is not the step.
Found = list[tuple[KnobValue, str]] | str
Proposal = Callable[[BackendSpec, Mapping[str, KnobValue], Diagnosis], Found]

LOW_CONCURRENCY = 2  # a sweep whose lightest level is at or under this has a latency case for speculation


def _level(d: Diagnosis) -> str:
    return f"{d.level:g}" if d.level is not None else "the busiest level"


def _seqs_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cur = _current(backend, knobs, "max_num_seqs")
    if not isinstance(cur, int):
        return "no integer sequence cap to raise"
    target = max(cur * 2, int(d.level or 0))
    return [(target, "Let more requests share a batch: the engine had room while requests queued.")]


def _cap_binds(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    """Requests waited while running sat at the cap, below the offered load, and not for want of KV."""
    cur = _current(backend, knobs, "max_num_seqs")
    seen = d.signals
    if not isinstance(cur, int) or d.level is None or cur >= d.level or seen.kv_pressure or not seen.queued():
        return "the sequence cap did not hold requests back"
    if seen.running_max is None or seen.running_max < cur:
        return "the sequence cap was never reached"
    return [
        (
            max(cur * 2, int(d.level)),
            f"Requests waited ({seen.waiting_mean:.1f} on average) while running sat at the cap of {cur} "
            f"with {d.level:g} offered: let more requests share a batch.",
        )
    ]


def _seqs_up_if_capped(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    # Batching still pays; a cap above the busiest level tested changes nothing there.
    cur = _current(backend, knobs, "max_num_seqs")
    if not isinstance(cur, int):
        return "no integer sequence cap to raise"
    if cur > (d.level or 0):
        return f"`max_num_seqs` {cur} is above the busiest level tested ({_level(d)}): the cap held no batch back"
    return [(cur * 2, "Batching still pays and the sequence cap was reached: let more requests share a batch.")]


def _seqs_down(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cur = _current(backend, knobs, "max_num_seqs")
    if not isinstance(cur, int) or cur <= 1:
        return "one sequence at a time already"
    bound = min(cur, int(d.level or cur))
    why = "Admit fewer requests at once so the running ones keep their KV cache (no preemption)."
    return [(max(bound // 2, 1), why)]


def _budget_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cur = _current(backend, knobs, "max_num_batched_tokens")
    if not isinstance(cur, int):
        return "no integer token budget to raise"
    return [(cur * 2, "A larger prefill budget per step admits queued requests sooner.")]


def _chunked_on(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    if _current(backend, knobs, "chunked_prefill") is True:
        return "chunked prefill is on already"
    return [(True, "Chunked prefill interleaves long prefills with running decodes, so a queue drains steadily.")]


def _kv_fp8(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    spec = backend.knobs.get("kv_cache_dtype")
    if spec is None or not spec.choices:
        return "no KV-cache type to choose"
    if not d.signals.kv_pressure:
        # A KV pool with room to spare gains nothing from holding twice the tokens.
        return "the KV pool was neither near full nor preempting (or exports no gauge): an 8-bit KV cache buys nothing"
    why = "An 8-bit KV cache holds about twice the tokens and halves the KV bytes read per step."
    found: list[tuple[KnobValue, str]] = [(c, why) for c in ("fp8", "fp8_e4m3", "q8_0") if c in spec.choices]
    return found or "no 8-bit KV-cache type"


# Weight types that need no calibration data, most wanted first: FP8 (GPU, quantized at load), llama.cpp's
# int8 blocks, vLLM-CPU's int4 GPTQ checkpoints (made by bakeoff; w4a16 only where AVX-512 runs it).
_WEIGHT_TYPES = ("fp8", "q8_0", "w4a16", "w4a8")


def _weights_smaller(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    spec = backend.knobs.get("quantization")
    if spec is None or not spec.choices:
        return "no weight quantization to choose"
    cur = _current(backend, knobs, "quantization")
    if cur not in (None, "none"):
        return f"the weights are quantized already ({cur})"
    if d.bound == "compute":
        why = "8-bit or smaller weights: fewer bytes and cheaper integer dot products per step on a saturated engine"
    else:
        why = "Smaller weights: every decode step reads all of them, so a bandwidth-bound step shrinks with them"
    why += " (answers may change: check quality)."
    found: list[tuple[KnobValue, str]] = [(c, why) for c in _WEIGHT_TYPES if c in spec.choices]
    return found or "no weight type that needs no calibration"


def _share_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cur = _current(backend, knobs, "gpu_memory_utilization")
    if isinstance(cur, int | float) and not isinstance(cur, bool):
        target = round(min(float(cur) + 0.05, 0.95), 2)
        return [(target, "More memory for the KV cache.")] if target > cur else f"the KV share is {cur} already"
    return "no KV-cache share set to raise"


def _space_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cur = _current(backend, knobs, "kv_cache_space_gib")
    if isinstance(cur, int | float) and not isinstance(cur, bool) and cur > 0:
        return [(type(cur)(cur * 2), "Twice the CPU KV-cache space.")]
    return "no KV-cache space set to raise"


def _context_down(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cur = _current(backend, knobs, "max_model_len")
    if not isinstance(cur, int) or cur <= 1024:
        return "the context limit is 1024 or unset"
    return [(cur // 2, "A shorter context limit lets more sequences' KV caches fit (check the workload still fits).")]


def _tp_up(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cur = _current(backend, knobs, "tensor_parallel_size")
    if not isinstance(cur, int):
        return "no tensor parallelism"
    return [(cur * 2, "Shard the model over twice the GPUs.")]


def _threads_all(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    cores = d.cpus or os.cpu_count() or 1
    cur = _current(backend, knobs, "threads")
    # A negative count is the engine's own "all cores" (llama.cpp's -1); unset, vLLM-CPU binds all but one.
    if isinstance(cur, int) and (cur < 0 or cur >= cores):
        return f"`threads` already computes on all {cores} cores"
    return [(cores, f"Bind all {cores} cores to compute.")]


def _speculate(backend: BackendSpec, knobs: Mapping[str, KnobValue], d: Diagnosis) -> Found:
    """N-gram speculation for latency where load is light: spare compute per step verifies several tokens."""
    spec = backend.knobs.get("speculative")
    if spec is None or "ngram" not in (spec.choices or ()):
        return "no n-gram speculative decoding"
    if _current(backend, knobs, "speculative") not in (None, "none"):
        return "speculative decoding is on already"
    if d.lowest is None or d.lowest > LOW_CONCURRENCY:
        return f"speculation is for latency at low concurrency, and no level at or under {LOW_CONCURRENCY} was measured"
    if d.bound == "overhead":
        pace = "amortises the per-step overhead over several tokens"
    else:
        pace = "reads the weights once for several tokens"
    return [
        (
            "ngram",
            f"For latency at concurrency {d.lowest:g}: n-gram speculation proposes tokens from the request's own "
            f"text and one step verifies them, which {pace} where drafts are accepted (the campaign measures "
            "how many are).",
        )
    ]


# Tried first for every bound: the cheapest knob, when the series show it binding.
_FIRST: tuple[str, str, Proposal] = ("caps", "max_num_seqs", _cap_binds)

# bound -> (stage, knob, proposal) in cost order; speculation last, for latency at light load.
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
        ("caps", "chunked_prefill", _chunked_on),
    ),
    "scheduling": (
        ("caps", "max_num_batched_tokens", _budget_up),
        ("caps", "chunked_prefill", _chunked_on),
        ("caps", "max_num_seqs", _seqs_up),
    ),
    "compute": (
        ("quantization", "quantization", _weights_smaller),
        ("quantization", "kv_cache_dtype", _kv_fp8),
        ("parallelism", "tensor_parallel_size", _tp_up),
        ("parallelism", "threads", _threads_all),
    ),
    "bandwidth": (
        ("caps", "max_num_seqs", _seqs_up_if_capped),
        ("quantization", "quantization", _weights_smaller),
        ("quantization", "kv_cache_dtype", _kv_fp8),
        ("parallelism", "tensor_parallel_size", _tp_up),
        ("speculation", "speculative", _speculate),
    ),
    # A fixed cost per step: bigger batches amortise it where the cap holds them back, idle cores can
    # share it, and speculation spreads it over several tokens. Smaller weights shorten no fixed cost.
    "overhead": (
        ("caps", "max_num_seqs", _seqs_up_if_capped),
        ("parallelism", "threads", _threads_all),
        ("speculation", "speculative", _speculate),
    ),
    "unknown": (),
}


@dataclass
class Spent:
    """A diagnosis with no knob left to turn on its server, and why, stage by stage."""

    diagnosis: Diagnosis
    why: list[str]

    def markdown(self) -> str:
        d = self.diagnosis
        if d.bound == "unknown":
            return f"**{d.server} / {d.workload}**: no bound diagnosed, so no knob follows — {d.headline}"
        return (
            f"**{d.server} / {d.workload}** ({d.bound}-bound): nothing left to turn on this server — "
            + "; ".join(self.why)
            + "."
        )


def plan(
    diagnosis: Diagnosis,
    backend: BackendSpec,
    knobs: Mapping[str, KnobValue],
    cpu_flags: Collection[str] | None = None,
) -> Step | Spent:
    """The cheapest change that addresses the diagnosis and the backend accepts, or why there is none.

    ``cpu_flags``: the measured host's CPU flags. A value whose ``needs_cpu`` they lack (vLLM-CPU's
    fp8 KV cache without AVX-512 or AMX) is passed over, and the step taken instead says why;
    None checks nothing (the server decides).
    """
    passed_over: list[str] = []
    why: list[str] = []
    for stage, knob, propose in (_FIRST, *_PLAYBOOK[diagnosis.bound]):
        first = propose is _cap_binds
        if knob not in backend.knobs:
            if not first:
                why.append(f"{backend.name} has no `{knob}`")
            continue
        found = propose(backend, knobs, diagnosis)
        if isinstance(found, str):
            if not first:
                why.append(found)
            continue
        current = _current(backend, knobs, knob)
        for value, reason in found:
            try:
                value = check_knob(backend, knob, value)
            except BakeoffError as exc:
                why.append(f"`{knob}` {value!r} is outside what {backend.name} takes ({exc})")
                continue
            if value == current:
                why.append(f"`{knob}` is {current!r} already")
                continue
            refused = refusal(backend, knob, value, cpu_flags) if cpu_flags is not None else None
            if refused is not None:
                note = f"`{knob}` {value!r} was the natural step but is not proposed: on {backend.name}, {refused}."
                passed_over.append(note)
                why.append(note.rstrip("."))
                continue
            level = diagnosis.lowest if stage == "speculation" else diagnosis.level
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
                level,
            )
    return Spent(diagnosis, why or [diagnosis.headline])


def next_step(
    diagnosis: Diagnosis,
    backend: BackendSpec,
    knobs: Mapping[str, KnobValue],
    cpu_flags: Collection[str] | None = None,
) -> Step | None:
    """:func:`plan`'s step, or None where nothing is left to turn."""
    found = plan(diagnosis, backend, knobs, cpu_flags)
    return found if isinstance(found, Step) else None


def measured_cpu_flags(cell: CellResult) -> frozenset[str] | None:
    """The CPU flags of the host that measured ``cell`` (its runs' ``run.json``), else this host's."""
    for info in sorted(cell.dir.glob(f"runs/*/{RUN_INFO}")):
        flags = read_json(info).get("machine", {}).get("cpu_flags")
        if isinstance(flags, list):
            return frozenset(str(f) for f in flags)
    return host_cpu_flags()


@dataclass
class Advice:
    """What ``bakeoff advise`` found: a step per server that has one, why not for the rest."""

    steps: list[Step]
    spent: list[Spent]
    undiagnosed: str | None = None  # why nothing was diagnosed at all (None when something was)

    def markdown(self) -> list[str]:
        """One line per server and workload: its step, or why there is none."""
        lines = [s.markdown() for s in self.steps] + [s.markdown() for s in self.spent]
        return lines or [f"No advice: {self.undiagnosed}"]


def _why_undiagnosed(cells: list[CellResult]) -> str:
    """Why no cell has a diagnosis: the specific gap."""
    if not cells:
        return "no cell of this campaign was measured."
    if all(any(s.rehearsal for s in c.summaries.values()) for c in cells if c.summaries):
        return "a rehearsal's stand-in servers say nothing about the frameworks' bounds; run it on the real host."
    return "no closed-loop concurrency sweep was measured (the diagnosis reads how a server responds to load)."


def advise(campaign_dir: Path) -> Advice:
    """One step per diagnosed server and workload that has a next knob; why not for the others."""

    cells = load_cells(campaign_dir)
    by_key = {(c.label, c.workload): c for c in cells}
    steps: list[Step] = []
    spent: list[Spent] = []
    for diagnosis in diagnose_cells(cells, efficiencies(campaign_dir)):
        cell = by_key[(diagnosis.server, diagnosis.workload)]
        found = plan(diagnosis, load_backend(cell.backend), cell.knobs, measured_cpu_flags(cell))
        if isinstance(found, Step):
            steps.append(found)
        else:
            spent.append(found)
    for soaked in soak_cells(cells):
        cap = soak_plan(soaked, load_backend(soaked.cell.backend))
        if isinstance(cap, Step):
            steps.append(cap)
        elif cap is not None:
            spent.append(cap)
    return Advice(steps, spent, None if steps or spent else _why_undiagnosed(cells))


def soak_plan(soaked: SoakCell, backend: BackendSpec) -> Step | Spent | None:
    """A soak's ``context`` step: ``max_model_len`` at the workload's need + 20% when its memory drifted.

    None where the backend has no ``max_model_len``; :class:`Spent` (why not) where the memory did not drift.
    """
    cell, knob = soaked.cell, "max_model_len"
    if knob not in backend.knobs:
        return None
    current = _current(backend, cell.knobs, knob)
    found = memory_cap(soaked.result, soaked.workload.longest_request(), current)
    if isinstance(found, str):  # no bound follows from a soak whose memory held
        return Spent(Diagnosis(cell.label, cell.workload, "unknown", found), [found])
    headline = "the memory the weights and KV pool do not account for grew over the soak"
    diagnosis = Diagnosis(cell.label, cell.workload, "memory", headline, found.evidence)
    proposed = check_knob(backend, knob, found.proposed)
    return Step(cell.label, cell.workload, backend.name, "context", knob, current, proposed, found.reason,
                diagnosis, cell.knobs)  # fmt: skip


# How the measured campaign repeated and judged (bakeoff.campaign.specs): the advice campaign
# repeats and decides the same way, so `repeats: auto` keeps its bounds.
REPEAT_KEYS = ("repeats", "min_repeats", "max_repeats", "min_effect")


def write_campaign(campaign_dir: Path, steps: list[Step], out: Path) -> Path:
    """A campaign running each advised server as measured and as proposed, on the workloads concerned."""
    if not steps:
        raise SpecError(f"{campaign_dir}: no advice to test (no measured diagnosis with a knob left to turn)")
    campaign = read_campaign_copy(campaign_dir)
    servers_raw = {s.name: s.written() for s in campaign.servers}
    servers: list[dict[str, Any]] = []
    for step in steps:
        base = dict(servers_raw[step.server])
        if all(s.get("label", s["backend"]) != step.server for s in servers):
            servers.append({**base, "label": step.server})
        variant = {**base, "label": step.label, "knobs": {**(base.get("knobs") or {}), step.knob: step.proposed}}
        if all(s["label"] != variant["label"] for s in servers):
            servers.append(variant)
    workloads = _advised_workloads(campaign, steps)
    keep = ("model", "slo", "gpu", "memory_bandwidth_gbs", "start_attempts", "interleave", *REPEAT_KEYS)
    advice = {
        "name": f"{campaign.name}-advice",
        "description": "Written by `bakeoff advise` from "
        + str(campaign_dir.resolve())
        + ": "
        + " ".join(f"{s.server}: {s.knob} {s.current!r} -> {s.proposed!r} ({s.diagnosis.bound}-bound)." for s in steps),
        **campaign.sections(keep),
        "measure_warm_restart": False,  # the advice is about speed at a load: no restart timing
        "servers": servers,
        "workloads": workloads,
    }
    header = "# The next knob to turn, against the current configuration (bakeoff advise).\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump(advice, sort_keys=False))
    return out


def _advised_workloads(campaign: CampaignCopy, steps: list[Step]) -> list[dict[str, Any]]:
    """The workloads the steps concern; a concurrency sweep cut to the levels the diagnoses cite."""
    levels: dict[str, set[int]] = {}
    for step in steps:
        cited = levels.setdefault(step.workload, set())
        if step.level is not None:
            cited.add(int(step.level))
    found = []
    for w in campaign.workloads:
        name = campaign.workload_name(w)
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


def _takes(backend: BackendSpec, knob: str, value: KnobValue) -> bool:
    try:
        check_knob(backend, knob, value)
    except BakeoffError:
        return False
    return True


def write_tune_campaign(campaign_dir: Path, steps: list[Step], out: Path) -> Path:
    """The advice handed to ``bakeoff tune``: the advised servers as measured, searching the advised knobs."""
    if not steps:
        raise SpecError(f"{campaign_dir}: no advice to tune from (no measured diagnosis with a knob left to turn)")
    campaign = read_campaign_copy(campaign_dir)
    servers_raw = {s.name: s.written() for s in campaign.servers}
    first = steps[0]
    # One workload and one search space for every server searched: a step whose value another
    # advised backend cannot take (llama.cpp's q8_0 is no vLLM-CPU quantization) stays in advice.yaml.
    steps = [s for s in steps if s.workload == first.workload]
    backends = {name: load_backend(name) for name in {s.backend for s in steps}}
    steps = [s for s in steps if all(_takes(b, s.knob, s.proposed) for b in backends.values())] or [first]
    servers = [{**servers_raw[name], "label": name} for name in dict.fromkeys(s.server for s in steps)]
    ranges: dict[str, Any] = {}
    for step in steps:
        ranges.setdefault(step.knob, _tune_range(load_backend(step.backend), step))
    tune: dict[str, Any] = {"workload": first.workload, "only": list(ranges), "knobs": ranges}
    if first.level is not None:
        tune["load"] = first.level
    keep = ("model", "slo", "gpu", "memory_bandwidth_gbs", "start_attempts", "quality")
    advice = {
        "name": f"{campaign.name}-advice",
        "description": "Written by `bakeoff advise --tune` from " + str(campaign_dir.resolve()),
        **campaign.sections(keep),
        "measure_warm_restart": False,
        "servers": servers,
        "workloads": [w for w in campaign.workloads if campaign.workload_name(w) == first.workload],
        "tune": tune,
    }
    header = "# The advised knobs, to search from here: bakeoff tune this-file (written by bakeoff advise --tune).\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump(advice, sort_keys=False))
    return out
