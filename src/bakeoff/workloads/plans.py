"""Request plans: the exact requests of one run, identical for every backend, and how they are built.

A :class:`RunPlan` is one measured run (a concurrency level, a rate, a set of conversations,
a trace window) holding its :class:`PlannedRequest` list; :class:`PlanBuilder` makes the
requests of any workload kind from its token-exact prompts. The kinds themselves
(:mod:`bakeoff.workloads.kinds`) decide which plans a workload has; :mod:`bakeoff.workloads.plan_store`
writes and reads them.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import orjson

from bakeoff.errors import SpecError
from bakeoff.workloads.agentic import TaskPlan, designed_rows
from bakeoff.workloads.lengths import LengthDist, sample_length
from bakeoff.workloads.prompts import PromptFactory
from bakeoff.workloads.traces.rows import reused_tokens

if TYPE_CHECKING:  # the kinds make plans with this module's builder: a runtime import would be a cycle
    from bakeoff.workloads.kinds import Workload


class RequestShape(Protocol):
    """What a request takes from its workload, whatever the kind."""

    @property
    def endpoint(self) -> str: ...
    @property
    def temperature(self) -> float: ...


class Plannable(Protocol):
    """A workload kind: it makes its own plans with a builder."""

    def plans(self, builder: PlanBuilder) -> list[RunPlan]: ...


class SampledShape(RequestShape, Protocol):
    """A workload whose requests draw their lengths (concurrency sweeps, open loop)."""

    @property
    def input_len(self) -> LengthDist: ...
    @property
    def output_len(self) -> LengthDist: ...


@dataclass(frozen=True)
class PlannedRequest:
    """A request exactly as it will be sent, identical for every backend."""

    request_id: int
    endpoint: str
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    prompt_tokens: int = 0
    group: str = ""
    turn: int = -1
    arrival_s: float = 0.0  # offset from the run start, for open-loop schedules
    temperature: float = 0.0


Mode = Literal["closed", "open", "sessions", "tasks"]


@dataclass
class SessionPlan:
    """One conversation: a shared system prompt, fixed user turns, real replies appended."""

    session_id: int
    system_prompt: str
    user_turns: list[str]
    user_tokens: int
    output_len: int
    think_time_s: float


@dataclass
class RunPlan:
    """One measured run: a concurrency level, a request rate or a set of conversations."""

    name: str
    mode: Mode
    workload: Workload  # the workload as the campaign gave it, typed; stored as its JSON dump
    concurrency: int | None = None
    rate: float | None = None
    duration_s: float | None = None
    # Closed loop: the steady-state window must hold min_requests and last min_duration_s;
    # the first N starts are spread over ramp_s (None: one warm-up request's E2E).
    min_requests: int = 0
    min_duration_s: float = 0.0
    ramp_s: float | None = None
    warmup: list[PlannedRequest] = field(default_factory=list)
    requests: list[PlannedRequest] = field(default_factory=list)
    sessions: list[SessionPlan] = field(default_factory=list)
    system_prompt_tokens: int = 0
    # Trace replays: each request's prefix block ids (aligned with requests), and the trace's facts.
    block_size: int = 0
    request_blocks: list[list[int]] = field(default_factory=list)
    trace: dict[str, Any] = field(default_factory=dict)
    # Agent task trees (mode "tasks"): closed loop keeps ``concurrency`` tasks in flight,
    # open loop starts each at its ``arrival_s`` (:mod:`bakeoff.workloads.agentic`).
    tasks: list[TaskPlan] = field(default_factory=list)

    @property
    def designs_reuse(self) -> bool:
        """Whether the plan shares prefixes by construction (conversations, task trees, a trace's blocks)."""
        return self.mode in ("sessions", "tasks") or bool(self.trace)

    def to_json(self) -> bytes:
        data = asdict(self)
        data["workload"] = self.workload.model_dump(mode="json")  # the bytes plans were always stored as
        return orjson.dumps(data, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> RunPlan:
        raw = orjson.loads(data)
        raw["warmup"] = [PlannedRequest(**r) for r in raw["warmup"]]
        raw["requests"] = [PlannedRequest(**r) for r in raw["requests"]]
        raw["sessions"] = [SessionPlan(**s) for s in raw["sessions"]]
        from bakeoff.workloads.kinds import WORKLOAD  # deferred: kinds imports this module

        raw["workload"] = WORKLOAD.validate_python(raw["workload"])
        raw["tasks"] = [TaskPlan.from_json(t) for t in raw.get("tasks", [])]
        return cls(**raw)


def arrival_times(n: int, rate: float, kind: str, burstiness: float, seed: int) -> list[float]:
    """Arrival offsets (s) for ``n`` requests at ``rate`` per second.

    Gamma inter-arrivals with shape = burstiness keep the mean rate and give a coefficient
    of variation of 1/sqrt(burstiness): 1 is Poisson, below 1 burstier, above 1 smoother.
    """
    if rate <= 0:
        raise SpecError(f"rate must be > 0 requests/s, got {rate}")
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    else:
        shape = 1.0 if kind == "poisson" else burstiness
        gen = np.random.default_rng(seed)
        gaps = gen.gamma(shape, 1.0 / (rate * shape), size=n)
    gaps[0] = 0.0  # the first request goes at once, so runs do not start with dead time
    return [float(x) for x in np.cumsum(gaps)]


class PlanBuilder:
    """Builds every run plan of one workload; one builder per campaign keeps prompts apart."""

    def __init__(self, prompts: PromptFactory, context_limit: int | None = None) -> None:
        self.prompts = prompts
        # The smallest context among the campaign's servers: a clipped trace fits every one.
        self.context_limit = context_limit

    def request(
        self, rng: random.Random, rid: int, wl: RequestShape, in_len: int, out_len: int, group: str = ""
    ) -> PlannedRequest:
        return self.with_text(rid, wl, self.prompts.text(in_len, rng), in_len, out_len, group)

    @staticmethod
    def with_text(
        rid: int, wl: RequestShape, text: str, in_len: int, out_len: int, group: str = "", arrival_s: float = 0.0
    ) -> PlannedRequest:
        if wl.endpoint == "chat":
            return PlannedRequest(
                rid,
                "chat",
                out_len,
                messages=[{"role": "user", "content": text}],
                prompt_tokens=in_len,
                group=group,
                arrival_s=arrival_s,
                temperature=wl.temperature,
            )
        return PlannedRequest(
            rid,
            "completions",
            out_len,
            prompt=text,
            prompt_tokens=in_len,
            group=group,
            arrival_s=arrival_s,
            temperature=wl.temperature,
        )

    def sampled(self, rng: random.Random, wl: SampledShape, n: int, first_id: int) -> list[PlannedRequest]:
        return [
            self.request(rng, first_id + i, wl, sample_length(wl.input_len, rng), sample_length(wl.output_len, rng))
            for i in range(n)
        ]

    def build(self, wl: Plannable) -> list[RunPlan]:
        """The workload's run plans: each kind makes its own (:mod:`bakeoff.workloads.kinds`)."""
        return wl.plans(self)


def at_arrival(req: PlannedRequest, arrival_s: float) -> PlannedRequest:
    """The same request, sent ``arrival_s`` after the run starts."""
    values = asdict(req)
    values["arrival_s"] = arrival_s
    return PlannedRequest(**values)


def retime(requests: list[PlannedRequest], times: list[float]) -> list[PlannedRequest]:
    """The same requests on a new arrival schedule (SLO search keeps requests identical)."""
    return [at_arrival(r, t) for r, t in zip(requests, times, strict=True)]


def _reuse_by_request(plan: RunPlan) -> list[tuple[int, int]] | None:
    """(prompt tokens, tokens repeating an earlier prefix) per request, by construction of the plan.

    Turn 1 of the first conversation reuses nothing; turn 1 of the others reuses the shared
    system prompt; turn t > 1 reuses the whole previous prompt plus its reply. A trace
    replay reuses what its block ids share with earlier requests (:mod:`bakeoff.workloads.traces.rows`).
    None for a plan that designs no reuse.
    """
    if plan.trace:
        sent = [(r.prompt_tokens, blocks) for r, blocks in zip(plan.requests, plan.request_blocks, strict=True)]
        if plan.block_size <= 0:
            return [(prompt, 0) for prompt, _ in sent]
        return list(zip((p for p, _ in sent), reused_tokens(sent, plan.block_size), strict=True))
    if plan.mode == "tasks":
        return designed_rows(plan.tasks) if plan.tasks else None
    if plan.mode != "sessions" or not plan.sessions:
        return None
    rows = []
    for index, session in enumerate(plan.sessions):
        prompt = plan.system_prompt_tokens
        for turn in range(len(session.user_turns)):
            previous = prompt
            prompt = (
                previous + session.user_tokens if turn == 0 else previous + session.output_len + session.user_tokens
            )
            if turn == 0:
                rows.append((prompt, plan.system_prompt_tokens if index > 0 else 0))
            else:
                rows.append((prompt, previous + session.output_len))
    return rows


def designed_reuse(plan: RunPlan) -> float | None:
    """Share of prompt tokens that repeat an earlier prefix, by construction of the plan."""
    return reusable_share(plan, 1)


def reusable_share(plan: RunPlan, granularity: int) -> float | None:
    """The designed reuse a cache of ``granularity``-token blocks can realise: each request's
    repeated prefix rounded down to whole blocks (1: any shared run of tokens, as a radix
    tree or llama.cpp's per-token prefix match). A plan sharing 32 tokens per request can
    realise nothing on vLLM-CPU's 128-token blocks."""
    rows = _reuse_by_request(plan)
    if rows is None:
        return None
    total = sum(prompt for prompt, _ in rows)
    if not total:
        return None
    return sum(reused // granularity * granularity for _, reused in rows) / total
