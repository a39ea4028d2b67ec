"""Reasoning models: the thinking phase read from each framework's delta field, and its metrics.

Parsing is unit-tested on chunks shaped like each framework's; the phases, token counts
and first-token times are then checked end to end against the reference server's vllm,
sglang and trtllm profiles, which send a planted number of reasoning tokens before the
answer in that framework's wire format.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest

from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.measure.metrics import meets_slo, summarize
from bakeoff.measure.slo import Slo, run_meets_slo
from bakeoff.measure.sse import read_chunk, reasoning_tokens_of
from bakeoff.observe.telemetry import parse_prometheus
from bakeoff.ref.options import MODEL
from bakeoff.ref.profiles import make_profile
from bakeoff.ref.server import build_parser
from bakeoff.report.tables import _row, headline_table
from bakeoff.results import metric_table
from bakeoff.results.cell_record import CellRecord
from bakeoff.results.formulas import phase_itl_ms, phase_tpot_ms, ttfa_ms, ttfr_ms, ttft_ms
from bakeoff.results.layout import CellResult
from bakeoff.results.records import ANSWER, REASONING, RequestRecord
from bakeoff.results.store import read_records, write_records
from bakeoff.results.summary import RunSummary, migrate
from bakeoff.serving.launchers import REHEARSAL_REASONING_TOKENS, rehearsal_argv
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest, RunPlan
from plan_workloads import CLOSED

MS = 1_000_000


def chunk(delta: dict[str, Any], usage: dict[str, Any] | None = None) -> bytes:
    return orjson.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}], "usage": usage})


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "reasoning", "text"),
    [
        ({"reasoning_content": "think"}, "think", None),  # SGLang, TensorRT-LLM, llama.cpp, older vLLM
        ({"reasoning": "think"}, "think", None),  # vLLM after the rename
        ({"reasoning": "think", "reasoning_content": "think"}, "think", None),  # vLLM's copy: once, not twice
        ({"content": "", "reasoning_content": "think"}, "think", None),  # an empty content is no answer
        ({"content": "answer", "reasoning_content": ""}, None, "answer"),  # TensorRT-LLM's answer chunk
        ({"role": None, "content": "answer", "reasoning_content": None}, None, "answer"),  # SGLang's
        ({"reasoning": "end", "content": "start"}, "end", "start"),  # the switch, in one delta
        ({"reasoning": {"effort": "high"}, "content": "answer"}, None, "answer"),  # an object is no thinking text
    ],
)
def test_each_frameworks_reasoning_field_is_read(delta: dict[str, Any], reasoning: str | None, text: str) -> None:
    info = read_chunk(chunk(delta))
    assert (info.reasoning, info.text) == (reasoning, text)


def test_reasoning_counts_from_openai_details_or_sglangs_top_level_field() -> None:
    assert reasoning_tokens_of({"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 7}}) == 7
    assert reasoning_tokens_of({"completion_tokens": 9, "reasoning_tokens": 5}) == 5
    assert reasoning_tokens_of({"completion_tokens": 9}) is None


# --- formulas on planted records -------------------------------------------------------------


def reasoned_record() -> RequestRecord:
    # Sent at 0; reasoning chunks at 100, 110, 120 ms (2 tokens each), answer at 200, 230 ms (3 each).
    times = [100, 110, 120, 200, 230]
    return RequestRecord(
        request_id=1,
        start_ns=1,
        first_event_ns=5 * MS,
        first_token_ns=100 * MS,
        end_ns=240 * MS,
        chunk_ns=[t * MS for t in times],
        chunk_chars=[6, 6, 6, 9, 9],
        chunk_tokens=[2, 2, 2, 3, 3],
        chunk_phase=[REASONING] * 3 + [ANSWER] * 2,
        completion_tokens=12,
        reasoning_tokens=6,
        reasoning_source="server",
    )


def test_phase_formulas_on_a_planted_record() -> None:
    r = reasoned_record()
    r.start_ns = 0
    assert ttft_ms(r) == 100.0 and ttfr_ms(r) == 100.0 and ttfa_ms(r) == 200.0
    assert phase_itl_ms(r, REASONING) == [10.0, 10.0]
    assert phase_itl_ms(r, ANSWER) == [30.0]  # the 80 ms switch belongs to neither phase
    assert phase_tpot_ms(r, REASONING) == pytest.approx(20.0 / 4)  # 20 ms over the 4 tokens after the first chunk
    assert phase_tpot_ms(r, ANSWER) == pytest.approx(30.0 / 3)


def test_a_record_without_phases_reads_as_all_answer() -> None:
    plain = RequestRecord(request_id=2, start_ns=0, first_token_ns=50 * MS, chunk_ns=[50 * MS, 60 * MS], end_ns=70 * MS)
    assert ttfr_ms(plain) is None and ttfa_ms(plain) == ttft_ms(plain) == 50.0
    summary = summarize([plain, plain])
    assert summary.latency.ttfa_ms.n == 0 and summary.latency.ttfr_ms.n == 0  # no columns for a non-reasoning run
    assert summary.tokens.reasoning is None
    assert metric_table.BY_KEY["reasoning_tokens"].value(summary) is None


def test_summary_counts_phases_and_their_sources() -> None:
    r = reasoned_record()
    summary = summarize([r, reasoned_record()])
    assert summary.tokens.reasoning == 12 and summary.tokens.completion == 24
    assert summary.tokens.reasoning_sources == {"server": 2}
    assert metric_table.BY_KEY["answer_tokens"].value(summary) == 12.0
    assert summary.latency.itl_answer_ms.p50 == 30.0 and summary.latency.itl_reasoning_ms.n == 4


def test_the_slo_bounds_the_first_answer_token() -> None:
    r = reasoned_record()
    r.start_ns = 0
    assert meets_slo(r, Slo(ttft_ms=150))  # the first thinking token is early...
    assert not meets_slo(r, Slo(ttfa_ms=150))  # ...the answer is not
    summary = summarize([r] * 3, Slo(ttfa_ms=250))
    assert summary.slo is not None and summary.slo.ttfa_ms == 250 and summary.slo.attainment == 1.0
    assert run_meets_slo(summary, Slo(ttfa_ms=150)) is False


def test_phases_survive_parquet_and_old_files_read(tmp_path: Path) -> None:
    path = tmp_path / "records.parquet"
    write_records(path, [reasoned_record()])
    back = read_records(path)[0]
    assert back.chunk_phase == [REASONING] * 3 + [ANSWER] * 2
    assert (back.reasoning_tokens, back.reasoning_source) == (6, "server")
    old = RequestRecord.from_row({"request_id": 3, "chunk_ns": [1, 2], "reasoning_tokens": float("nan")})
    assert old.chunk_phase == [] and old.reasoning_tokens is None and not old.reasons


def test_a_schema_4_summary_migrates() -> None:
    raw = summarize([reasoned_record()]).model_dump(mode="json")
    raw["schema_version"] = 4
    for key in ("ttfr_ms", "ttfa_ms", "itl_reasoning_ms", "itl_answer_ms", "tpot_reasoning_ms", "tpot_answer_ms"):
        del raw["latency"][key]
    del raw["energy"]
    upgraded = RunSummary.model_validate(migrate(raw))
    assert upgraded.schema_version == 5 and upgraded.latency.ttfa_ms.n == 0


def test_the_glossary_defines_ttft_for_reasoning_models() -> None:
    text = metric_table.glossary()
    assert "| TTFT | ms | lower | request sent" in text and "time to the first token of any kind" in text
    assert "| TTFA |" in text and "| TTFR |" in text


# --- the knob ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "words"),
    [
        ("vllm", ["--reasoning-parser", "deepseek_r1"]),
        ("sglang", ["--reasoning-parser", "deepseek-r1"]),
        ("trtllm", ["--reasoning_parser", "deepseek-r1"]),
        ("llamacpp", ["--reasoning-format", "deepseek"]),
    ],
)
def test_reasoning_parser_renders_each_frameworks_flag(backend: str, words: list[str]) -> None:
    def argv(value: str) -> list[str]:
        knobs: dict[str, Any] = {"reasoning_parser": value}
        return render_launch(load_backend(backend), knobs, model="/m", served_model_name="m", port=8000).argv

    rendered = argv("deepseek_r1")
    at = rendered.index(words[0])
    assert rendered[at : at + 2] == words
    # "none": no parser (llama.cpp's format says so out loud: thinking stays in content).
    assert (words[0] in argv("none")) == (backend == "llamacpp")


# --- against the reference server's framework profiles ---------------------------------------

REASONING_TOKENS = 12
ANSWER_TOKENS = 8
# What each profile's usage says about the thinking: counted (SGLang) or not (vLLM, TensorRT-LLM).
SOURCES = {"vllm": "chunks", "sglang": "server", "trtllm": "chunks", "generic": "server"}


def chat_requests(n: int, first_id: int = 0) -> list[PlannedRequest]:
    return [
        PlannedRequest(
            first_id + i, "chat", REASONING_TOKENS + ANSWER_TOKENS, messages=[{"role": "user", "content": "q"}]
        )
        for i in range(n)
    ]


def client_settings(url: str) -> ClientSettings:
    return ClientSettings(base_url=url, model=MODEL, extra_body={"ignore_eos": True})


@pytest.mark.parametrize("profile", ["vllm", "sglang", "trtllm", "generic"])
def test_each_profile_splits_phases_with_exact_counts(profile: str) -> None:
    options = {"ttft_ms": 5, "itl_ms": 1, "reasoning_tokens": REASONING_TOKENS, "tokens_per_chunk": 2}
    with serve_reference(profile=profile, **options) as url:

        async def go() -> RequestRecord:
            async with StreamingClient(client_settings(url)) as client:
                return await client.send(chat_requests(1)[0], RequestRecord(0))

        r = asyncio.run(go())
    assert r.ok, r.error
    assert r.completion_tokens == REASONING_TOKENS + ANSWER_TOKENS and r.usage_source == "server"
    assert (r.reasoning_tokens, r.reasoning_source) == (REASONING_TOKENS, SOURCES[profile])
    assert sum(r.phase_tokens(REASONING)) == REASONING_TOKENS and sum(r.phase_tokens(ANSWER)) == ANSWER_TOKENS
    assert r.output_text.split() == [f"w{i}" for i in range(ANSWER_TOKENS)]  # the answer alone
    # Two tokens a chunk: the thinking first, and the first token of any kind is a thinking one.
    assert r.chunk_phase == [REASONING] * 6 + [ANSWER] * 4 and r.first_token_ns == r.chunk_ns[0]


PLANTED_TTFT_MS = 300.0
PLANTED_ITL_MS = 20.0
PLANTED_GAP_MS = 200.0


def lateness_counters(url: str) -> tuple[float, float]:
    """The reference server's own (seconds late, chunks sent) so far."""
    with urllib.request.urlopen(url + "/ref/metrics") as resp:
        counters = parse_prometheus(resp.read().decode())
    return counters["bakeoff_ref_late_seconds_total"], counters["bakeoff_ref_chunks_total"]


def lateness_ms(url: str, since: tuple[float, float] = (0.0, 0.0)) -> float:
    """Mean ms late per chunk since an earlier reading of :func:`lateness_counters`."""
    late_s, chunks = lateness_counters(url)
    return 1000.0 * (late_s - since[0]) / max(chunks - since[1], 1.0)


@pytest.mark.precision
@pytest.mark.parametrize("profile", ["vllm", "sglang", "trtllm"])
def test_a_reasoning_run_reports_planted_first_token_times(profile: str, tmp_path: Path) -> None:
    # The first answer chunk comes one gap per reasoning chunk and the pause after the first reasoning
    # chunk (SGLang's every 10th chunk carries a second token: 11 chunks for 12 tokens).
    thinking_chunks = len(make_profile(profile).chunk_sizes(REASONING_TOKENS, 1))
    planted_ttfa = PLANTED_TTFT_MS + thinking_chunks * PLANTED_ITL_MS + PLANTED_GAP_MS
    options = {
        "ttft_ms": PLANTED_TTFT_MS,
        "itl_ms": PLANTED_ITL_MS,
        "reasoning_tokens": REASONING_TOKENS,
        "answer_gap_ms": PLANTED_GAP_MS,
    }
    plan = RunPlan("c2", "closed", CLOSED, concurrency=2, warmup=chat_requests(2, -2), requests=chat_requests(8))
    with serve_reference(profile=profile, **options) as url:
        target = RunTarget(client_settings(url), load_backend(profile), show_progress=False)
        summary = execute_plan(plan, target, tmp_path / "try1")
        late = lateness_ms(url)
        if late > 1.0:
            # A burst of other work made the server itself miss its schedule: measure once more.
            before = lateness_counters(url)
            summary = execute_plan(plan, target, tmp_path / "try2")
            late = lateness_ms(url, before)
    assert summary.requests.ok == 8 and summary.requests.failed == 0
    assert summary.tokens.reasoning == 8 * REASONING_TOKENS
    assert summary.tokens.completion - summary.tokens.reasoning == 8 * ANSWER_TOKENS
    assert summary.tokens.reasoning_sources == {SOURCES[profile]: 8}
    latency = summary.latency
    assert late <= 1.0, f"the reference server ran {late:.1f} ms late per chunk twice: run the precision tests alone"
    assert latency.ttft_ms.p50 == pytest.approx(PLANTED_TTFT_MS, rel=0.01)
    assert latency.ttfr_ms.p50 == pytest.approx(PLANTED_TTFT_MS, rel=0.01)
    assert latency.ttfa_ms.p50 == pytest.approx(planted_ttfa, rel=0.01)
    assert latency.itl_reasoning_ms.p50 == pytest.approx(PLANTED_ITL_MS, rel=0.05)


def test_a_rehearsal_with_a_reasoning_parser_streams_thinking() -> None:
    # The stand-in's argv is the reference server's own: its parser must take the reasoning option.
    argv = rehearsal_argv("vllm", port=1, served_name="m", reasoning=True)
    assert build_parser().parse_args(argv[3:]).reasoning_tokens == REHEARSAL_REASONING_TOKENS > 0
    plain = rehearsal_argv("vllm", port=1, served_name="m")
    assert build_parser().parse_args(plain[3:]).reasoning_tokens == 0


def test_the_headline_shows_answer_latency_only_where_runs_reasoned() -> None:
    cell = CellResult(Path("a__chat"), {"label": "a"}, "vllm", "chat", 1, "ok", {}, CellRecord())
    plain = RequestRecord(request_id=2, start_ns=0, first_token_ns=50 * MS, chunk_ns=[50 * MS, 60 * MS], end_ns=70 * MS)
    thinking = [reasoned_record() for _ in range(4)]
    for r in thinking:
        r.start_ns = 0
    without = headline_table(pd.DataFrame([_row(cell, summarize([plain] * 4))]))
    assert not [c for c in without.columns if c.startswith("TTFA")]
    with_reasoning = headline_table(pd.DataFrame([_row(cell, summarize(thinking))]))
    assert with_reasoning["TTFA P50 ms"].iloc[0] == pytest.approx(200.0)
    assert with_reasoning["TTFT P50 ms"].iloc[0] == pytest.approx(100.0)
