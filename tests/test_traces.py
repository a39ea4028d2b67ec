"""Trace replay: parsers on the shipped samples, malformed rows, windows, token-exact block
prompts, designed reuse, context checks, the CLI, and an on-schedule replay against the
reference server."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.cli.main import main
from bakeoff.errors import SpecError
from bakeoff.measure.client import ClientSettings
from bakeoff.report.tables import prefix_cache_table, results_frame
from bakeoff.report.trace_replay import sharing_class_table, timeline, trace_figure, trace_table
from bakeoff.results.formulas import e2e_ms, tpot_ms, ttft_from_send_ms, ttft_ms
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import read_records, write_json
from bakeoff.results.summary import RunSummary
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.kinds import Trace
from bakeoff.workloads.plan_store import load_plans, save_plans
from bakeoff.workloads.plans import PlanBuilder, designed_reuse
from bakeoff.workloads.prompts import PromptFactory, load_tokenizer
from bakeoff.workloads.traces.loading import load_trace
from bakeoff.workloads.traces.plan import check_fits
from bakeoff.workloads.traces.rows import TraceRow, reuse_share, reused_tokens

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "traces"


@pytest.fixture(scope="module")
def prompts(tiny_model: Path) -> PromptFactory:
    return PromptFactory(load_tokenizer(tiny_model))


def sample(fmt: str, **options: object) -> Trace:
    name = {"mooncake": "mooncake-sample.jsonl", "bakeoff": "bakeoff-sample.jsonl"}.get(fmt, f"{fmt}-sample.csv")
    return Trace.model_validate({"path": SAMPLES / name, "format": fmt, **options})


def brute_force_reuse(rows: list[tuple[int, tuple[int, ...]]], block_size: int) -> float:
    """The designed reuse by its definition: each prompt's longest common token prefix with any earlier one."""
    reused = 0
    for i, (prompt, blocks) in enumerate(rows):
        best = 0
        for other, other_blocks in rows[:i]:
            common = 0
            for j, (a, b) in enumerate(zip(blocks, other_blocks, strict=False)):
                mine, theirs = min(block_size, prompt - j * block_size), min(block_size, other - j * block_size)
                if a != b or mine <= 0 or theirs <= 0:
                    break
                common += min(mine, theirs)
                if mine < block_size or theirs < block_size:
                    break
            best = max(best, common)
        reused += best
    return reused / sum(p for p, _ in rows)


# --- parsers on the shipped samples ---------------------------------------------------------


def test_mooncake_sample_parses_every_row_as_written() -> None:
    raw = [json.loads(line) for line in (SAMPLES / "mooncake-sample.jsonl").read_text().splitlines()]
    trace = load_trace(sample("mooncake"))
    assert len(trace.rows) == trace.rows_in_file == len(raw) and trace.block_size == 512
    first = min(r["timestamp"] for r in raw)
    for row, item in zip(trace.rows, sorted(raw, key=lambda r: r["timestamp"]), strict=True):
        assert row.at_s == pytest.approx((item["timestamp"] - first) / 1000)
        assert (row.prompt_tokens, row.output_tokens, list(row.blocks)) == (
            item["input_length"],
            item["output_length"],
            item["hash_ids"],
        )


def test_azure_sample_times_are_offsets_from_the_first_timestamp() -> None:
    with (SAMPLES / "azure-sample.csv").open() as handle:
        raw = list(csv.DictReader(handle))
    trace = load_trace(sample("azure"))
    assert len(trace.rows) == len(raw) and trace.block_size == 0
    # 7 fractional digits (100 ns ticks) as the release writes them; seconds apart as written.
    last = raw[-1]["TIMESTAMP"]
    assert len(last.split(".")[1]) == 7
    span = (int(last[11:13]) * 3600 + int(last[14:16]) * 60 + float(last[17:])) - (
        int(raw[0]["TIMESTAMP"][11:13]) * 3600 + int(raw[0]["TIMESTAMP"][14:16]) * 60 + float(raw[0]["TIMESTAMP"][17:])
    )
    assert trace.rows[-1].at_s == pytest.approx(span, abs=1e-6)
    assert [r.prompt_tokens for r in trace.rows][:5] == [int(r["ContextTokens"]) for r in raw][:5]
    assert all(not r.blocks for r in trace.rows)


def test_burstgpt_sample_leaves_out_failures_and_filters_by_model_and_log_type() -> None:
    with (SAMPLES / "burstgpt-sample.csv").open() as handle:
        raw = list(csv.DictReader(handle))
    failures = sum(r["Response tokens"] == "0" for r in raw)
    assert failures > 0  # the sample carries the release's failed requests
    everything = load_trace(sample("burstgpt"))
    assert len(everything.rows) == len(raw) - failures
    assert everything.left_out == {"no output tokens (a failed request in the source)": failures}
    gpt4_api = load_trace(sample("burstgpt", models=["GPT-4"], log_types=["API log"]))
    wanted = [r for r in raw if r["Model"] == "GPT-4" and r["Log Type"] == "API log" and r["Response tokens"] != "0"]
    assert 0 < len(gpt4_api.rows) == len(wanted)
    assert [r.prompt_tokens for r in gpt4_api.rows] == [int(r["Request tokens"]) for r in wanted]
    with pytest.raises(SpecError, match=r"models: no row .* has Model in \['GPT-5'\]; it holds: ChatGPT, GPT-4"):
        load_trace(sample("burstgpt", models=["GPT-5"]))


def test_bakeoff_sample_keeps_sessions_and_block_ids() -> None:
    lines = [json.loads(line) for line in (SAMPLES / "bakeoff-sample.jsonl").read_text().splitlines()]
    header, rows = lines[0], lines[1:]
    trace = load_trace(sample("bakeoff"))
    assert trace.block_size == header["block_size"] == 16
    assert len(trace.rows) == len(rows)
    assert {r.session for r in trace.rows} == {r["session_id"] for r in rows}
    assert [list(r.blocks) for r in trace.rows] == [r["block_ids"] for r in sorted(rows, key=lambda r: r["arrival_s"])]


# --- malformed rows ----------------------------------------------------------------------------

MALFORMED = [
    (
        "mooncake",
        '{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 5}\n',
        r"row 2: input_length: missing",
    ),
    (
        "mooncake",
        '{"timestamp": 0, "input_length": 10, "output_length": 2}\n\n'
        '{"timestamp": 9, "input_length": "ten", "output_length": 2, "hash_ids": [1]}\n',
        r"row 3: input_length: 'ten' is not a whole number",
    ),
    ("mooncake", '{"timestamp": -4, "input_length": 10, "output_length": 2}\n', r"row 1: timestamp: must be 0 or more"),
    ("mooncake", '{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": "1,2"}\n', r"row 1: hash_ids"),
    (
        "mooncake",
        '{"timestamp": 1, "input_length": 10.5, "output_length": 2}\n',
        r"row 1: input_length: expected a whole",
    ),
    ("mooncake", "not json\n", r"row 1: \(line\): not valid JSON"),
    (
        "azure",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\nyesterday,4,4\n",
        r"row 3: TIMESTAMP",
    ),
    (
        "azure",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,\n",
        r"row 2: GeneratedTokens: empty",
    ),
    ("azure", "TIMESTAMP,Context,GeneratedTokens\n1,2,3\n", r"row 1: the header lacks ContextTokens"),
    (
        "burstgpt",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,ChatGPT,10,5,15,API log\n"
        "2,ChatGPT,-3,5,2,API log\n",
        r"row 3: Request tokens: must be 1 or more",
    ),
    (
        "bakeoff",
        '{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 1, "block_ids": [1]}\n',
        r"row 1: block_ids: need a header",
    ),
    (
        "bakeoff",
        '{"bakeoff_trace": 1, "block_size": 4}\n{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": "x"}\n',
        r"row 2: output_tokens",
    ),
]


@pytest.mark.parametrize(("fmt", "text", "expected"), MALFORMED)
def test_malformed_rows_are_refused_with_row_and_field(tmp_path: Path, fmt: str, text: str, expected: str) -> None:
    path = tmp_path / ("t.csv" if fmt in ("azure", "burstgpt") else "t.jsonl")
    path.write_text(text)
    with pytest.raises(SpecError, match=expected) as caught:
        load_trace(Trace(path=path, format=fmt))
    assert str(path) in str(caught.value)


def test_every_problem_is_listed_not_just_the_first(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {i}, "input_length": 0, "output_length": 1}}\n' for i in range(8)))
    with pytest.raises(SpecError) as caught:
        load_trace(Trace(path=path, format="mooncake"))
    message = str(caught.value)
    assert "row 1: input_length" in message and "row 5: input_length" in message and "(and 3 more)" in message


def test_format_options_belong_to_their_format() -> None:
    with pytest.raises(ValueError, match="block_size applies to formats mooncake and otel only"):
        Trace(path=Path("x.csv"), format="azure", block_size=16)
    with pytest.raises(ValueError, match="models and log_types filter burstgpt traces only"):
        Trace(path=Path("x.jsonl"), format="mooncake", models=["GPT-4"])


def test_a_missing_trace_file_names_where_it_looked() -> None:
    with pytest.raises(SpecError, match=r"trace file nowhere/t.jsonl not found \(tried .*nowhere/t.jsonl"):
        load_trace(Trace(path=Path("nowhere/t.jsonl"), format="mooncake"))


# --- windows and designed reuse --------------------------------------------------------------


def test_window_and_time_scale_rebase_and_compress_arrivals(prompts: PromptFactory) -> None:
    full = load_trace(sample("mooncake")).rows
    start, length = 20.0, 30.0
    inside = [r for r in full if start <= r.at_s < start + length][:40]
    wl = sample("mooncake", start_s=start, duration_s=length, max_requests=40, time_scale=0.25, warmup_requests=0)
    plan = PlanBuilder(prompts).build(wl)[0]
    assert len(plan.requests) == 40 and plan.mode == "open"
    expected = [(r.at_s - inside[0].at_s) * 0.25 for r in inside]
    assert [r.arrival_s for r in plan.requests] == pytest.approx(expected)
    assert plan.trace["left_out"] == {
        "outside start_s/duration_s": len(full) - len([r for r in full if start <= r.at_s < start + length]),
        "beyond max_requests": len([r for r in full if start <= r.at_s < start + length]) - 40,
    }
    with pytest.raises(SpecError, match="start_s/duration_s: the window"):
        load_trace(sample("mooncake", start_s=10_000))


def test_reuse_counts_leading_blocks_only_and_partial_blocks_by_their_tokens() -> None:
    requests: list[tuple[int, tuple[int, ...]]] = [
        (10, (1, 2, 3)),  # blocks of 4: 4 + 4 + 2 tokens; nothing earlier
        (12, (1, 2, 4)),  # blocks 1, 2 repeat: 8
        (9, (5, 2, 3)),  # block 2 after a new block 5 is another prefix: 0
        (12, (1, 2, 3)),  # 1, 2 in full, then block 3 of which only 2 tokens were sent before: 10
        (3, (1,)),  # a 3-token part of block 1: 3
    ]
    assert reused_tokens(requests, 4) == [0, 8, 0, 10, 3]
    assert reuse_share(requests, 4) == pytest.approx(21 / 46)
    assert reuse_share([(5, ()), (5, ())], 0) == 0.0  # no ids: unique prompts, nothing designed


def test_designed_reuse_of_the_plan_is_the_one_the_hash_ids_define(prompts: PromptFactory) -> None:
    wl = sample("mooncake", warmup_requests=2)
    rows = load_trace(wl).rows
    from_ids = brute_force_reuse([(r.prompt_tokens, r.blocks) for r in rows], 512)
    plan = PlanBuilder(prompts).build(wl)[0]
    assert designed_reuse(plan) == pytest.approx(from_ids, abs=1e-12)
    assert 0.4 < from_ids < 0.9  # the sample was made with shared prefixes
    small = sample("bakeoff")
    small_rows = load_trace(small).rows
    small_plan = PlanBuilder(prompts).build(small)[0]
    assert designed_reuse(small_plan) == pytest.approx(
        brute_force_reuse([(r.prompt_tokens, r.blocks) for r in small_rows], 16)
    )


def test_equal_block_ids_are_identical_tokens_and_lengths_are_exact(prompts: PromptFactory) -> None:
    tokenizer = prompts.tokenizer
    assert tokenizer.encode is not None
    wl = sample("bakeoff", warmup_requests=0)
    rows = load_trace(wl).rows
    plan = PlanBuilder(prompts).build(wl)[0]
    ids = [
        e.ids for e in tokenizer.encode.encode_batch([r.prompt or "" for r in plan.requests], add_special_tokens=False)
    ]
    assert [len(t) for t in ids] == [r.prompt_tokens for r in rows]
    blocks: dict[tuple[int, ...], list[int]] = {}
    for row, tokens in zip(rows, ids, strict=True):
        for j in range(len(row.blocks)):
            got = tokens[j * 16 : (j + 1) * 16]
            if len(got) < 16:
                continue
            path = row.blocks[: j + 1]
            assert blocks.setdefault(path, got) == got  # same id path: the same 16 tokens, every time
    by_id = {path[-1]: toks for path, toks in blocks.items()}
    assert len(set(map(tuple, by_id.values()))) == len(by_id)  # different ids: different text


def test_a_saved_trace_plan_reloads_with_its_blocks_and_facts(prompts: PromptFactory, tmp_path: Path) -> None:
    plan = PlanBuilder(prompts).build(sample("bakeoff"))[0]
    save_plans([plan], tmp_path)
    again = load_plans(tmp_path)[0]
    assert again.request_blocks == plan.request_blocks and again.block_size == 16
    assert again.trace == plan.trace and again.requests == plan.requests
    assert designed_reuse(again) == designed_reuse(plan)


def test_requests_are_classed_by_the_share_of_their_prompt_sent_before(prompts: PromptFactory) -> None:
    wl = sample("mooncake", warmup_requests=0)
    rows = load_trace(wl).rows
    plan = PlanBuilder(prompts).build(wl)[0]
    reused = reused_tokens([(r.prompt_tokens, r.blocks) for r in rows], 512)
    for request, n, row in zip(plan.requests, reused, rows, strict=True):
        share = n / row.prompt_tokens
        expected = "unshared" if n == 0 else ("shared<50%" if share < 0.5 else "shared>=50%")
        assert request.group == expected
    assert {r.group for r in plan.requests} == {"unshared", "shared<50%", "shared>=50%"}


# --- context limits ------------------------------------------------------------------------------


def test_requests_beyond_the_context_are_counted_and_refused_before_start() -> None:
    wl = sample("mooncake")
    rows = load_trace(wl).rows
    over = sum(r.prompt_tokens + r.output_tokens + 1 > 2048 for r in rows)
    assert over > 0
    with pytest.raises(
        SpecError, match=rf"workloads\[0\]: {over} of {len(rows)} trace requests need more than the 2048"
    ):
        check_fits(wl, 2048, "workloads[0]", "servers[0] (a)")
    check_fits(sample("mooncake", clip_to_context=True), 2048, "workloads[0]", "servers[0] (a)")  # clipping: allowed


def test_clipping_shortens_prompts_to_fit_and_says_how_many(prompts: PromptFactory) -> None:
    wl = sample("mooncake", clip_to_context=True, warmup_requests=0)
    rows = load_trace(wl).rows
    plan = PlanBuilder(prompts, context_limit=2048).build(wl)[0]
    over = sum(r.prompt_tokens + r.output_tokens + 1 > 2048 for r in rows)
    assert plan.trace["clipped"] == over > 0 and plan.trace["context_limit"] == 2048
    assert all(r.prompt_tokens + r.max_tokens + 1 <= 2048 for r in plan.requests)
    assert all(prompts.tokenizer.count(r.prompt or "") == r.prompt_tokens for r in plan.requests)
    # Clipped prompts lose their trailing blocks; designed reuse is of what is actually sent.
    assert all(len(b) * 512 < r.prompt_tokens + 512 for b, r in zip(plan.request_blocks, plan.requests, strict=True))


def test_a_campaign_refuses_a_trace_that_does_not_fit_a_server(tmp_path: Path) -> None:
    from bakeoff.campaign.cells import expand

    spec = CampaignSpec.model_validate(
        {
            "name": "t",
            "model": {"preset": "tiny", "context_len": 1024},
            "servers": [{"backend": "vllm-cpu", "label": "a", "knobs": {"max_model_len": 1024}}],
            "workloads": [{"kind": "trace", "path": str(SAMPLES / "bakeoff-sample.jsonl"), "format": "bakeoff"}],
        }
    )
    rows = load_trace(spec.workloads[0]).rows  # type: ignore[arg-type]
    over = sum(r.prompt_tokens + r.output_tokens + 1 > 1024 for r in rows)
    with pytest.raises(SpecError, match=rf"{over} of {len(rows)} trace requests .* servers\[0\] \(a\) accepts"):
        expand(spec, None)


# --- command line --------------------------------------------------------------------------------


def test_inspect_reports_counts_rates_lengths_and_reuse(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "inspect", str(SAMPLES / "mooncake-sample.jsonl"), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    rows = load_trace(sample("mooncake")).rows
    assert figures["format"] == "mooncake" and figures["requests"] == len(rows)
    assert figures["duration_s"] == pytest.approx(rows[-1].at_s)
    assert sum(rate * figures["rate_bin_s"] for _, rate in figures["rate_over_time"]) == pytest.approx(len(rows))
    assert figures["peak_rate"] > 2 * figures["mean_rate"]  # the sample's bursts show
    assert figures["prompt_tokens"]["max"] == max(r.prompt_tokens for r in rows)
    assert figures["designed_reuse"] == pytest.approx(
        brute_force_reuse([(r.prompt_tokens, r.blocks) for r in rows], 512)
    )
    assert main(["trace", "inspect", str(SAMPLES / "azure-sample.csv")]) == 0  # format told from the header
    out = capsys.readouterr().out
    assert "(azure)" in out and "none designed" in out


def test_convert_writes_a_bakeoff_trace_that_replays_the_same_requests(tmp_path: Path) -> None:
    out = tmp_path / "converted.jsonl"
    source = SAMPLES / "mooncake-sample.jsonl"
    assert (
        main(["trace", "convert", str(source), "--format", "mooncake", "--time-scale", "0.5", "--out", str(out)]) == 0
    )
    original = load_trace(sample("mooncake")).rows
    converted = load_trace(Trace(path=out, format="bakeoff")).rows
    assert [(r.prompt_tokens, r.output_tokens, r.blocks) for r in converted] == [
        (r.prompt_tokens, r.output_tokens, r.blocks) for r in original
    ]
    assert [r.at_s for r in converted] == pytest.approx([r.at_s * 0.5 for r in original], abs=1e-6)
    assert load_trace(Trace(path=out, format="bakeoff")).block_size == 512


def test_cli_options_are_checked_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "inspect", str(SAMPLES / "mooncake-sample.jsonl"), "--max-requests", "0"]) == 2
    assert "--max-requests" in capsys.readouterr().err
    assert main(["trace", "convert", str(SAMPLES / "azure-sample.csv"), "--out", "x.csv"]) == 2
    assert "should end in .jsonl" in capsys.readouterr().err


# --- replay against the reference server, and the report on it ---------------------------

REPLAYED = 90
SCALE = 0.1


@dataclass
class Replay:
    campaign: Path
    run_dir: Path
    rows: tuple[TraceRow, ...]
    summary: RunSummary


@pytest.fixture(scope="module")
def replay(prompts: PromptFactory, tmp_path_factory: pytest.TempPathFactory) -> Replay:
    """The Mooncake sample's first 90 requests at 10x speed, into a campaign-shaped folder."""
    wl = sample("mooncake", name="moon", max_requests=REPLAYED, time_scale=SCALE, warmup_requests=0)
    rows = load_trace(wl).rows
    plan = PlanBuilder(prompts).build(wl)[0]
    campaign = tmp_path_factory.mktemp("campaign")
    cell = campaign / "cells" / "ref__moon"
    write_json(cell / "cell.json", {"server": {"label": "ref"}, "backend": "reference", "workload": "moon"})
    with serve_reference(profile="vllm", ttft_ms=5, itl_ms=5) as url:
        target = RunTarget(ClientSettings(base_url=url, model="bakeoff-ref"), show_progress=False)
        summary = execute_plan(plan, target, cell / "runs" / plan.name)
    return Replay(campaign, cell / "runs" / plan.name, rows, summary)


@pytest.mark.precision
def test_mooncake_replay_sends_each_request_within_milliseconds_of_its_schedule(replay: Replay) -> None:
    records = read_records(replay.run_dir / "records.parquet")
    late_ms = sorted((r.start_ns - r.scheduled_ns) / 1e6 for r in records)
    # Typically 0.5 ms late at the median, a few ms at worst; the bound leaves room for two busy shared cores.
    assert late_ms[len(late_ms) // 2] < 2 and late_ms[int(0.9 * len(late_ms))] < 5
    assert late_ms[-1] < 15, f"sent up to {late_ms[-1]:.1f} ms late"


def test_mooncake_replay_sends_on_the_scaled_schedule_and_reuses_what_the_ids_design(replay: Replay) -> None:
    records = sorted(read_records(replay.run_dir / "records.parquet"), key=lambda r: r.request_id)
    assert len(records) == REPLAYED and all(r.ok for r in records)
    first = min(r.scheduled_ns for r in records)
    scheduled = [(r.scheduled_ns - first) / 1e9 for r in records]
    assert scheduled == pytest.approx([row.at_s * SCALE for row in replay.rows], abs=1e-6)
    # Never sent early; how late is the precision test's below.
    assert min(r.start_ns - r.scheduled_ns for r in records) >= 0
    summary = replay.summary
    assert summary.prefix_cache is not None
    designed = brute_force_reuse([(r.prompt_tokens, r.blocks) for r in replay.rows], 512)
    assert summary.prefix_cache.designed_reuse == pytest.approx(designed, abs=1e-12)
    # The server's own count (16-token blocks, last token never cached) lands on the designed share.
    assert summary.prefix_cache.cached_tokens_ratio == pytest.approx(designed, abs=0.02)
    assert summary.trace is not None and summary.trace["requests"] == REPLAYED
    assert set(summary.by_group) == {"unshared", "shared<50%", "shared>=50%"}


def test_latency_counts_from_the_scheduled_time_in_open_loop() -> None:
    late = RequestRecord(1, scheduled_ns=1_000_000_000, start_ns=1_300_000_000, completion_tokens=3)
    late.first_token_ns, late.end_ns = 1_400_000_000, 1_600_000_000
    late.chunk_ns, late.chunk_tokens = [1_400_000_000, 1_500_000_000, 1_600_000_000], [1, 1, 1]
    assert ttft_ms(late) == pytest.approx(400.0)  # 300 ms waiting to be sent + 100 ms to the first token
    assert e2e_ms(late) == pytest.approx(600.0)
    assert ttft_from_send_ms(late) == pytest.approx(100.0)  # the send-time view, kept beside it
    assert tpot_ms(late) == pytest.approx(100.0)  # decode is the server's: unchanged by the wait
    closed = RequestRecord(2, start_ns=1_300_000_000)
    closed.first_token_ns, closed.end_ns = 1_400_000_000, 1_600_000_000
    assert ttft_ms(closed) == pytest.approx(100.0) and e2e_ms(closed) == pytest.approx(300.0)


def test_timeline_bins_offered_and_completed_load_with_the_latency_it_caused() -> None:
    records = []
    for i in range(10):
        # Six requests 1 s apart, a 5 s lull, four more; the late four wait 900 ms for their first token.
        at = (1 + i + (5 if i >= 6 else 0)) * 10**9
        r = RequestRecord(i, scheduled_ns=at, start_ns=at, completion_tokens=2)
        r.first_token_ns = at + (100 if i < 6 else 900) * 10**6
        r.end_ns = r.first_token_ns + 200 * 10**6
        r.chunk_ns, r.chunk_tokens = [r.first_token_ns, r.end_ns], [1, 1]
        records.append(r)
    frame = timeline(records, bin_s=5.0)
    assert list(frame["t_s"]) == [0.0, 5.0, 10.0, 15.0]  # the last completion ends 15.1 s after the first send
    assert list(frame["offered_rps"]) == [1.0, 0.2, 0.8, 0.0]  # 5, 1 and 4 arrivals per 5 s
    assert list(frame["achieved_rps"]) == [1.0, 0.2, 0.6, 0.2]  # 10.1 .. 15.1 s: the last one ends in the 4th bin
    assert list(frame["ttft_p50_ms"])[:3] == pytest.approx([100.0, 100.0, 900.0])
    assert list(frame["tpot_p50_ms"])[:3] == pytest.approx([200.0] * 3)
    assert frame["ttft_p50_ms"].isna().iloc[3]  # nothing was scheduled in the last bin


def test_report_tables_and_figure_for_a_trace_replay(replay: Replay) -> None:
    table = trace_table(replay.campaign)
    assert list(table["server"]) == ["ref"] and int(table["requests"].iloc[0]) == REPLAYED
    offered = replay.summary.trace["offered_rate"] if replay.summary.trace else None
    assert table["offered req/s"].iloc[0] == pytest.approx(offered, rel=1e-3)
    assert table["offered req/s"].iloc[0] == pytest.approx((REPLAYED - 1) / (replay.rows[-1].at_s * SCALE), rel=1e-3)
    assert table["designed reuse"].iloc[0] == pytest.approx(replay.summary.prefix_cache.designed_reuse, abs=1e-3)  # type: ignore[union-attr]
    classes = sharing_class_table(replay.campaign)
    assert set(classes["prefix shared"]) == {"unshared", "shared<50%", "shared>=50%"}
    assert classes["n"].sum() == REPLAYED
    cache = prefix_cache_table(results_frame(replay.campaign))
    assert list(cache["workload"]) == ["moon"]  # a trace with block ids joins the designed-vs-realised table
    fig = trace_figure(replay.campaign, "moon")
    assert len(fig.axes) == 5  # three panels, two with the arrival rate on a twin axis
    offered_line = fig.axes[0].lines[0]
    assert offered_line.get_label() == "offered"
    width = offered_line.get_xdata()[1] - offered_line.get_xdata()[0]
    assert sum(offered_line.get_ydata()) * width == pytest.approx(REPLAYED)


def test_a_shipped_trace_is_found_by_its_traces_path_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bakeoff.paths import shipped
    from bakeoff.workloads.traces.loading import resolve_trace_path

    monkeypatch.chdir(tmp_path)
    found = resolve_trace_path(Path("traces/mooncake-sample.jsonl"))
    assert found == (shipped("traces") / "mooncake-sample.jsonl").resolve()
    with pytest.raises(SpecError, match=r"traces/nowhere\.jsonl not found"):
        resolve_trace_path(Path("traces/nowhere.jsonl"))
