"""Turn a workload spec into request plans: the exact requests every backend receives.

A plan is generated once per campaign from the model's tokenizer and a seed, saved as
JSON beside the results, and replayed identically to every backend, so a comparison is
between servers, never between prompt sets. Multi-turn plans fix the user turns; the
assistant turns are the server's real replies, appended while the run goes.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from bakeoff.client import PlannedRequest
from bakeoff.errors import SpecError
from bakeoff.prompts import PromptFactory
from bakeoff.traces.loading import load_trace
from bakeoff.traces.plan import plan_trace
from bakeoff.traces.rows import reuse_share
from bakeoff.workload_specs import ConcurrencySweep, LengthDist, LongPromptMix, MultiTurn, OpenLoop, Trace, Workload

Mode = Literal["closed", "open", "sessions"]
PLAN_INDEX = "index.json"
PLAN_INPUTS = "inputs.json"


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
    workload: dict[str, Any]
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

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> RunPlan:
        raw = orjson.loads(data)
        raw["warmup"] = [PlannedRequest(**r) for r in raw["warmup"]]
        raw["requests"] = [PlannedRequest(**r) for r in raw["requests"]]
        raw["sessions"] = [SessionPlan(**s) for s in raw["sessions"]]
        return cls(**raw)


def sample_length(dist: LengthDist, rng: random.Random) -> int:
    if dist.dist == "fixed":
        return dist.mean
    if dist.dist == "uniform":
        assert dist.min is not None and dist.max is not None
        return rng.randint(dist.min, dist.max)
    value = round(rng.gauss(dist.mean, dist.std))
    return max(dist.min or 1, min(dist.max or value, value))


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

    def _request(
        self, rng: random.Random, rid: int, wl: Workload, in_len: int, out_len: int, group: str = ""
    ) -> PlannedRequest:
        return self._with_text(rid, wl, self.prompts.text(in_len, rng), in_len, out_len, group)

    @staticmethod
    def _with_text(
        rid: int, wl: Workload, text: str, in_len: int, out_len: int, group: str = "", arrival_s: float = 0.0
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

    def _sampled(
        self, rng: random.Random, wl: ConcurrencySweep | OpenLoop, n: int, first_id: int
    ) -> list[PlannedRequest]:
        return [
            self._request(rng, first_id + i, wl, sample_length(wl.input_len, rng), sample_length(wl.output_len, rng))
            for i in range(n)
        ]

    def build(self, wl: Workload) -> list[RunPlan]:
        spec = wl.model_dump(mode="json")
        rng = random.Random(wl.seed)
        if isinstance(wl, ConcurrencySweep):
            plans = []
            for level in wl.levels:
                warm = self._sampled(rng, wl, wl.warmup_requests, 0)
                reqs = self._sampled(rng, wl, closed_loop_pool(wl, level), len(warm))
                plans.append(
                    RunPlan(
                        f"c{level}",
                        "closed",
                        spec,
                        concurrency=level,
                        duration_s=wl.duration_s,
                        min_requests=wl.window_requests(level),
                        min_duration_s=wl.min_duration_s,
                        ramp_s=wl.ramp_s,
                        warmup=warm,
                        requests=reqs,
                    )
                )
            return plans
        if isinstance(wl, OpenLoop):
            plans = []
            for index, rate in enumerate(wl.rates):
                warm = self._sampled(rng, wl, wl.warmup_requests, 0)
                reqs = self._sampled(rng, wl, wl.requests_per_rate, len(warm))
                times = arrival_times(len(reqs), rate, wl.arrival, wl.burstiness, wl.seed + index)
                reqs = retime(reqs, times)
                plans.append(
                    RunPlan(
                        f"r{rate:g}",
                        "open",
                        spec,
                        rate=rate,
                        concurrency=wl.max_concurrency,
                        warmup=warm,
                        requests=reqs,
                    )
                )
            return plans
        if isinstance(wl, MultiTurn):
            return [self._multi_turn(wl, rng, spec)]
        if isinstance(wl, Trace):
            return [self._trace(wl, rng, spec)]
        return [self._long_prompt_mix(wl, rng, spec)]

    def _trace(self, wl: Trace, rng: random.Random, spec: dict[str, Any]) -> RunPlan:
        planned = plan_trace(wl, self.prompts, self.context_limit)
        requests = [
            self._with_text(i, wl, text, row.prompt_tokens, row.output_tokens, group, at)
            for i, (row, text, group, at) in enumerate(
                zip(planned.rows, planned.texts, planned.classes, planned.arrivals_s, strict=True)
            )
        ]
        # Warm-up takes the first rows' lengths with fresh text: it must not warm the trace's prefixes.
        warm = [
            self._request(rng, -1 - i, wl, row.prompt_tokens, row.output_tokens)
            for i, row in enumerate(planned.rows[: wl.warmup_requests])
        ]
        return RunPlan(
            "trace",
            "open",
            spec,
            rate=planned.info["offered_rate"],
            concurrency=wl.max_concurrency,
            warmup=warm,
            requests=requests,
            block_size=planned.block_size,
            request_blocks=[list(row.blocks) for row in planned.rows],
            trace=planned.info,
        )

    def _multi_turn(self, wl: MultiTurn, rng: random.Random, spec: dict[str, Any]) -> RunPlan:
        system = self.prompts.text(wl.system_prompt_len, rng)
        sessions = [
            SessionPlan(
                session_id=i,
                system_prompt=system,
                user_turns=[self.prompts.text(wl.user_len, rng) for _ in range(wl.turns)],
                user_tokens=wl.user_len,
                output_len=wl.output_len,
                think_time_s=wl.think_time_s,
            )
            for i in range(wl.conversations)
        ]
        return RunPlan(
            "sessions",
            "sessions",
            spec,
            concurrency=wl.concurrency,
            sessions=sessions,
            system_prompt_tokens=wl.system_prompt_len,
        )

    def _long_prompt_mix(self, wl: LongPromptMix, rng: random.Random, spec: dict[str, Any]) -> RunPlan:
        times = arrival_times(wl.short_requests, wl.short_rate, "constant", 1.0, wl.seed)
        requests: list[PlannedRequest] = []
        for i, at in enumerate(times):
            short = self._request(rng, len(requests), wl, wl.short_input_len, wl.short_output_len, "short")
            requests.append(_at(short, at))
            if (i + 1) % wl.long_every == 0:
                # Lands half-way between two short arrivals, so it overlaps the next ones.
                long = self._request(rng, len(requests), wl, wl.long_input_len, wl.long_output_len, "long")
                requests.append(_at(long, at + 0.5 / wl.short_rate))
        warm = [
            self._request(rng, -1 - i, wl, wl.short_input_len, wl.short_output_len, "short")
            for i in range(wl.warmup_requests)
        ]
        return RunPlan("mix", "open", spec, rate=wl.short_rate, warmup=warm, requests=requests)


def closed_loop_pool(wl: ConcurrencySweep, level: int) -> int:
    """Requests planned for one level: its count, or a reserve for a minimum duration.

    A minimum duration (or a duration cap) needs more than the count when requests are
    fast; four times it is planned then, and the level stops once its window has enough.
    Every planned request is distinct: re-sending one would hit the prefix cache.
    """
    need = wl.requests_for(level)
    if wl.min_duration_s > 0 or wl.duration_s is not None:
        need = max(4 * need, 64 * level)
    return need


def _at(req: PlannedRequest, arrival_s: float) -> PlannedRequest:
    values = asdict(req)
    values["arrival_s"] = arrival_s
    return PlannedRequest(**values)


def retime(requests: list[PlannedRequest], times: list[float]) -> list[PlannedRequest]:
    """The same requests on a new arrival schedule (SLO search keeps requests identical)."""
    return [_at(r, t) for r, t in zip(requests, times, strict=True)]


def designed_reuse(plan: RunPlan) -> float | None:
    """Share of prompt tokens that repeat an earlier prefix, by construction of the plan.

    Turn 1 of the first conversation reuses nothing; turn 1 of the others reuses the shared
    system prompt; turn t > 1 reuses the whole previous prompt plus its reply. A trace
    replay reuses what its block ids share with earlier requests (:mod:`bakeoff.traces.rows`).
    """
    if plan.trace:
        sent = [(r.prompt_tokens, blocks) for r, blocks in zip(plan.requests, plan.request_blocks, strict=True)]
        return reuse_share(sent, plan.block_size)
    if plan.mode != "sessions" or not plan.sessions:
        return None
    total = reused = 0
    for index, session in enumerate(plan.sessions):
        prompt = plan.system_prompt_tokens
        for turn in range(len(session.user_turns)):
            previous = prompt
            prompt = (
                previous + session.user_tokens if turn == 0 else previous + session.output_len + session.user_tokens
            )
            total += prompt
            if turn == 0:
                reused += plan.system_prompt_tokens if index > 0 else 0
            else:
                reused += previous + session.output_len
    return reused / total if total else None


def longest_request(wl: Workload) -> int:
    """Largest prompt + output tokens any request of the workload can need."""
    if isinstance(wl, ConcurrencySweep | OpenLoop):
        return wl.input_len.upper + wl.output_len.upper
    if isinstance(wl, Trace):
        return max(row.prompt_tokens + row.output_tokens for row in load_trace(wl).rows)
    if isinstance(wl, MultiTurn):
        # Chat templates add a few tokens per message; 8 per message is a safe allowance.
        per_turn = wl.user_len + wl.output_len + 16
        return wl.system_prompt_len + 8 + wl.turns * per_turn
    return max(wl.long_input_len + wl.long_output_len, wl.short_input_len + wl.short_output_len)


def plan_inputs(wl: Workload, tokenizer_file: Path | None, context_limit: int | None) -> dict[str, Any]:
    """What a plan depends on beyond its workload spec: a change to any of these re-plans.

    The tokenizer decides every prompt's tokens; the context limit decides what a trace
    clips; a trace's rows live in its file, not in the spec.
    """
    import hashlib

    def digest(path: Path | None) -> str | None:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None and path.is_file() else None

    inputs: dict[str, Any] = {"tokenizer_sha256": digest(tokenizer_file), "context_limit": context_limit}
    if isinstance(wl, Trace):
        from bakeoff.traces.loading import resolve_trace_path

        inputs["trace_sha256"] = digest(resolve_trace_path(wl.path))
    return inputs


def save_plans(plans: list[RunPlan], folder: Path, inputs: dict[str, Any] | None = None) -> None:
    from bakeoff.store import atomic_write_bytes

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
