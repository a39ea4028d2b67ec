"""The workload kinds a campaign can run: each one whole, in one class.

A kind is one pydantic model: a closed-loop concurrency sweep, open-loop rates,
multi-turn conversations over a shared prefix, agent task trees that branch and join
(:mod:`bakeoff.workloads.agentic`), long prompts mixed into interactive traffic, a
production trace replay, and a soak (one fixed mixed load held for a duration, judged
window by window for drift). Each owns what differs between kinds:

- its fields, as the user writes them (unknown keys fail loudly, naming the field);
- ``plans(builder)``: its request plans and their mode (closed, open, sessions), made
  with the prompt helpers of :class:`bakeoff.workloads.plan_store.PlanBuilder`;
- ``cost()``: requests, sequential decode steps and scheduled seconds, for estimates;
- ``longest_request()``: prompt + output tokens, checked against each server's context;
- ``for_rehearsal()``: the same shape, scaled down for a rehearsal.

Adding a kind is a class here and its name in :data:`Workload`; what kinds share is
:mod:`bakeoff.workloads.base`, the campaign around the workloads :mod:`bakeoff.campaign.specs`.
Planning helpers are imported where they are used: :mod:`bakeoff.workloads.plan_store`
and the trace modules read these models, so importing them at the top would be circular.
"""

from __future__ import annotations

import math
import random
from typing import Annotated, Literal, Self

from pydantic import Field, TypeAdapter, field_validator, model_validator

from bakeoff.workloads.agentic import TaskPlan, build_task, planned_prompt_tokens, tree_facts
from bakeoff.workloads.base import Endpoint, SampledLengths, WorkloadBase, WorkloadCost
from bakeoff.workloads.delays import Delay, as_delay
from bakeoff.workloads.lengths import REHEARSAL_MAX_OUTPUT, LengthDist, _as_length, rehearsal_length
from bakeoff.workloads.plans import PlanBuilder, PlannedRequest, RunPlan, SessionPlan, arrival_times, at_arrival, retime
from bakeoff.workloads.traces.loading import load_trace
from bakeoff.workloads.traces.plan import plan_trace
from bakeoff.workloads.traces.spec import TraceSpec


class ConcurrencySweep(SampledLengths):
    """Closed loop: each level keeps exactly N requests in flight, measured in its steady state.

    The first N starts are spread over ``ramp_s`` (no lock-step waves). A level sends
    ``requests_for(N)`` requests; with ``min_duration_s`` it goes on (from a reserve planned
    for it) until its steady-state window also lasts that long, or ``duration_s`` passes.
    The window must hold ``requests_for(N) - 2N`` requests (at least N): the ramp and the
    tail cost about N each (:mod:`bakeoff.measure.window`); a level short of that is flagged.
    """

    kind: Literal["concurrency"] = "concurrency"
    levels: Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=1)]
    requests_per_level: Annotated[int, Field(gt=0)] | None = None
    requests_per_slot: Annotated[int, Field(gt=0)] = Field(
        default=10, description="requests per level = this x concurrency, unless requests_per_level is set"
    )
    min_duration_s: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="steady-state window length per level, at least (0: the request count decides)"
    )
    ramp_s: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="spread the first N starts over this long; default: one warm-up request's E2E"
    )
    duration_s: Annotated[float, Field(gt=0)] | None = Field(default=None, description="stop each level after this")

    def load_levels(self) -> list[float]:
        return [float(level) for level in self.levels]

    def requests_for(self, concurrency: int) -> int:
        """Requests per level (ten per slot by default: the window keeps eight after ramp and tail)."""
        return self.requests_per_level or self.requests_per_slot * concurrency

    def window_requests(self, concurrency: int) -> int:
        """Requests the steady-state window must hold: the level's, less a ramp and a tail."""
        return max(self.requests_for(concurrency) - 2 * concurrency, concurrency)

    def pool(self, concurrency: int) -> int:
        """Requests planned for one level: its count, or a reserve for a minimum duration.

        A minimum duration (or a duration cap) needs more than the count when requests are
        fast; four times it is planned then, and the level stops once its window has enough.
        Every planned request is distinct: re-sending one would hit the prefix cache.
        """
        need = self.requests_for(concurrency)
        if self.min_duration_s > 0 or self.duration_s is not None:
            need = max(4 * need, 64 * concurrency)
        return need

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:

        plans = []
        for level in self.levels:
            warm = builder.sampled(rng, self, self.warmup_requests, 0)
            plans.append(
                RunPlan(
                    f"c{level}",
                    "closed",
                    spec,
                    concurrency=level,
                    duration_s=self.duration_s,
                    min_requests=self.window_requests(level),
                    min_duration_s=self.min_duration_s,
                    ramp_s=self.ramp_s,
                    warmup=warm,
                    requests=builder.sampled(rng, self, self.pool(level), len(warm)),
                )
            )
        return plans

    def cost(self) -> WorkloadCost:
        count, steps, fixed, prompts = 0, 0.0, 0.0, 0.0
        for level in self.levels:
            n = self.requests_for(level) + self.warmup_requests
            count += n
            if self.duration_s is None:
                steps += math.ceil(n / level) * (self.output_len.mean + 8)
                prompts += n * self.input_len.mean
            else:
                fixed += self.duration_s
        return WorkloadCost(count, steps, fixed, prompts)

    def for_rehearsal(self) -> ConcurrencySweep:
        # One request per slot: every level still reaches its concurrency.
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "requests_per_level": None,
                "requests_per_slot": 1,
                "duration_s": None,
                "min_duration_s": 0.0,
                "output_len": rehearsal_length(self.output_len),
            }
        )


class OpenLoop(SampledLengths):
    """Open loop: arrivals at a given rate regardless of completions, so queueing shows."""

    kind: Literal["open_loop"] = "open_loop"
    rates: Annotated[list[Annotated[float, Field(gt=0)]], Field(min_length=1)]
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    burstiness: Annotated[float, Field(gt=0)] = 1.0
    requests_per_rate: Annotated[int, Field(gt=0)] = 64
    max_concurrency: Annotated[int, Field(gt=0)] | None = None
    slo_search: bool = Field(default=False, description="then search the highest rate meeting the SLO")
    search_steps: Annotated[int, Field(ge=1, le=12)] = 4
    search_tolerance: Annotated[float, Field(gt=0)] = 0.15

    @property
    def searches_slo(self) -> bool:
        return self.slo_search

    def load_levels(self) -> list[float]:
        return [float(rate) for rate in self.rates]

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:

        plans = []
        for index, rate in enumerate(self.rates):
            warm = builder.sampled(rng, self, self.warmup_requests, 0)
            reqs = builder.sampled(rng, self, self.requests_per_rate, len(warm))
            times = arrival_times(len(reqs), rate, self.arrival, self.burstiness, self.seed + index)
            plans.append(
                RunPlan(
                    f"r{rate:g}",
                    "open",
                    spec,
                    rate=rate,
                    concurrency=self.max_concurrency,
                    warmup=warm,
                    requests=retime(reqs, times),
                )
            )
        return plans

    def cost(self) -> WorkloadCost:
        runs = len(self.rates) + (self.search_steps if self.slo_search else 0)
        n = self.requests_per_rate + self.warmup_requests
        searched = self.search_steps * n / min(self.rates) if self.slo_search else 0.0
        return WorkloadCost(runs * n, runs * (self.output_len.mean + 8), sum(n / r for r in self.rates) + searched)

    def for_rehearsal(self) -> OpenLoop:
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "requests_per_rate": min(self.requests_per_rate, 12),
                "search_steps": 1,
                "output_len": rehearsal_length(self.output_len),
            }
        )


class MultiTurn(WorkloadBase):
    """Conversations sharing one system prompt; each turn appends the real assistant reply."""

    kind: Literal["multi_turn"] = "multi_turn"
    endpoint: Endpoint = "chat"
    conversations: Annotated[int, Field(gt=0)] = 8
    turns: Annotated[int, Field(gt=0)] = 4
    system_prompt_len: Annotated[int, Field(gt=0)] = 1024
    user_len: Annotated[int, Field(gt=0)] = 64
    output_len: Annotated[int, Field(gt=0)] = 32
    concurrency: Annotated[int, Field(gt=0)] = 4
    think_time_s: Annotated[float, Field(ge=0)] = 0.0
    warmup_requests: Annotated[int, Field(ge=0)] = 0
    verify_reuse: bool = Field(default=True, description="needs server cache counters or usage")

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:

        system = builder.prompts.text(self.system_prompt_len, rng)
        sessions = [
            SessionPlan(
                session_id=i,
                system_prompt=system,
                user_turns=[builder.prompts.text(self.user_len, rng) for _ in range(self.turns)],
                user_tokens=self.user_len,
                output_len=self.output_len,
                think_time_s=self.think_time_s,
            )
            for i in range(self.conversations)
        ]
        plan = RunPlan(
            "sessions",
            "sessions",
            spec,
            concurrency=self.concurrency,
            sessions=sessions,
            system_prompt_tokens=self.system_prompt_len,
        )
        return [plan]

    def cost(self) -> WorkloadCost:
        n = self.conversations * self.turns + self.warmup_requests
        think = self.think_time_s * self.turns * math.ceil(self.conversations / self.concurrency)
        return WorkloadCost(n, math.ceil(n / self.concurrency) * (self.output_len + 8), think)

    def longest_request(self) -> int:
        # Chat templates add a few tokens per message; 8 per message is a safe allowance.
        per_turn = self.user_len + self.output_len + 16
        return self.system_prompt_len + 8 + self.turns * per_turn

    def for_rehearsal(self) -> MultiTurn:
        return self.model_copy(
            update={
                "conversations": min(self.conversations, 4),
                "turns": min(self.turns, 3),
                "concurrency": min(self.concurrency, 4),
                "think_time_s": 0.0,
                "output_len": min(self.output_len, REHEARSAL_MAX_OUTPUT),
            }
        )


class Agentic(WorkloadBase):
    """Agent tasks: trees of planner, sub-agent and join calls, each fed the real replies it waits for.

    The tree (:mod:`bakeoff.workloads.agentic`) comes from ``fanout`` and ``depth``; every
    call shares the system prompt and tool schemas; tool results, tool latencies and think
    times are drawn from the seed, so every server gets the same tree. Closed loop keeps
    ``tasks_in_flight`` tasks going, one run per level (the pressure knob on the KV pool: where hit
    rate and task time fall off as the trees stop fitting); ``task_rate`` starts
    tasks open loop instead. ``task_slo_s`` bounds task completion for task goodput.
    """

    kind: Literal["agentic"] = "agentic"
    endpoint: Literal["chat"] = "chat"
    tasks: Annotated[int, Field(gt=0)] = 8
    fanout: Annotated[int, Field(gt=0, le=16)] = 3
    depth: Annotated[int, Field(gt=0, le=4)] = 1
    system_prompt_len: Annotated[int, Field(gt=0)] = 1024
    tool_schema_len: Annotated[int, Field(ge=0)] = 512
    task_len: Annotated[int, Field(gt=0)] = 64
    subtask_len: Annotated[int, Field(gt=0)] = 32
    tool_result_len: LengthDist = Field(default_factory=lambda: LengthDist(mean=256))
    tool_latency_s: Delay = Field(default_factory=Delay, description="wait before a sub-agent call (the tool)")
    think_time_s: Delay = Field(default_factory=Delay, description="wait before a join call (the agent thinks)")
    planner_output_len: Annotated[int, Field(gt=0)] = 32
    worker_output_len: Annotated[int, Field(gt=0)] = 64
    join_output_len: Annotated[int, Field(gt=0)] = 32
    tasks_in_flight: Annotated[list[Annotated[int, Field(gt=0)]], Field(min_length=1)] = Field(
        default_factory=lambda: [2], description="closed loop: one run per level, the same trees in each"
    )
    task_rate: Annotated[float, Field(gt=0)] | None = Field(default=None, description="tasks/s: open loop instead")
    task_slo_s: Annotated[float, Field(gt=0)] | None = Field(default=None, description="bound on task completion")
    warmup_requests: Annotated[int, Field(ge=0, le=0)] = Field(
        default=0, description="none: the first tasks' cold cache is part of what a tree measures"
    )
    verify_reuse: bool = Field(default=True, description="needs server cache counters or usage")

    @field_validator("tasks_in_flight", mode="before")
    @classmethod
    def _levels(cls, value: object) -> object:
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("tool_result_len", mode="before")
    @classmethod
    def _lengths(cls, value: object) -> object:
        return _as_length(value)

    @field_validator("tool_latency_s", "think_time_s", mode="before")
    @classmethod
    def _delays(cls, value: object) -> object:
        return as_delay(value)

    def tool_latency(self, rng: random.Random) -> float:
        return self.tool_latency_s.draw(rng)

    def think_time(self, rng: random.Random) -> float:
        return self.think_time_s.draw(rng)

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:

        system_tokens = self.system_prompt_len + self.tool_schema_len
        # One shared text: the system prompt with the tool schemas after it, as agent frameworks send them.
        system = builder.prompts.text(system_tokens, rng)
        tasks: list[TaskPlan] = [
            build_task(self, builder.prompts, rng, i, system, system_tokens) for i in range(self.tasks)
        ]
        if self.task_rate is not None:
            times = arrival_times(self.tasks, self.task_rate, "poisson", 1.0, self.seed)
            for task, at in zip(tasks, times, strict=True):
                task.arrival_s = at
            return [RunPlan(f"r{self.task_rate:g}", "tasks", spec, rate=self.task_rate, tasks=tasks)]
        # Each level replays the same trees (the cache is emptied between runs): only the pressure differs.
        return [RunPlan(f"t{n}", "tasks", spec, concurrency=n, tasks=tasks) for n in self.tasks_in_flight]

    def _one_tree(self) -> dict[str, int]:
        calls = build_task(self, _LengthOnly(), random.Random(self.seed), 0, "", 0).calls
        return tree_facts(TaskPlan(0, "", 0, calls))

    def cost(self) -> WorkloadCost:
        facts = self._one_tree()
        levels = [None] if self.task_rate is not None else self.tasks_in_flight
        longest = max(self.planner_output_len, self.worker_output_len, self.join_output_len) + 8
        waits = self.depth * (self.tool_latency_s.mean_s + self.think_time_s.mean_s)
        n, steps, fixed = 0, 0.0, 0.0
        for level in levels:
            waves = math.ceil(self.tasks / level) if level else 1
            n += self.tasks * facts["calls"]
            steps += waves * facts["critical_calls"] * longest
            fixed += waves * waits + (self.tasks / self.task_rate if self.task_rate else 0.0)
        return WorkloadCost(n, steps, fixed)

    def longest_request(self) -> int:
        upper = self.model_copy(update={"tool_result_len": LengthDist(mean=self.tool_result_len.upper)})
        calls = build_task(upper, _LengthOnly(), random.Random(self.seed), 0, "", 0).calls
        system = self.system_prompt_len + self.tool_schema_len
        prompts = planned_prompt_tokens(TaskPlan(0, "", system, calls))
        # Chat templates add a few tokens per message; 8 per message is a safe allowance.
        return max(p + c.output_len + 8 * (2 * c.depth + 3) for p, c in zip(prompts, calls, strict=True))

    def for_rehearsal(self) -> Agentic:
        return self.model_copy(
            update={
                # Two trees two levels deep still take every path: branches, a join of joins, live replies.
                "tasks": min(self.tasks, 2),
                "fanout": min(self.fanout, 2),
                "depth": min(self.depth, 2),
                "tasks_in_flight": sorted({min(n, 2) for n in self.tasks_in_flight}),
                "tool_latency_s": Delay(),
                "think_time_s": Delay(),
                "planner_output_len": min(self.planner_output_len, REHEARSAL_MAX_OUTPUT),
                "worker_output_len": min(self.worker_output_len, REHEARSAL_MAX_OUTPUT),
                "join_output_len": min(self.join_output_len, REHEARSAL_MAX_OUTPUT),
            }
        )


class _LengthOnly:
    """A prompt factory stand-in for shape-only trees (cost, longest request): no text is made."""

    def text(self, tokens: int, rng: random.Random) -> str:
        return ""


class LongPromptMix(WorkloadBase):
    """Short interactive requests at a steady rate with long prompts arriving among them."""

    kind: Literal["long_prompt_mix"] = "long_prompt_mix"
    short_rate: Annotated[float, Field(gt=0)] = 2.0
    short_requests: Annotated[int, Field(gt=0)] = 40
    short_input_len: Annotated[int, Field(gt=0)] = 64
    short_output_len: Annotated[int, Field(gt=0)] = 32
    long_every: Annotated[int, Field(gt=0)] = 8
    long_input_len: Annotated[int, Field(gt=0)] = 8000
    long_output_len: Annotated[int, Field(gt=0)] = 8

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:

        times = arrival_times(self.short_requests, self.short_rate, "constant", 1.0, self.seed)
        requests: list[PlannedRequest] = []
        for i, at in enumerate(times):
            short = builder.request(rng, len(requests), self, self.short_input_len, self.short_output_len, "short")
            requests.append(at_arrival(short, at))
            if (i + 1) % self.long_every == 0:
                # Lands half-way between two short arrivals, so it overlaps the next ones.
                long = builder.request(rng, len(requests), self, self.long_input_len, self.long_output_len, "long")
                requests.append(at_arrival(long, at + 0.5 / self.short_rate))
        warm = [
            builder.request(rng, -1 - i, self, self.short_input_len, self.short_output_len, "short")
            for i in range(self.warmup_requests)
        ]
        return [RunPlan("mix", "open", spec, rate=self.short_rate, warmup=warm, requests=requests)]

    def cost(self) -> WorkloadCost:
        n = self.short_requests + self.short_requests // self.long_every + self.warmup_requests
        return WorkloadCost(n, self.long_output_len + self.short_output_len, self.short_requests / self.short_rate)

    def longest_request(self) -> int:
        return max(self.long_input_len + self.long_output_len, self.short_input_len + self.short_output_len)

    def for_rehearsal(self) -> LongPromptMix:
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "short_requests": min(self.short_requests, 16),
                "short_output_len": min(self.short_output_len, REHEARSAL_MAX_OUTPUT),
                "long_output_len": min(self.long_output_len, REHEARSAL_MAX_OUTPUT),
            }
        )


class Trace(TraceSpec):
    """Replay a production trace open loop: its arrivals (scaled), lengths and shared prefixes."""

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:

        planned = plan_trace(self, builder.prompts, builder.context_limit)
        requests = [
            builder.with_text(i, self, text, row.prompt_tokens, row.output_tokens, group, at)
            for i, (row, text, group, at) in enumerate(
                zip(planned.rows, planned.texts, planned.classes, planned.arrivals_s, strict=True)
            )
        ]
        # Warm-up takes the first rows' lengths with fresh text: it must not warm the trace's prefixes.
        warm = [
            builder.request(rng, -1 - i, self, row.prompt_tokens, row.output_tokens)
            for i, row in enumerate(planned.rows[: self.warmup_requests])
        ]
        plan = RunPlan(
            "trace",
            "open",
            spec,
            rate=planned.info["offered_rate"],
            concurrency=self.max_concurrency,
            warmup=warm,
            requests=requests,
            block_size=planned.block_size,
            request_blocks=[list(row.blocks) for row in planned.rows],
            trace=planned.info,
        )
        return [plan]

    def cost(self) -> WorkloadCost:

        rows = load_trace(self).rows
        # Open loop: the scaled schedule's span, then the longest request still decoding at its end.
        return WorkloadCost(
            len(rows) + self.warmup_requests, max(r.output_tokens for r in rows) + 8, rows[-1].at_s * self.time_scale
        )

    def longest_request(self) -> int:

        return max(row.prompt_tokens + row.output_tokens for row in load_trace(self).rows)


class Soak(SampledLengths):
    """One fixed mixed load held for ``duration_s``, read back in consecutive ``window_s`` windows.

    Open loop (``rate``: arrivals per second, whatever completes) or closed loop
    (``concurrency`` requests always in flight), never both; lengths from a wide distribution.
    It is one run: journaled, Ctrl-C safe and resumed like every run. Its windows and their
    trends (:mod:`bakeoff.analysis.soak`, :mod:`bakeoff.analysis.drift`) are read from the
    records and the telemetry series afterwards, so the load itself never pauses between
    windows (a drain would hand a fragmenting allocator back its free memory).

    ``latency_margin`` / ``memory_margin``: the drift a trend must exceed, with its whole
    interval, to be called drifting: P99's growth over the soak as a share of its mean, and
    the unaccounted memory's growth as a share of the engine's memory.
    """

    kind: Literal["soak"] = "soak"
    duration_s: Annotated[float, Field(gt=0)] = Field(description="how long the load is held (hours on a GPU host)")
    window_s: Annotated[float, Field(gt=0)] = Field(default=60.0, description="length of each measured window")
    rate: Annotated[float, Field(gt=0)] | None = Field(default=None, description="open loop: arrivals per second")
    arrival: Literal["poisson", "gamma", "constant"] = "poisson"
    burstiness: Annotated[float, Field(gt=0)] = 1.0
    concurrency: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="closed loop: requests kept in flight (open loop: a cap, optional)"
    )
    requests: Annotated[int, Field(gt=0)] | None = Field(
        default=None,
        description="closed loop: distinct requests planned (default: one per slot-second; the run ends at "
        "duration_s or when they are used up)",
    )
    settle_windows: Annotated[int, Field(ge=0)] = Field(
        default=1, description="first windows left out of the trend test (the engine settling in)"
    )
    latency_margin: Annotated[float, Field(gt=0)] = 0.10
    memory_margin: Annotated[float, Field(gt=0)] = 0.02

    @model_validator(mode="after")
    def _one_load(self) -> Soak:
        if self.rate is None and self.concurrency is None:
            raise ValueError("a soak needs its load: 'rate' (open loop) or 'concurrency' (closed loop)")
        if self.window_s * (self.settle_windows + 3) > self.duration_s:
            raise ValueError(
                f"duration_s {self.duration_s:g} holds fewer than 3 windows of {self.window_s:g} s after "
                f"{self.settle_windows} settling: a trend needs at least 3; lower window_s or raise duration_s"
            )
        return self

    @property
    def open_loop(self) -> bool:
        return self.rate is not None

    def planned_requests(self) -> int:
        if self.rate is not None:
            return math.ceil(self.rate * self.duration_s)
        assert self.concurrency is not None
        return self.requests or math.ceil(self.concurrency * self.duration_s)

    def _plans(self, builder: PlanBuilder, rng: random.Random, spec: Self) -> list[RunPlan]:
        warm = builder.sampled(rng, self, self.warmup_requests, 0)
        reqs = builder.sampled(rng, self, self.planned_requests(), len(warm))
        if self.rate is not None:
            times = arrival_times(len(reqs), self.rate, self.arrival, self.burstiness, self.seed)
            plan = RunPlan(
                "soak",
                "open",
                spec,
                rate=self.rate,
                concurrency=self.concurrency,
                warmup=warm,
                requests=retime(reqs, times),
            )
        else:
            plan = RunPlan(
                "soak",
                "closed",
                spec,
                concurrency=self.concurrency,
                duration_s=self.duration_s,
                warmup=warm,
                requests=reqs,
            )
        return [plan]

    def cost(self) -> WorkloadCost:
        # Held for its duration whatever the server's speed; the last requests still decode after it.
        return WorkloadCost(self.planned_requests() + self.warmup_requests, self.output_len.mean + 8, self.duration_s)

    def for_rehearsal(self) -> Soak:
        # Long enough for the windows and the trend test to run (4 windows of 2 s), nothing more.
        return self.model_copy(
            update={
                "warmup_requests": min(self.warmup_requests, 2),
                "duration_s": 8.0,
                "window_s": 2.0,
                "settle_windows": 1,
                "requests": None,
                "output_len": rehearsal_length(self.output_len),
            }
        )


Workload = Annotated[
    ConcurrencySweep | OpenLoop | MultiTurn | Agentic | LongPromptMix | Trace | Soak, Field(discriminator="kind")
]
# Reads a stored plan's workload back as its kind (RunPlan.from_json).
WORKLOAD: TypeAdapter[Workload] = TypeAdapter(Workload)
