"""The report draws findings only from evidence that supports them, and labels have one source of truth.

No engines: planted campaign folders (:mod:`why_planted`) and synthetic summaries.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import verdict_planted
import why_planted as planted
from bakeoff.analysis.diagnosis import Level, classify
from bakeoff.report import explain as report_why
from bakeoff.report import tables as report
from bakeoff.results.store import read_summary, write_summary
from bakeoff.results.summary import Latency, Stat, SteadyWindow, Throughput, Tokens
from verdict_planted import run


def _one_level_three_repeats(tmp_path: Path, small_model: Path) -> pd.DataFrame:
    level = Level(4, 260.0, 40.0, 60.0, 12.0, None, 2)
    folder = planted.campaign_folder(tmp_path / "one", small_model, {"a": ("vllm-cpu", {}, [level])})
    one = report.results_frame(folder)
    return pd.concat([one.assign(repeat=r) for r in (1, 2, 3)], ignore_index=True)


def test_a_one_level_sweep_draws_no_scaling_finding_and_says_why(tmp_path: Path, small_model: Path) -> None:
    findings = report.diagnose(_one_level_three_repeats(tmp_path, small_model))
    assert not any("grew" in n for n in findings), findings  # never "grew 1.0x for 1x concurrency"
    why = [n for n in findings if "no scaling finding" in n]
    assert why and "one concurrency level measured (4)" in why[0] and "two or more levels" in why[0]


def test_the_scaling_finding_is_from_level_means_and_leaves_the_bound_to_the_diagnosis(
    tmp_path: Path, small_model: Path
) -> None:
    levels = planted.bandwidth_bound()  # 100 tok/s at 1, 800 at 16
    folder = planted.campaign_folder(tmp_path / "two", small_model, {"a": ("vllm-cpu", {}, levels)})
    frame = report.results_frame(folder)
    # A second repeat at 16 with 1000 tok/s: the finding reads the level's mean (900), not one repeat.
    extra = frame[frame["concurrency"] == 16].assign(repeat=2, output_tok_s=1000.0)
    findings = report.diagnose(pd.concat([frame, extra], ignore_index=True))
    scaling = [n for n in findings if "grew" in n]
    assert scaling == [
        "a / sweep: throughput grew 9.0x from concurrency 1 to 16 (16x; means over repeats); TPOT P50 rose 2.0x "
        "— batching still pays."
    ]
    assert not any("-bound" in n for n in findings), "which resource bounds a server is the diagnosis's to say"


def test_a_sweep_whose_tpot_no_run_could_support_still_gets_its_scaling_finding(
    tmp_path: Path, small_model: Path
) -> None:
    """A fast server's 16 tokens came in one read at every level (seen on vLLM-CPU with the tiny
    model): TPOT is None in every row, and the finding says what it can without it."""
    folder = planted.campaign_folder(tmp_path / "f", small_model, {"a": ("vllm-cpu", {}, planted.bandwidth_bound())})
    frame = report.results_frame(folder).assign(tpot_ms_p50=None)
    assert frame["tpot_ms_p50"].dtype == object
    scaling = [n for n in report.diagnose(frame) if "grew" in n]
    assert scaling == [
        "a / sweep: throughput grew 8.0x from concurrency 1 to 16 (16x; means over repeats) — batching still pays."
    ]


def test_bandwidth_bound_is_read_from_the_roofline_fraction_and_cited() -> None:
    # Throughput scales in both; alone, one decodes at 87% of the floor and the other at 47%.
    near = classify("llamacpp", "w", planted.bandwidth_bound(), efficiency=0.87)
    far = classify("vllm", "w", planted.bandwidth_bound(), efficiency=0.47)
    assert near.bound == "bandwidth" and "87% of the memory-bandwidth floor" in " ".join(near.evidence)
    assert far.bound == "overhead" and "47% of the memory-bandwidth floor" in " ".join(far.evidence)
    unchecked = classify("x", "w", planted.bandwidth_bound())
    assert "bandwidth-bound not checked" in " ".join(unchecked.evidence)
    # Saturated under load: compute-bound there, with what decode did alone cited beside it.
    busy = classify("llamacpp", "w", planted.compute_bound(), efficiency=0.87)
    assert busy.bound == "compute" and "alone (concurrency 1) decode ran at 87%" in " ".join(busy.evidence)


def test_too_little_to_go_on_says_which_evidence_is_missing() -> None:
    one = classify("s", "w", [Level(4, 100.0, 20.0, 30.0, 10.0)])
    assert one.bound == "unknown" and "one load level measured" in one.headline
    flat = classify("s", "w", [Level(1, 100.0, 20.0, 30.0, 10.0), Level(8, 120.0, 40.0, 60.0, 60.0)])
    assert flat.bound == "unknown" and "no telemetry says what was saturated" in flat.headline


def test_the_report_diagnosis_cites_the_roofline_it_shows(tmp_path: Path, small_model: Path) -> None:
    folder = planted.campaign_folder(tmp_path / "r", small_model, {"a": ("vllm-cpu", {}, planted.bandwidth_bound())})
    efficiency = float(report_why.roofline_table(folder).iloc[0]["efficiency"])
    (note,) = report_why.diagnosis_notes(folder)
    assert f"{efficiency:.0%} of the memory-bandwidth floor" in note
    assert ("overhead-bound" in note) == (efficiency < 0.6), note


def test_the_report_front_uses_the_campaigns_margin(tmp_path: Path, small_model: Path) -> None:
    # Two servers 3% apart: equals at the campaign's 5% (both on the front), not at min_effect 1%.
    same = [Level(1, 100.0, 20.0, 25.0, 10.0, None, 2), Level(8, 500.0, 30.0, 40.0, 14.0, None, 2)]
    near = [Level(1, 103.0, 20.0, 25.0, 10.0, None, 2), Level(8, 515.0, 30.0, 40.0, 14.0, None, 2)]
    cells = {"a": ("vllm-cpu", {}, same), "b": ("vllm-cpu", {}, near)}
    folder = planted.campaign_folder(tmp_path / "p", small_model, cells)
    frame = report.results_frame(folder)
    ((_, _, front),) = report_why.pareto_figures(folder, frame)
    assert set(front["server"]) == {"a", "b"}
    text = (folder / "campaign.yaml").read_text() + "min_effect: 1%\n"
    (folder / "campaign.yaml").write_text(text)
    ((_, _, front),) = report_why.pareto_figures(folder, frame)
    assert set(front["server"]) == {"b"}


def test_bench_terminal_names_its_own_flag_and_shows_disagreeing_rates_side_by_side() -> None:
    # 16 in flight, 32 requests: 2 measured in the window; req/s 2.42 while tok/s says 4.40 at 64 tokens.
    summary = run(281.6, concurrency=16, n=2)
    summary = summary.model_copy(
        update={
            "throughput": Throughput(output_tok_s=281.6, total_tok_s=281.6, req_s=2.42, window_s=0.8),
            "tokens": Tokens(prompt=0, completion=2 * 64),
            "window": SteadyWindow(
                concurrency=16,
                ramp_s=0.1,
                start_s=0.1,
                end_s=0.9,
                requests_inside=2,
                excluded_ramp=14,
                excluded_tail=16,
                minimum_met=False,
                warning="the steady-state window held 2 requests over 0.8 s, short of min_requests 16 / "
                "min_duration_s 0: the level ran out of planned requests (or reached duration_s) first; raise "
                "requests_per_slot or lower the minimums",
            ),
        }
    )
    table = report.summary_table({"c16": summary})
    assert "2.42 (tok/s: 4.40)" in table  # never one rate printed as if steady
    warnings = report.run_warnings("", summary, more_requests="--num-requests")
    assert any(w.endswith("reached duration_s) first; raise --num-requests") for w in warnings), warnings
    assert not any("requests_per_slot" in w for w in warnings)
    assert any("is 4.40 req/s: too few requests" in w for w in warnings)
    # n=2 supports a P50 only: the P99 column shows it, named.
    assert "P50 50.00 (n=2; P99 needs ≥100)" in table


def test_the_slo_says_it_is_judged_on_the_sample_maximum_where_runs_support_no_p99(tmp_path: Path) -> None:
    runs = {"a": {4: [100.0, 101.0, 99.0]}, "b": {4: [100.0, 100.5, 99.5]}}
    small = verdict_planted.campaign(tmp_path / "small", runs, samples=24)
    text = report.verdict_section(small)
    assert "6 of 6 runs measured fewer than 100 requests" in text and "judged on the sample maximum" in text
    big = verdict_planted.campaign(tmp_path / "big", runs, samples=200)
    assert "sample maximum" not in report.verdict_section(big)
    # The figures table shows what 24 requests a run do support, named, in place of the P99.
    table = report.confidence_table(small)
    p99 = table["TTFT P99 ms"].iloc[0]
    assert p99.startswith("P50 50.0 [") and p99.endswith("P99 needs ≥100 per run"), p99


def test_the_diagnosis_cites_the_same_level_means_as_the_findings() -> None:
    # Two repeats at 16 (800 and 1000 tok/s): 9.0x from the means, as Findings says, not 8x or 10x.
    levels = planted.bandwidth_bound()
    top = levels[-1]
    levels.append(Level(16, 1000.0, top.ttft_p50_ms, top.ttft_p99_ms, top.tpot_p50_ms, top.series, 2))
    found = classify("a", "sweep", levels, efficiency=0.8)
    assert "throughput grew 9.0x for 16x concurrency" in found.evidence


def test_request_class_tables_apply_the_support_rule(tmp_path: Path) -> None:
    # 24 long-prompt requests: their P99 is no P99; the table shows the P90 they support, named.
    folder = verdict_planted.campaign(tmp_path / "c", {"a": {4: [100.0]}})
    path = folder / "cells" / "a__sweep" / "runs" / "c4" / "summary.json"
    summary = read_summary(path)
    long = Latency(ttft_ms=Stat(n=24, mean=300.0, p50=290.0, p90=400.0, p99=700.0), tpot_ms=Stat(n=24, p50=9.0))
    short = Latency(ttft_ms=Stat(n=200, p50=40.0, p90=60.0, p99=90.0))
    write_summary(path, summary.model_copy(update={"by_group": {"long": long, "short": short}}))
    table = report.group_table(folder).set_index("class")
    assert table.loc["long", "TTFT P99 ms"] == "P90 400.00 (n=24; P99 needs ≥100)"
    assert table.loc["short", "TTFT P99 ms"] == 90.0  # 200 requests support it


def test_a_flattened_sweep_is_said_to_buy_latency_only_where_tpot_rose(tmp_path: Path, small_model: Path) -> None:
    flat = [Level(1, 100.0, 20.0, 25.0, 10.0, None, 2), Level(8, 200.0, 30.0, 40.0, 10.0, None, 2)]
    rising = [Level(1, 100.0, 20.0, 25.0, 10.0, None, 2), Level(8, 200.0, 30.0, 40.0, 40.0, None, 2)]
    cells = {"flat": ("vllm-cpu", {}, flat), "rising": ("vllm-cpu", {}, rising)}
    findings = report.diagnose(report.results_frame(planted.campaign_folder(tmp_path / "f", small_model, cells)))
    (held,) = [n for n in findings if n.startswith("flat /")]
    (rose,) = [n for n in findings if n.startswith("rising /")]
    assert "TPOT P50 rose 1.0x — throughput stopped scaling" in held and "bought latency" not in held
    assert "TPOT P50 rose 4.0x — more concurrency bought latency, not throughput" in rose
