"""Request plans: token-exact prompts, byte-identical replays, arrival statistics, reuse."""

from __future__ import annotations

import random
from pathlib import Path
from typing import get_args

import numpy as np
import pytest

from bakeoff.measure.client import ClientSettings, request_body
from bakeoff.models.modelgen import SP_CHAT_TEMPLATE, train_sentencepiece_style_tokenizer
from bakeoff.workloads.kinds import Agentic, ConcurrencySweep, LongPromptMix, MultiTurn, OpenLoop, Soak, Trace, Workload
from bakeoff.workloads.plan_store import load_plans, plans_match, save_plans
from bakeoff.workloads.plans import PlanBuilder, PlannedRequest, arrival_times, designed_reuse
from bakeoff.workloads.prompts import PromptFactory, load_tokenizer


@pytest.fixture(scope="module")
def builder(tiny_model: Path) -> PlanBuilder:
    return PlanBuilder(PromptFactory(load_tokenizer(tiny_model)))


@pytest.mark.parametrize("tokens", [1, 2, 17, 256, 4000])
def test_prompts_have_exact_token_counts(builder: PlanBuilder, tokens: int) -> None:
    text = builder.prompts.text(tokens, random.Random(tokens))
    assert builder.prompts.tokenizer.count(text) == tokens


def test_sampled_lengths_are_exact_per_request(builder: PlanBuilder) -> None:
    wl = ConcurrencySweep(
        levels=[2], requests_per_level=30, input_len={"dist": "uniform", "min": 10, "max": 300}, output_len=8
    )
    plan = builder.build(wl)[0]
    counts = [builder.prompts.tokenizer.count(r.prompt or "") for r in plan.requests]
    assert counts == [r.prompt_tokens for r in plan.requests]
    assert len(set(counts)) > 10  # really distributed, not one length


def test_same_plan_file_replays_byte_identical_requests(builder: PlanBuilder, tmp_path: Path) -> None:
    wl = ConcurrencySweep(levels=[1, 4], input_len=64, output_len=16, seed=7)
    plans = builder.build(wl)
    save_plans(plans, tmp_path / "plans")
    again = load_plans(tmp_path / "plans")
    assert [p.name for p in again] == ["c1", "c4"]
    settings = ClientSettings(base_url="http://x", model="m")
    first = [request_body(r, settings) for p in plans for r in p.warmup + p.requests]
    second = [request_body(r, settings) for p in again for r in p.warmup + p.requests]
    assert first == second
    rebuilt = [request_body(r, settings) for p in builder.build(wl) for r in p.warmup + p.requests]
    assert rebuilt == first  # the seed alone reproduces the plan


def test_requests_carry_max_tokens_and_ignore_eos(builder: PlanBuilder) -> None:
    plan = builder.build(ConcurrencySweep(levels=[1], input_len=8, output_len=33))[0]
    body = request_body(plan.requests[0], ClientSettings(base_url="http://x", model="m"))
    assert b'"max_tokens":33' in body and b'"ignore_eos":true' in body
    assert b'"include_usage":true' in body


@pytest.mark.parametrize(
    ("kind", "burstiness", "cv"), [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5)]
)
def test_arrival_rate_and_burstiness(kind: str, burstiness: float, cv: float) -> None:
    times = np.array(arrival_times(20_000, 8.0, kind, burstiness, seed=3))
    gaps = np.diff(times)
    assert abs(1.0 / gaps.mean() - 8.0) / 8.0 < 0.03
    assert abs(gaps.std() / gaps.mean() - cv) / cv < 0.05


def test_open_loop_plans_one_schedule_per_rate(builder: PlanBuilder) -> None:
    wl = OpenLoop(rates=[1.0, 4.0], requests_per_rate=40, input_len=16, output_len=4)
    plans = builder.build(wl)
    assert [p.rate for p in plans] == [1.0, 4.0]
    for plan in plans:
        offsets = [r.arrival_s for r in plan.requests]
        assert offsets == sorted(offsets) and offsets[0] == 0.0


def test_multi_turn_plan_and_designed_reuse(builder: PlanBuilder) -> None:
    wl = MultiTurn(conversations=4, turns=3, system_prompt_len=200, user_len=20, output_len=10)
    plan = builder.build(wl)[0]
    assert len(plan.sessions) == 4 and all(len(s.user_turns) == 3 for s in plan.sessions)
    assert len({s.system_prompt for s in plan.sessions}) == 1
    # Prompts per turn: 220, 250, 280; conversation 0 reuses 0 + 230 + 260, others 200 + 230 + 260.
    expected = (490 + 3 * 690) / (4 * 750)
    assert designed_reuse(plan) == pytest.approx(expected)


def test_long_prompt_mix_interleaves_classes(builder: PlanBuilder) -> None:
    wl = LongPromptMix(
        short_rate=4.0, short_requests=16, long_every=4, long_input_len=1000, short_input_len=32, endpoint="completions"
    )
    plan = builder.build(wl)[0]
    groups = [r.group for r in sorted(plan.requests, key=lambda r: r.arrival_s)]
    assert groups.count("long") == 4 and groups.count("short") == 16
    assert groups.index("long") == 4  # arrives after the 4th short, before the 5th
    longs = [r for r in plan.requests if r.group == "long"]
    assert all(builder.prompts.tokenizer.count(r.prompt or "") == 1000 for r in longs)


def test_saved_plans_are_only_reused_for_the_same_workload(builder: PlanBuilder, tmp_path: Path) -> None:
    wl = ConcurrencySweep(levels=[1], input_len=8, output_len=4)
    save_plans(builder.build(wl), tmp_path)
    assert plans_match(tmp_path, wl.model_dump(mode="json"))
    changed = ConcurrencySweep(levels=[1], input_len=9, output_len=4)
    assert not plans_match(tmp_path, changed.model_dump(mode="json"))
    assert not plans_match(tmp_path / "missing", wl.model_dump(mode="json"))


@pytest.fixture(scope="module", params=["legacy", "metaspace"])
def sentencepiece_builder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PlanBuilder:
    """A Llama-2-style tokenizer: the published files' dummy-prefix layout, or the Metaspace one."""
    folder = tmp_path_factory.mktemp(f"sp-{request.param}")
    train_sentencepiece_style_tokenizer(folder, 1, legacy=request.param == "legacy")
    return PlanBuilder(PromptFactory(load_tokenizer(folder)))


def test_sentencepiece_plans_have_exact_prompt_lengths(sentencepiece_builder: PlanBuilder) -> None:
    def bodies(reqs: list[PlannedRequest]) -> list[str]:
        return [r.messages[0]["content"] if r.messages else r.prompt or "" for r in reqs]

    count = sentencepiece_builder.prompts.tokenizer.counts
    sweep = ConcurrencySweep(
        levels=[1, 4], requests_per_level=25, input_len={"dist": "uniform", "min": 1, "max": 900}, output_len=8
    )
    normal = {"dist": "normal", "mean": 200, "std": 80}
    chat = OpenLoop(rates=[2.0], requests_per_rate=20, input_len=normal, output_len=4, endpoint="chat")
    mix = LongPromptMix(short_rate=4.0, short_requests=8, long_every=4, long_input_len=3000, short_input_len=16)
    plans = [*sentencepiece_builder.build(sweep), *sentencepiece_builder.build(chat), *sentencepiece_builder.build(mix)]
    assert [p.requests[0].endpoint for p in plans] == ["completions", "completions", "chat", "completions"]
    for plan in plans:
        reqs = plan.warmup + plan.requests
        assert count(bodies(reqs)) == [r.prompt_tokens for r in reqs]


def test_sentencepiece_sessions_count_exactly_through_the_chat_template(sentencepiece_builder: PlanBuilder) -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    tokenizer = sentencepiece_builder.prompts.tokenizer
    plan = sentencepiece_builder.build(
        MultiTurn(conversations=3, turns=2, system_prompt_len=120, user_len=33, output_len=5)
    )[0]
    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(SP_CHAT_TEMPLATE)

    def server_count(system: str, user: str) -> int:
        # As vLLM counts a chat prompt: the rendered template (BOS inside it), no further specials.
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return tokenizer.count(template.render(messages=messages, bos_token="<s>", eos_token="</s>"))

    one = sentencepiece_builder.prompts.lead_words[0].strip()  # one token, however it is placed
    scaffold = server_count(one, one) - 2
    for session in plan.sessions:
        assert tokenizer.count(session.system_prompt) == plan.system_prompt_tokens
        assert [tokenizer.count(t) for t in session.user_turns] == [33, 33]
        assert server_count(session.system_prompt, session.user_turns[0]) == scaffold + 120 + 33


def test_plans_are_made_again_when_the_trace_file_or_tokenizer_changes(tmp_path: Path) -> None:
    from bakeoff.workloads.kinds import Trace
    from bakeoff.workloads.plan_store import plan_inputs
    from bakeoff.workloads.plans import RunPlan

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [1]}\n')
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    wl = Trace(path=trace, format="mooncake", block_size=8)
    spec = wl.model_dump(mode="json")
    plan = RunPlan(name="trace", mode="open", workload=wl)
    inputs = plan_inputs(wl, tokenizer, 4096)
    save_plans([plan], tmp_path / "plans", inputs)
    assert plans_match(tmp_path / "plans", spec, plan_inputs(wl, tokenizer, 4096))
    assert not plans_match(tmp_path / "plans", spec, plan_inputs(wl, tokenizer, 2048))  # clips differently
    trace.write_text('{"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [1, 2]}\n')
    assert not plans_match(tmp_path / "plans", spec, plan_inputs(wl, tokenizer, 4096))  # edited trace file
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": [1]}\n')
    tokenizer.write_text('{"changed": true}')
    assert not plans_match(tmp_path / "plans", spec, plan_inputs(wl, tokenizer, 4096))  # another tokenizer


# One small instance of every kind in the Workload union; a new kind must be added here.
SMALL_KINDS = {
    "concurrency": ConcurrencySweep(levels=[2], requests_per_level=4, input_len=16, output_len=4),
    "open_loop": OpenLoop(rates=[4.0], requests_per_rate=4, input_len=16, output_len=4),
    "multi_turn": MultiTurn(conversations=2, turns=2, system_prompt_len=32, user_len=8, output_len=4),
    "agentic": Agentic(tasks=2, fanout=2, system_prompt_len=32, tool_schema_len=8, tool_result_len=8),
    "long_prompt_mix": LongPromptMix(short_requests=4, long_every=2, long_input_len=64, short_input_len=8),
    "trace": Trace(path=Path("traces/mooncake-sample.jsonl"), format="mooncake", max_requests=6),
    "soak": Soak(duration_s=4, window_s=1, rate=2.0, input_len=16, output_len=4),
}


def test_every_kind_plans_costs_and_bounds_its_own_requests(builder: PlanBuilder) -> None:
    union = get_args(get_args(Workload)[0])
    assert {kind.model_fields["kind"].default for kind in union} == set(SMALL_KINDS), "a kind is missing here"
    for name, wl in SMALL_KINDS.items():
        plans = builder.build(wl)
        assert plans and all(p.mode in ("closed", "open", "sessions", "tasks") for p in plans), name
        sent = [r for p in plans for r in p.requests] + [r for p in plans for r in p.warmup]
        turns = sum(len(s.user_turns) for p in plans for s in p.sessions)
        turns += sum(len(t.calls) for p in plans for t in p.tasks)
        assert wl.cost().requests == len(sent) + turns, name  # the estimate counts what is planned
        longest = wl.longest_request()
        assert all(r.prompt_tokens + r.max_tokens <= longest for r in sent), name
        assert builder.build(wl) == plans, name  # from the seed: the same plans every time
        assert type(wl.for_rehearsal()) is type(wl), name
