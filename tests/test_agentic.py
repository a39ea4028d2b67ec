"""Agent task trees: the tree a few parameters make, and the live dependency against the reference server."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from bakeoff.results.records import RequestRecord
from bakeoff.results.summary import Latency, Requests, RunSummary, Throughput, Tokens, WorkloadInfo
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.agentic import (
    TRUNK,
    answer_of,
    branch_indices,
    call_messages,
    designed_rows,
    messages_digest,
    tree_facts,
)
from bakeoff.workloads.kinds import Agentic, Workload
from bakeoff.workloads.plans import PlanBuilder, RunPlan, designed_reuse
from refload import drive


def small(**update: object) -> Agentic:
    values: dict[str, object] = {
        "tasks": 3,
        "fanout": 2,
        "depth": 2,
        "system_prompt_len": 40,
        "tool_schema_len": 20,
        "task_len": 6,
        "subtask_len": 4,
        "tool_result_len": {"dist": "uniform", "min": 5, "max": 30},
        "planner_output_len": 4,
        "worker_output_len": 6,
        "join_output_len": 3,
        "tasks_in_flight": 2,
    }
    return Agentic.model_validate({**values, **update})


def test_fanout_and_depth_make_the_tree(builder: PlanBuilder) -> None:
    plan = builder.build(small())[0]
    assert plan.mode == "tasks" and plan.concurrency == 2 and plan.name == "t2" and len(plan.tasks) == 3
    task = plan.tasks[0]
    # Root planner, two sub-planners each with two workers and a join, then the root's join.
    facts = tree_facts(task)
    assert facts == {"calls": 10, "depth": 2, "critical_calls": 5, "planner": 3, "worker": 4, "join": 3}
    root_join = answer_of(task, 0)
    assert task.calls[root_join].role == "join" and root_join == len(task.calls) - 1
    # The root join waits for each sub-planner's answer, which is that sub-planner's join.
    assert [task.calls[n].role for n in task.calls[root_join].waits_for] == ["join", "join"]
    for call in task.calls:
        assert all(dep < call.node for dep in call.waits_for)  # calls follow what they wait for
    # Tool results are drawn per branch: the branches do not all carry the same length.
    assert len({c.user_tokens for c in task.calls if c.role == "worker"}) > 1
    # Branch index: the place among the planner's children; a join takes its planner's; the root's are trunk.
    roles = [(c.role, c.depth) for c in task.calls]
    assert roles[:5] == [("planner", 0), ("planner", 1), ("worker", 2), ("worker", 2), ("join", 1)]
    assert branch_indices(task) == [TRUNK, 0, 0, 1, 0, 1, 0, 1, 1, TRUNK]


def test_the_same_seed_makes_the_same_trees_and_plans_survive_json(builder: PlanBuilder) -> None:
    first, again = builder.build(small(seed=7))[0], builder.build(small(seed=7))[0]
    other = builder.build(small(seed=8))[0]
    assert first.to_json() == again.to_json()
    assert first.to_json() != other.to_json()
    back = RunPlan.from_json(first.to_json())
    assert back.tasks == first.tasks and back.to_json() == first.to_json()
    pressure = builder.build(small(seed=7, tasks_in_flight=[1, 3]))
    assert [(p.name, p.concurrency) for p in pressure] == [("t1", 1), ("t3", 3)]
    assert pressure[0].tasks == pressure[1].tasks == first.tasks  # the same trees at every level
    opened = builder.build(small(seed=7, task_rate=2.0))
    assert [(p.name, p.concurrency, p.rate) for p in opened] == [("r2", None, 2.0)]


def test_designed_reuse_counts_the_shared_system_prompt_and_each_parent_context(builder: PlanBuilder) -> None:
    plan = builder.build(small(tasks=2, depth=1, fanout=2, tool_result_len=10))[0]
    rows = designed_rows(plan.tasks)
    system = 60
    # Task 0: planner (system + task), two workers (planner prompt + reply + 4 + 10), the join.
    planner = system + 6
    worker = planner + 4 + 14
    join = planner + 4 + 8 + 2 * 6
    assert rows[:4] == [(planner, 0), (worker, planner + 4), (worker, planner + 4), (join, planner + 4)]
    assert rows[4] == (planner, system)  # the next task's planner reuses the system prompt
    share = designed_reuse(plan)
    assert share == pytest.approx(sum(r for _, r in rows) / sum(p for p, _ in rows))


def test_bad_fields_name_themselves() -> None:
    adapter: TypeAdapter[Workload] = TypeAdapter(Workload)
    for bad, field in (
        ({"fanout": 0}, "fanout"),
        ({"endpoint": "completions"}, "endpoint"),
        ({"think_time_s": -1}, "think_time_s"),
    ):
        with pytest.raises(ValidationError, match=field):
            adapter.validate_python({"kind": "agentic", **bad})


def test_cost_and_rehearsal_copy_keep_the_shape() -> None:
    wl = small(tool_latency_s=0.5, think_time_s={"dist": "exponential", "mean_s": 0.2})
    cost = wl.cost()
    assert cost.requests == 3 * 10
    assert cost.fixed_s == pytest.approx(2 * 2 * 0.7)  # two waves of two levels of waits
    rehearsal = wl.for_rehearsal()
    assert rehearsal.kind == "agentic" and rehearsal.tool_latency_s.mean_s == 0 and rehearsal.tasks <= 3
    assert wl.longest_request() > 60 + 6 + 4 + 34 + 4 + 34 + 6
    # One run per level of tasks in flight, the same trees in each: only the pressure on the cache differs.
    levels = small(tasks_in_flight=[1, 3])
    assert levels.cost().requests == 2 * 3 * 10
    assert levels.cost().decode_steps == (3 + 1) * 5 * (6 + 8)  # three waves at 1, one at 3; 5 calls deep


def by_call(records: list[RequestRecord]) -> dict[tuple[int, int], RequestRecord]:
    return {(r.task, r.node): r for r in records}


def test_each_call_carries_the_real_replies_it_waits_for(builder: PlanBuilder) -> None:
    wl = small(tool_latency_s=0.05, think_time_s=0.03)
    plan = builder.build(wl)[0]
    with serve_reference(ttft_ms=5, itl_ms=2) as url:
        records = drive(url, plan)
    assert len(records) == 30 and all(r.ok for r in records)
    calls = by_call(records)
    for task in plan.tasks:
        replies = {node: calls[(task.task_id, node)].output_text for node in range(len(task.calls))}
        for call in task.calls:
            record = calls[(task.task_id, call.node)]
            assert record.role == call.role and record.depends_on == call.waits_for and record.turn == call.depth
            # What was sent is exactly what the tree and the replies really received imply.
            assert record.sent_digest == messages_digest(call_messages(task, call.node, replies))
            for dep in call.waits_for:
                before = calls[(task.task_id, dep)]
                assert before.output_text  # a real reply, which the prompt below carries
                gap_s = (record.start_ns - before.end_ns) / 1e9
                assert gap_s >= call.delay_s - 0.002  # sent only after its dependency answered and its wait
            if call.role == "worker":
                parent = calls[(task.task_id, call.parent)]
                # The reference server counts words: the parent's prompt, its reply, the branch's own turn.
                words = len(parent.output_text.split())
                assert record.prompt_tokens == parent.prompt_tokens + words + call.user_tokens


def test_closed_loop_keeps_the_tasks_in_flight_and_open_loop_starts_them_on_time(builder: PlanBuilder) -> None:
    closed = builder.build(small(tasks=4, depth=1, tasks_in_flight=2))[0]
    opened = builder.build(small(tasks=4, depth=1, task_rate=20.0))[0]
    with serve_reference(ttft_ms=20, itl_ms=5) as url:
        closed_records = drive(url, closed)
        open_records = drive(url, opened)
    spans = {}
    for r in closed_records:
        lo, hi = spans.get(r.task, (r.start_ns, r.end_ns))
        spans[r.task] = (min(lo, r.start_ns), max(hi, r.end_ns))
    peak = max(sum(1 for lo, hi in spans.values() if lo <= start < hi) for start, _ in spans.values())
    assert peak == 2
    firsts = sorted(min(r.start_ns for r in open_records if r.task == t) for t in range(4))
    planned = [t.arrival_s for t in sorted(opened.tasks, key=lambda t: t.arrival_s)]
    for got, want in zip(firsts, planned, strict=True):
        assert abs((got - firsts[0]) / 1e9 - want) < 0.02


def timed(
    task: int, node: int, role: str, deps: list[int], start_s: float, first_s: float, end_s: float
) -> RequestRecord:
    record = RequestRecord(task * 100_000 + node, group=f"task{task}", turn=0 if role != "worker" else 1)
    record.task, record.node, record.role, record.depends_on = task, node, role, deps
    record.start_ns, record.first_token_ns, record.end_ns = int(start_s * 1e9), int(first_s * 1e9), int(end_s * 1e9)
    record.prompt_tokens, record.completion_tokens, record.cached_tokens = 100, 4, 50
    return record


def task_summary(
    plan: RunPlan, records: list[RequestRecord], run: str, evicted_tokens: float | None = None
) -> RunSummary:
    """A task run's summary around the task block its records make (``evicted_tokens``: the server's count)."""
    from bakeoff.measure.task_metrics import task_block

    return RunSummary(
        requests=Requests(ok=len(records), failed=0),
        latency=Latency(),
        throughput=Throughput(output_tok_s=1, total_tok_s=1, req_s=1, window_s=1),
        tokens=Tokens(prompt=1, completion=1),
        workload=WorkloadInfo(run=run, mode="tasks", concurrency=plan.concurrency),
        agent_tasks=task_block(plan, records, evicted_tokens=evicted_tokens),
    )


def test_task_time_and_its_critical_path_come_from_the_records(builder: PlanBuilder) -> None:
    from bakeoff.measure.task_metrics import task_block

    plan = builder.build(small(tasks=2, depth=1, fanout=2, task_slo_s=5.0))[0]
    # Task 0: planner 0-1 s (first token 0.5), workers after 0.2 s tool waits, the slow one ends at 3 s,
    # the join starts 0.1 s later and ends at 4 s.
    records = [
        timed(0, 0, "planner", [], 0.0, 0.5, 1.0),
        timed(0, 1, "worker", [0], 1.2, 1.5, 2.0),
        timed(0, 2, "worker", [0], 1.2, 2.0, 3.0),
        timed(0, 3, "join", [1, 2], 3.1, 3.6, 4.0),
        # Task 1 takes 6 s (outside the 5 s SLO); its join failed in a second copy below.
        timed(1, 0, "planner", [], 1.0, 2.0, 3.0),
        timed(1, 1, "worker", [0], 3.0, 4.0, 5.0),
        timed(1, 2, "worker", [0], 3.0, 4.0, 5.0),
        timed(1, 3, "join", [1, 2], 5.0, 6.0, 7.0),
    ]
    block = task_block(plan, records, preemptions=3.0)
    assert block is not None and block.preemptions == 3.0
    assert block.tasks == 2 and block.failed_tasks == 0 and block.calls == 8
    assert block.task_s.n == 2 and block.task_s.p50 == pytest.approx(4.0) and block.task_s.p99 == pytest.approx(6.0)
    path = block.critical_path
    assert path is not None and path.calls == 3
    # Task 0: prefill 0.5 + 0.8 + 0.5, decode 0.5 + 1.0 + 0.4, waits 0.2 + 0.1; task 1: 1+1+1, 1+1+1, 0+0.
    assert path.prefill_s == pytest.approx((1.8 + 3.0) / 2)
    assert path.decode_s == pytest.approx((1.9 + 3.0) / 2)
    assert path.wait_s == pytest.approx((0.3 + 0.0) / 2)
    assert path.prefill_s + path.decode_s + path.wait_s == pytest.approx(block.task_s.mean)
    assert block.window_s == pytest.approx(7.0) and block.tasks_per_min == pytest.approx(2 * 60 / 7)
    assert block.within_slo == 1 and block.task_goodput_per_min == pytest.approx(60 / 7)
    assert block.by_depth[0].calls == 4 and block.by_depth[0].hit_rate == pytest.approx(0.5)
    assert block.ttft_ms_by_role["join"].n == 2
    # Branches: each task's first worker is branch 0 (TTFT 0.3 s and 1 s), its second branch 1 (0.8 s, 1 s).
    assert sorted(block.ttft_ms_by_branch) == [0, 1]
    assert block.ttft_ms_by_branch[0].n == 2 and block.ttft_ms_by_branch[0].mean == pytest.approx(650.0)
    assert block.ttft_ms_by_branch[1].mean == pytest.approx(900.0)
    failed = [*records[:7], timed(1, 3, "join", [1, 2], 5.0, 6.0, 7.0)]
    failed[-1].error_kind = "http"
    broken = task_block(plan, failed)
    assert broken is not None and broken.tasks == 1 and broken.failed_tasks == 1 and broken.task_s.n == 1


def test_the_verdict_judges_agentic_runs_by_task_goodput(builder: PlanBuilder, tmp_path: Path) -> None:
    from bakeoff.analysis.task_verdict import task_metric, task_run_meets
    from bakeoff.measure.load_modes import load_axis

    plan = builder.build(small(tasks=2, depth=1, fanout=2, task_slo_s=5.0))[0]
    records = [
        timed(t, n, role, deps, t, t + 0.5, t + 1.0 + n)
        for t in (0, 1)
        for n, role, deps in ((0, "planner", []), (1, "worker", [0]), (2, "worker", [0]), (3, "join", [1, 2]))
    ]
    summary = task_summary(plan, records, "t2")
    assert load_axis(summary.workload.mode, summary.workload.concurrency, summary.workload.rate) == (
        "tasks in flight",
        2.0,
    )
    assert task_metric([summary]) == "task_goodput_per_min"
    assert task_run_meets(summary)  # every task took 4 s, within 5 s
    assert summary.agent_tasks is not None
    slow = summary.model_copy(update={"agent_tasks": summary.agent_tasks.model_copy(update={"task_slo_s": 3.0})})
    assert not task_run_meets(slow)
    # The verdict's SLO line names the task SLO the runs were judged on, not the request SLO.
    from bakeoff.analysis.verdict import WorkloadVerdict, judge, markdown
    from bakeoff.measure.slo import Slo

    request_slo = Slo(ttft_ms=200.0)
    found = judge("agents", "tasks in flight", {"a": {2.0: [summary, summary]}}, request_slo)
    assert found.agentic and found.task_slo_s == 5.0
    text = markdown([found], request_slo)
    assert "agents: task SLO P90 task completion ≤ 5 s (task_slo_s)" in text and "TTFT ms ≤ 200" not in text
    assert "highest load sustained within the task SLO: a 2 tasks in flight" in text
    unbound = summary.model_copy(update={"agent_tasks": summary.agent_tasks.model_copy(update={"task_slo_s": None})})
    loose = judge("agents", "tasks in flight", {"a": {2.0: [unbound, unbound]}}, request_slo)
    assert loose.task_slo_s is None and "agents: no task SLO set" in markdown([loose], request_slo)
    # Beside a request workload, each SLO is named for the workloads it judges.
    plain = WorkloadVerdict("chat", "concurrency", "output_tok_s", {}, None, {}, {})
    mixed = markdown([plain, found], request_slo)
    assert "TTFT ms ≤ 200, judged on nearest-rank P99 per run, every repeat (request workloads). " in mixed
    assert "Agentic workloads are judged by tasks: agents: task SLO P90 task completion ≤ 5 s" in mixed
    # The report's question asks for the task SLO too.
    from bakeoff.report.decision import question

    (tmp_path / "campaign.yaml").write_text(
        "servers: [{label: a, backend: vllm-cpu}]\nmodel: {preset: tiny}\nslo: {ttft_ms: 200}\n"
    )
    asked = question(tmp_path, [found])
    assert "within the task SLO (P90 task completion ≤ 5 s)" in asked and "TTFT" not in asked


def test_the_report_tables_ttft_by_branch_and_server_counters_across_repeats(
    builder: PlanBuilder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bakeoff.report import agentic as agent_report

    plan = builder.build(small(tasks=1, depth=1, fanout=2))[0]

    def repeat(second_worker_first_token_s: float, evicted_tokens: float | None = None) -> RunSummary:
        records = [
            timed(0, 0, "planner", [], 0.0, 0.5, 1.0),
            timed(0, 1, "worker", [0], 1.2, 1.4, 2.0),
            timed(0, 2, "worker", [0], 1.2, second_worker_first_token_s, 3.0),
            timed(0, 3, "join", [1, 2], 3.1, 3.6, 4.0),
        ]
        return task_summary(plan, records, "t1", evicted_tokens)

    # One repeat's server counted 256 evicted tokens, the other's none; neither exposed preemptions.
    runs = [agent_report.AgentRun("vllm", "agents", "t1", [repeat(1.6, evicted_tokens=256.0), repeat(2.0)])]
    monkeypatch.setattr(agent_report, "agent_runs", lambda _: runs)
    table = agent_report.branch_table(tmp_path)
    assert list(table["branch"]) == [0, 1] and list(table["n"]) == [2, 2]
    assert list(table["TTFT P50 ms"]) == pytest.approx([200.0, 600.0])  # branch 1: 400 and 800 ms, averaged
    assert list(agent_report.role_table(tmp_path)["role"]) == ["join", "planner", "worker"]
    (row,) = agent_report.task_table(tmp_path).to_dict("records")
    assert row["evicted tokens"] == 256.0 and row["preemptions"] is None and row["tasks"] == 2
    # The critical path's prefill: planner 0.5 s, the slower worker 0.4 s then 0.8 s, join 0.5 s: 1.4 and 1.8 s.
    assert row["critical prefill s"].startswith("1.600 [") and row["critical prefill s"].endswith("(n=2)")
    depths = agent_report.depth_table(tmp_path)
    assert all(text.startswith("0.500 [") and "(n=2×" in text for text in depths["hit rate (usage)"])


def test_client_processes_are_dealt_whole_tasks_and_their_share_of_the_tasks_in_flight(builder: PlanBuilder) -> None:
    from bakeoff.measure.multiload import split

    closed = builder.build(small(tasks=5, tasks_in_flight=3))[0]
    shares = split(closed, 2)
    assert [len(s.tasks) for s in shares] == [3, 2] and [s.max_concurrency for s in shares] == [2, 1]
    assert sorted(t.task_id for s in shares for t in s.tasks) == list(range(5))
    opened = builder.build(small(tasks=5, task_rate=1.0))[0]
    assert all(s.mode == "tasks" and s.max_concurrency is None for s in split(opened, 2))  # arrival times rule
