"""summary.json as a typed, versioned model: validation both ways, old layouts, the metric table."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bakeoff.errors import ResultsError
from bakeoff.measure.metrics import summarize
from bakeoff.measure.slo import Slo
from bakeoff.report.tables import GLOSSARY, group_table, headline_table, results_frame, summary_table, turn_figure
from bakeoff.results import metric_table
from bakeoff.results.records import ErrorKind, RequestRecord
from bakeoff.results.store import read_summary, write_summary
from bakeoff.results.summary import SCHEMA_VERSION, Latency, RunSummary, Stat, migrate

V1 = Path(__file__).parent / "data" / "summary_v1"
V1_SESSIONS = V1 / "sessions_campaign.json"
V1_SALVAGED = V1 / "salvaged_open_groups.json"
V1_STATS = ("mean", "p50", "p90", "p95", "p99")

MS = 1_000_000
BASE = 10_000 * MS


def raw(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def salvaged_records() -> list[RequestRecord]:
    """The records behind ``salvaged_open_groups.json`` (see tests/data/summary_v1/README.md)."""

    def rec(
        i: int,
        start: float,
        chunks: list[float],
        end: float,
        tokens: int,
        *,
        group: str = "",
        error: ErrorKind | None = None,
        scheduled: float | None = None,
        max_tokens: int = 0,
        warmup: bool = False,
    ) -> RequestRecord:
        ns = [BASE + int(c * MS) for c in chunks]
        return RequestRecord(
            i,
            warmup=warmup,
            group=group,
            scheduled_ns=BASE + int(scheduled * MS) if scheduled is not None else 0,
            start_ns=BASE + int(start * MS),
            headers_ns=BASE + int((start + 1) * MS),
            first_event_ns=ns[0] - 2 * MS if ns else 0,
            first_token_ns=ns[0] if ns else 0,
            end_ns=BASE + int(end * MS),
            chunk_ns=ns,
            chunk_chars=[3] * len(ns),
            chunk_tokens=[1] * len(ns),
            prompt_tokens=20,
            max_tokens=max_tokens,
            completion_tokens=tokens,
            error_kind=error,
            error="boom" if error else "",
            http_status=500 if error else 200,
        )

    return [
        rec(0, -500, [-400, -390], -380, 2, warmup=True),
        rec(1, 0, [50, 60, 70, 80], 85, 4, group="short", scheduled=-3, max_tokens=4),
        rec(2, 10, [110, 130, 150, 170, 190, 210], 215, 6, group="long", scheduled=10, max_tokens=8),
        rec(3, 20, [90, 100, 110, 120], 125, 4, group="short", scheduled=15, max_tokens=4),
        rec(4, 30, [330, 350, 370, 390], 400, 4, group="long", scheduled=25, max_tokens=4),
        rec(5, 40, [], 140, 0, group="long", error="http", scheduled=40, max_tokens=4),
        rec(6, 50, [150], 1150, 1, group="short", error="stall", scheduled=45, max_tokens=4),
    ]


# --- old layouts ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", [V1_SESSIONS, V1_SALVAGED], ids=["sessions", "salvaged"])
def test_every_v1_figure_survives_migration(path: Path) -> None:
    old = raw(path)
    assert "schema_version" not in old
    summary = read_summary(path)
    assert summary.schema_version == SCHEMA_VERSION
    for key in Latency.model_fields:
        if key not in old:  # added in layout 3 (send-time latencies): empty for older runs
            assert summary.latency.get(key).n == 0, key
            continue
        stat, before = summary.latency.get(key), old[key]
        assert stat.n == before["count"], key
        assert stat.p99_9 == before["p99.9"], key
        assert [stat.value(s) for s in V1_STATS] == [before[s] for s in V1_STATS], key
    for group, block in old.get("by_group", {}).items():
        assert summary.by_group[group].itl_ms.p99_9 == block["itl_ms"]["p99.9"]
        assert summary.by_group[group].ttft_ms.n == block["ttft_ms"]["count"]
    assert summary.requests.model_dump() == old["requests"]
    assert summary.throughput.model_dump(exclude={"offered_req_s"}) == old["throughput"]
    assert summary.window is None and summary.chunking.gaps == 0
    assert summary.short_completions.model_dump() == old["short_completions"]
    assert summary.interrupted is old["interrupted"]
    assert {str(t): v for t, v in summary.ttft_ms_by_turn.items()} == old.get("ttft_ms_by_turn", {})
    assert summary.workload.run == old["workload"]["run"] and summary.workload.mode == old["workload"]["mode"]


def test_v1_campaign_blocks_keep_their_values() -> None:
    old = raw(V1_SESSIONS)
    summary = read_summary(V1_SESSIONS)
    assert summary.workload.concurrency == 2 and summary.workload.rate is None
    assert summary.workload.spec == {"kind": "multi_turn", "turns": 3, "label": "chat"}
    assert summary.prefix_cache is not None
    read_back = summary.prefix_cache.model_dump()
    # Fields added since (the server's cache granularity, what it could reuse) read as not measured.
    assert {k: read_back[k] for k in old["prefix_cache"]} == old["prefix_cache"]
    assert read_back["cache_granularity"] is None and read_back["reusable"] is None
    assert summary.cache_reset is not None and summary.cache_reset.model_dump() == old["cache_reset"]
    # Fields new since (slo.ttfa_ms, the energy cost) are unset in an old file.
    assert summary.slo is not None and summary.slo.model_dump(exclude_unset=True) == old["slo"]
    # Fields added since (what the build step timed, a cached engine, the PyTorch flow's build, which warm
    # start a run measured on) read as unknown.
    assert summary.effort is not None and summary.effort.model_dump() == {
        **old["effort"],
        "cache_restarts": [],
        "warm_start_of": None,
        "engine_build_step": None,
        "engine_build_cached": None,
        "pytorch_build": None,
    }
    assert summary.cost is not None and summary.cost.model_dump(exclude_unset=True) == old["cost"]


def test_todays_summarize_reproduces_the_salvaged_v1_run() -> None:
    """Same records, same figures wherever the definition stayed: the layout changed, not the numbers.

    Definitions that changed since layout 1: latency of a scheduled request counts from its
    scheduled time, percentiles are nearest-rank (layout 3), TPOT ends at the last content
    chunk. Counts and means of TTFT, TTFB, E2E and ITL are compared; the schedule on its own.
    """
    records = salvaged_records()
    unscheduled = [replace(r, scheduled_ns=0) for r in records]
    today = summarize(unscheduled, Slo(ttft_ms=100.0))
    old = read_summary(V1_SALVAGED)
    for key in ("ttft_ms", "ttfb_ms", "e2e_ms", "itl_ms"):
        assert (today.latency.get(key).n, today.latency.get(key).mean) == pytest.approx(
            (old.latency.get(key).n, old.latency.get(key).mean)
        ), key
    assert today.requests == old.requests and today.tokens == old.tokens
    assert today.short_completions == old.short_completions
    assert today.throughput.window_s == pytest.approx(old.throughput.window_s)
    delay, old_delay = summarize(records).queue_delay_ms, old.queue_delay_ms
    assert delay is not None and old_delay is not None
    assert (delay.n, delay.mean) == pytest.approx((old_delay.n, old_delay.mean))


def test_a_migrated_summary_is_rewritten_in_the_current_layout(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    shutil.copy(V1_SESSIONS, target)
    summary = read_summary(target)
    write_summary(target, summary)
    written = raw(target)
    assert written["schema_version"] == SCHEMA_VERSION
    assert "ttft_ms" not in written and written["latency"]["ttft_ms"]["n"] == 9
    assert read_summary(target) == summary


def test_a_newer_layout_is_refused_with_the_versions_named(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    target.write_text(json.dumps({**raw(V1_SESSIONS), "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ResultsError, match=rf"newer bakeoff \(schema_version {SCHEMA_VERSION + 1}; .*upgrade"):
        read_summary(target)
    with pytest.raises(ValueError, match="positive integer"):
        migrate({"schema_version": "2"})


# --- validation on write and read -----------------------------------------------------------


def minimal() -> RunSummary:
    return summarize([RequestRecord(0, start_ns=BASE, first_token_ns=BASE + 5 * MS, end_ns=BASE + 9 * MS)])


def test_write_refuses_an_invalid_summary_naming_the_field(tmp_path: Path) -> None:
    bad = minimal()
    bad.requests.ok = -1  # assignment is not validated; writing is
    with pytest.raises(ResultsError, match=r"requests\.ok: Input should be greater than or equal to 0"):
        write_summary(tmp_path / "summary.json", bad)
    assert not (tmp_path / "summary.json").exists()


def test_read_refuses_unknown_fields_and_broken_files(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_summary(target, minimal())
    body = raw(target)
    body["throughput"]["output_toks"] = 1.0  # a misspelt field
    target.write_text(json.dumps(body))
    with pytest.raises(ResultsError, match=r"throughput\.output_toks: Extra inputs are not permitted"):
        read_summary(target)
    target.write_text("{not json")
    with pytest.raises(ResultsError, match="cannot read"):
        read_summary(target)
    target.write_text("[]")
    with pytest.raises(ResultsError, match="a JSON object"):
        read_summary(target)


def test_layout_3_empty_intervals_are_dropped_and_refused_in_layout_4(tmp_path: Path) -> None:
    # Layout 3 carried an ``intervals`` field per statistic, throughput and SLO block that no
    # run ever filled: one summary is one repeat; intervals across repeats are computed on read.
    target = tmp_path / "summary.json"
    shutil.copy(V1_SALVAGED, target)  # latency, by_group, queue delay and SLO blocks
    summary = read_summary(target)
    write_summary(target, summary)
    current = raw(target)
    layout_3 = json.loads(json.dumps(current))
    layout_3["schema_version"] = 3
    stats = [*layout_3["latency"].values(), layout_3["queue_delay_ms"]]
    stats += [stat for latency in layout_3["by_group"].values() for stat in latency.values()]
    for block in [*stats, layout_3["throughput"], layout_3["slo"]]:
        block["intervals"] = {}
    target.write_text(json.dumps(layout_3))
    assert read_summary(target) == summary
    current["latency"]["ttft_ms"]["intervals"] = {}
    target.write_text(json.dumps(current))
    with pytest.raises(ResultsError, match=r"latency\.ttft_ms\.intervals: Extra inputs are not permitted"):
        read_summary(target)


def test_a_percentile_is_supported_only_with_a_sample_beyond_it() -> None:
    assert not Stat(n=32).supported("p99") and Stat(n=100).supported("p99")
    assert not Stat(n=999).supported("p99_9") and Stat(n=1000).supported("p99_9")
    assert not Stat(n=1).supported("p50") and Stat(n=2).supported("p50") and Stat(n=1).supported("mean")


# --- the metric table drives glossary, columns and summary fields ----------------------------


def test_glossary_and_headline_come_from_the_table() -> None:
    for metric in metric_table.METRICS:
        assert f"| {metric.name} | {metric.unit} |" in GLOSSARY
    columns = metric_table.headline_columns()
    assert columns["ttft_ms_p99"] == "TTFT P99 ms" and columns["usd_per_m_tok"] == "$/M tok"
    frame_columns = {name for name, _ in metric_table.frame_columns()}
    assert set(columns) <= frame_columns  # the headline table selects from the results frame


def test_every_distribution_of_the_table_is_in_the_summary() -> None:
    summary = minimal()
    for metric in metric_table.DISTRIBUTIONS:
        assert metric.stat(summary) is summary.latency.get(metric.key)
    assert summary.latency.ttft_ms.p50 == pytest.approx(5.0) and summary.latency.e2e_ms.p50 == pytest.approx(9.0)


def test_a_table_row_without_its_summary_field_fails_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = metric_table.Metric("queue_ms", "queue", "ms", "x", "lower", "Q {stat}", samples=lambda ok: [])
    monkeypatch.setattr(metric_table, "DISTRIBUTIONS", (*metric_table.DISTRIBUTIONS, extra))
    with pytest.raises(RuntimeError, match=r"table only \['queue_ms'\]"):
        metric_table._check_table()


def test_terminal_table_shows_only_figures_some_run_has() -> None:
    plain = summarize(salvaged_records())
    with_slo = summarize(salvaged_records(), Slo(ttft_ms=100.0))
    assert "goodput req/s" not in summary_table({"a": plain})
    table = summary_table({"a": plain, "b": with_slo})
    assert "goodput req/s" in table and "$/M tok" not in table
    assert "failures in a: {'http': 1, 'stall': 1}" in table


# --- a report from folders written by the previous layout ------------------------------------


def test_report_tables_render_from_v1_run_folders(tmp_path: Path) -> None:
    cells = {"sglang__chat": ("sglang", "chat", V1_SESSIONS), "ref__mix": ("ref", "mix", V1_SALVAGED)}
    for cell_id, (server, workload, source) in cells.items():
        cell = tmp_path / "cells" / cell_id
        run = cell / "runs" / raw(source)["workload"]["run"]
        run.mkdir(parents=True)
        shutil.copy(source, run / "summary.json")
        info = {"server": {"label": server}, "backend": server, "workload": workload, "status": "ok"}
        (cell / "cell.json").write_text(json.dumps(info))
    frame = results_frame(tmp_path)
    old = raw(V1_SESSIONS)
    row = frame[frame.server == "sglang"].iloc[0]
    assert row["ttft_ms_p99"] == old["ttft_ms"]["p99"] and row["tok_s_per_user_p50"] == old["tok_s_per_user"]["p50"]
    assert row["usd_per_m_tok"] == old["cost"]["usd_per_million_output_tokens"]
    assert row["designed_reuse"] == old["prefix_cache"]["designed_reuse"] and bool(row["cache_reset_ok"])
    headline = headline_table(frame)
    assert {"TTFT P99 ms", "$/M tok", "goodput req/s"} <= set(headline.columns)
    groups = group_table(tmp_path)
    assert sorted(groups["class"]) == ["long", "short"] and list(groups["n"]) == [2, 2]
    figure = turn_figure(tmp_path)
    assert [len(line.get_xdata()) for line in figure.axes[0].get_lines()] == [3]
