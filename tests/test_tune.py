"""``bakeoff tune`` on a planted surface: the reference server's load model answers to knobs.

The backend below is the reference server (vLLM wire profile) with its planted load model
(:mod:`bakeoff.ref.batching`) wired to bakeoff knobs: ``max_num_seqs`` is its slot count (TTFT
queues below the concurrency), ``max_num_batched_tokens`` its token budget (small: many prefill
steps, large: slower decode steps, so the best budget is inside the range), and
``quantization: int4`` is a planted broken configuration: faster decode, garbled answers.
The figures are never compared with millisecond expectations, only with each other.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
import yaml

from bakeoff.analysis.tune_compare import NO_SLO_MET, compare_goodput
from bakeoff.backends.knobs import broken_constraints
from bakeoff.backends.spec import load_backend
from bakeoff.backends.tune_space import COST_ORDER, TuneSpace, ordered, stage_of
from bakeoff.campaign import tune as tuning
from bakeoff.campaign.campaign_input import load_input
from bakeoff.campaign.cell_spec import read_cell_spec
from bakeoff.campaign.cells import prepare
from bakeoff.campaign.specs import load_campaign
from bakeoff.campaign.tune import STUDY_FILE, Candidate, cross_verdict, pick, resolve_groups, tune_campaign
from bakeoff.campaign.tune import folder as tune_folder
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.errors import SpecError
from bakeoff.report import tune_report
from bakeoff.report.tune_report import NOT_JUDGED
from bakeoff.results.layout import REHEARSAL_BANNER, REHEARSAL_TAG
from bakeoff.results.store import read_json, read_summary
from polling import poll_until

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 4
KNOBS = ["max_num_seqs", "max_num_batched_tokens"]
QUALITY = [
    {"id": "capital", "kind": "exact", "prompt": "Capital of France?", "answer": "Paris is it", "max_tokens": 8},
    {"id": "colour", "kind": "exact", "prompt": "Colour of the sky?", "answer": "the sky is blue", "max_tokens": 8},
]


def backend_yaml(canned: Path) -> str:
    return f"""\
name: refplant
display_name: reference server with a planted load model (test)
runtime: process
accelerator: cpu
command: ["{{python}}", "-m", "bakeoff.ref.server", "--port", "{{port}}", "--model", "{{served_model_name}}",
          "--profile", "vllm", "--canned", "{canned}", "--ttft-ms", "5", "--itl-ms", "3",
          "--itl-per-running-ms", "1", "--prefill-step-ms", "6", "--itl-per-budget-token-ms", "0.04"]
health: {{path: /health, timeout_s: 20, interval_s: 0.05}}
cache_reset: {{kind: none}}
metrics:
  names: {{running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting"}}
knobs:
  max_num_seqs: {{type: int, default: 1, flag: --slots, minimum: 1}}
  max_num_batched_tokens: {{type: int, default: 4, flag: --token-budget, minimum: 1}}
  quantization:
    type: str
    default: none
    flag: --itl-ms
    choices: [none, int4]
    value_map: {{none: null, int4: ["1", "--garble"]}}
tune:
  knobs:
    max_num_seqs: {{low: 1, high: 16, log: true}}
    max_num_batched_tokens: {{low: 2, high: 1024, log: true}}
    quantization: {{choices: [none, int4]}}
"""


def campaign_yaml(model: Path, quality: Path, tune: dict[str, Any], slo: dict[str, float] | None = None) -> str:
    raw = {
        "name": "planted",
        "model": {"path": str(model), "served_name": "m"},
        "servers": [{"backend": "refplant", "label": "ref", "knobs": {"max_num_seqs": 1, "max_num_batched_tokens": 4}}],
        "workloads": [
            {"kind": "concurrency", "name": "chat", "levels": [CONCURRENCY], "requests_per_level": 3 * CONCURRENCY,
             "warmup_requests": 0, "input_len": 96, "output_len": 10}
        ],
        "slo": slo or {"ttft_ms": 2000},
        "measure_warm_restart": False,
        "repeats": 1,
        "quality": {"prompts": str(quality), "concurrency": 2},
        "tune": tune,
    }  # fmt: skip
    return yaml.safe_dump(raw, sort_keys=False)


@pytest.fixture
def planted(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    canned = tmp_path / "canned.json"
    canned.write_text(json.dumps({q["prompt"]: q["answer"] for q in QUALITY}))
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "refplant.yaml").write_text(backend_yaml(canned))
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUALITY))
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(tmp_path / "backends"))
    yield tmp_path


def write_campaign(root: Path, model: Path, slo: dict[str, float] | None = None, **tune: Any) -> Path:
    path = root / "c.yaml"
    path.write_text(campaign_yaml(model, root / "q.jsonl", tune, slo))
    return path


def test_the_tuner_finds_the_planted_optimum_and_rejects_the_broken_region(planted: Path, tiny_model: Path) -> None:
    path = write_campaign(planted, tiny_model, trials=10, finalists=2, repeats=2, seed=3)
    report = tune_campaign(path, out_dir=planted / "out")
    result = read_json(planted / "out" / "tune.json")
    (group,) = result["groups"]
    trials = group["trials"]
    assert len(trials) == 10
    assert any(t["state"] == "pruned" for t in trials)  # the worst quarter of the probes stopped early
    # Every garbled (int4) trial that ran to the end failed the quality gate, and none was a finalist.
    broken = [t for t in trials if t["knobs"]["quantization"] == "int4" and t["state"] in ("rejected", "complete")]
    assert broken and all(t["state"] == "rejected" for t in broken)
    assert all(c["knobs"]["quantization"] == "none" for c in group["finalists"])
    # The pick is in the planted optimum's neighbourhood: slots for (about) the whole concurrency
    # (one slot short costs ~15% here, which noise on a busy machine can hide), a budget between the extremes.
    # No millisecond is asserted: each bound is one-sided against a planted cost many times the noise
    # (below 8 tokens the 96-token prompt takes 12+ prefill steps of 6 ms; above 256 each decode step
    # gains 10+ ms on 3; one slot queues four requests), and the pick measured 6x the untuned start here.
    chosen = group["chosen"]
    assert chosen["trial"] is not None, group["vs_untuned"]
    assert chosen["knobs"]["max_num_seqs"] >= CONCURRENCY - 1, group["finalists"]
    assert 8 <= chosen["knobs"]["max_num_batched_tokens"] <= 256, group["finalists"]
    # ... measured better than the untuned start (one slot, a tiny budget) by the comparison test.
    assert group["vs_untuned"]["outcome"] == "win"
    assert chosen["mean"] > 1.5 * group["untuned"]["mean"]
    # The report, the trial table, the plots and a re-runnable campaign of the pick.
    text = report.read_text()
    assert "Rejected by the quality gate" in text and "tuned vs tuned" in text and "as given" in text
    # The untuned start heads the trial table, with the knobs it ran and its own figure (the pick beat it).
    start = group["untuned_trial"]
    assert (
        start["state"] == "untuned"
        and start["knobs"]["max_num_seqs"] == 1
        and start["knobs"]["quantization"] == ("none (default)")
    )
    assert 0 < start["figures"]["figure"] < chosen["mean"]
    assert "| untuned | 1 | 4 | none (default) |" in text
    rows = (planted / "out" / "trials.csv").read_text().splitlines()
    assert rows[1].startswith("ref,untuned,ref,untuned,") and len(rows) == 1 + 1 + len(trials)
    for name in ("trials.csv", "trace.png", "pareto.png"):
        assert (planted / "out" / name).stat().st_size > 0
    best = load_campaign(planted / "out" / "best" / "ref.yaml")
    assert best.servers[0].knobs == chosen["knobs"] and best.tune is None


def test_where_no_trial_meets_the_slo_the_search_follows_the_miss_and_says_so(planted: Path, tiny_model: Path) -> None:
    # Bounds no configuration meets (the planted TTFT alone is 5 ms, a decode gap 3 ms): goodput is
    # 0 everywhere. The miss (worst median against its bound) is smallest where the goodput optimum
    # is: slots for the whole concurrency (else TTFT queues), a budget inside the range (small:
    # many prefill steps; large: slow decode steps).
    unreachable = {"ttft_ms": 2, "tpot_ms": 1}
    path = write_campaign(
        planted, tiny_model, unreachable, trials=5, finalists=1, repeats=3, seed=3, prune=False, only=KNOBS
    )
    raw = yaml.safe_load(path.read_text())
    del raw["quality"]  # no trial is rejected here: the quality set would only cost time
    path.write_text(yaml.safe_dump(raw))
    report = tune_campaign(path, out_dir=planted / "out")
    result = read_json(planted / "out" / "tune.json")
    (group,) = result["groups"]
    done = [t for t in group["trials"] if t["state"] == "complete"]
    assert len(done) == 5 and all(t["figures"]["figure"] == 0 and t["figures"]["slo_miss"] > 1 for t in done)
    # The search was told the miss, not a row of zeros: below any goodput, higher the smaller the miss.
    by_value = sorted(done, key=lambda t: t["values"][0], reverse=True)
    assert all(-1 < t["values"][0] < 0 for t in done)
    assert [t["figures"]["slo_miss"] for t in by_value] == sorted(t["figures"]["slo_miss"] for t in done)
    # The finalist is the closest trial, and it is in the planted optimum's neighbourhood.
    assert [c["trial"] for c in group["finalists"]] == [by_value[0]["number"]]
    chosen = group["chosen"]
    assert chosen["trial"] is not None, group["vs_untuned"]
    assert chosen["knobs"]["max_num_seqs"] >= CONCURRENCY - 1, group["finalists"]
    # Five trials place the budget less closely than the goodput search's ten: away from both ends of 2..1024.
    assert 8 <= chosen["knobs"]["max_num_batched_tokens"] <= 512, group["finalists"]
    # The pick was decided on the miss (the untuned start queues behind one slot), and says so. Three
    # repeats: with two a side, one noisy repeat of the queued start (a busy host) leaves the test undecided.
    vs = group["vs_untuned"]
    assert vs["basis"] == "slo_miss" and vs["outcome"] == "win" and vs["change"] < 0, vs["text"]
    assert vs["text"].startswith(NO_SLO_MET)
    assert group["nothing_met"]["trial"] == by_value[0]["number"]
    text = report.read_text()
    head = text.split("## Verdicts")[0]
    assert "No configuration met the SLO at this load" in head and "`tune.load:`" in head
    assert f"closest in ref: trial {by_value[0]['number']}" in head
    assert "| no: SLO missed by " in text  # the trial table's SLO column
    header, first = (planted / "out" / "trials.csv").read_text().splitlines()[:2]
    assert "slo_miss" in header.split(",") and "SLO missed by" in first  # the untuned start's row


def test_goodput_zeros_compare_by_the_slo_miss_on_both_sides_and_by_how_often_it_was_reached_on_one() -> None:
    # Both sides never met the SLO: the miss decides (lower is better), and the sentence says so.
    both = compare_goodput([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.1, 1.9], [6.8, 7.0, 7.2])
    assert both.basis == "slo_miss" and both.outcome == "win" and both.ratio is not None and both.ratio < 0.5
    assert both.text.startswith(NO_SLO_MET)
    assert compare_goodput([0.0] * 3, [0.0] * 3, [7.0, 7.1, 6.9], [2.0, 2.1, 1.9]).outcome == "loss"
    # One side reached the SLO and the other did not: decided on how often (Fisher's exact test), no ratio of 0.
    # 3 of 3 against 0 of 3 is p = 0.1, not enough; 4 of 4 against 0 of 4 is p = 0.029.
    one = compare_goodput([1.2, 1.3, 1.1], [0.0, 0.0, 0.0], [0.9, 0.9, 0.8], [7.0, 7.1, 6.9])
    assert one.basis == "figure" and one.outcome == "undecided" and one.ratio is None
    assert "3 of 3 repeats against 0 of 3" in one.text and "p = 0.1" in one.text
    four = compare_goodput([1.2, 1.3, 1.1, 1.2], [0.0] * 4, [0.9] * 4, [7.0] * 4)
    assert four.basis == "slo_reached" and four.outcome == "win" and four.ratio is None, four.text
    assert compare_goodput([0.0] * 4, [1.2, 1.3, 1.1, 1.2], [7.0] * 4, [0.9] * 4).outcome == "loss"
    assert compare_goodput([0.0, 0.5], [0.4, 0.5], [1.1, 0.9], [0.9, 0.9]).outcome == "undecided"
    # Goodput on both sides: the usual test.
    assert compare_goodput([2.0, 2.1, 2.0], [1.0, 1.1, 1.0], [], []).outcome == "win"


def test_the_pick_and_the_verdicts_fall_back_to_the_miss_where_nothing_met_the_slo() -> None:
    tune = TuneSpec(finalists=2, repeats=3)

    def zero(label: str, trial: int | None, misses: list[float]) -> Candidate:
        return Candidate(label, {"max_num_seqs": trial or 1}, trial, values=[0.0] * 3, misses=misses)

    untuned = zero("a", None, [7.0, 7.2, 6.9])
    near, far = zero("a-near", 1, [2.0, 2.1, 1.9]), zero("a-far", 2, [4.0, 4.2, 3.9])
    chosen = pick("a", untuned, [far, near], tune)  # listed worst first: the ranking must see the miss
    assert chosen.chosen is near and chosen.finalists[0] is near
    assert chosen.vs_untuned is not None and chosen.vs_untuned.basis == "slo_miss"
    assert chosen.vs_untuned.outcome == "win" and chosen.vs_untuned.text.startswith(NO_SLO_MET)
    assert chosen.vs_runner_up is not None and chosen.vs_runner_up.basis == "slo_miss"
    other = pick("b", zero("b", None, [5.0, 5.1, 4.9]), [], tune)
    verdict = cross_verdict([other, chosen], tuned=True, min_effect=tune.min_effect)
    assert verdict["best"] == "a" and verdict["miss"] == pytest.approx(2.0)
    (against,) = verdict["against"]
    assert against["basis"] == "slo_miss" and against["outcome"] == "win" and NO_SLO_MET in against["text"]
    assert cross_verdict([other, chosen], tuned=False, min_effect=tune.min_effect)["best"] == "b"
    # One group met the SLO, the other never did: ranked first on goodput, and no win claimed on a ratio of 0.
    met = Candidate("c", {}, None, values=[1.0, 1.1, 0.9], misses=[0.8, 0.8, 0.9])
    mixed = cross_verdict([chosen, pick("c", met, [], tune)], tuned=True, min_effect=tune.min_effect)
    assert mixed["best"] == "c" and mixed["against"][0]["outcome"] == "undecided"
    assert mixed["against"][0]["basis"] == "figure"


def test_the_best_finalist_is_judged_at_the_level_of_the_family_it_was_chosen_from() -> None:
    # Welch p = 0.007 for the best finalist against the untuned start: a win as the only finalist,
    # not among five (chosen as the best of five, it is held to 5% / 15 pairs).
    untuned = Candidate("a", {}, None, values=[100.0, 104.0, 97.0])
    best = Candidate("a-1", {"max_num_seqs": 8}, 1, values=[114.0, 118.0, 112.0])
    alone = pick("a", untuned, [best], TuneSpec(finalists=1, repeats=3))
    assert alone.vs_untuned is not None and alone.vs_untuned.outcome == "win"
    assert "Bonferroni" not in alone.vs_untuned.text
    others = [Candidate(f"a-{i}", {"max_num_seqs": i}, i, values=[100.0 + i, 103.0, 98.0]) for i in range(2, 6)]
    chosen = pick("a", untuned, [best, *others], TuneSpec(finalists=5, repeats=3))
    assert chosen.chosen is untuned and chosen.vs_untuned is not None
    assert (
        chosen.vs_untuned.outcome == "undecided"
        and "5% family-wise, Bonferroni over 15 pairs" in chosen.vs_untuned.text
    )


def finished_cells(out: Path) -> dict[str, int]:
    """Cell folder -> its cell.json's mtime, for every cell measured to the end."""
    found = {}
    for info in (out / "cells").glob("*/cell.json"):
        with contextlib.suppress(ValueError, OSError):  # a cell.json being replaced
            if read_json(info).get("status") == "ok":
                found[info.parent.name] = info.stat().st_mtime_ns
    return found


def server_mid_cell(proc: subprocess.Popen[str], out: Path) -> str | None:
    """The cell under way, if any: a reference server runs in the folder of a cell not finished yet."""
    done = finished_cells(out)
    for child in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "bakeoff.ref.server" in " ".join(child.cmdline()):
                cwd = Path(child.cwd())
                if cwd.parent == out / "cells" and cwd.name not in done:
                    return cwd.name
    return None


def study_states(out: Path) -> list[optuna.trial.TrialState]:
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(out / STUDY_FILE)))
    return [t.state for t in optuna.load_study(study_name="ref", storage=storage).get_trials()]


def test_ctrl_c_mid_trial_keeps_finished_trials_leaves_nothing_and_the_tune_resumes(
    planted: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C to a real ``bakeoff tune`` once a trial's server is up: it exits 130 with every
    finished trial kept and nothing left running; the same command then measures only the rest."""
    path = write_campaign(planted, tiny_model, trials=4, finalists=1, repeats=2, seed=1, prune=False)
    out = planted / "out"
    log = (planted / "tune.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bakeoff", "tune", str(path), "--out", str(out)],
        stdout=log, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # The untuned start and the first trial measured, and the next trial's server running.
        underway = poll_until(
            lambda: len(finished_cells(out)) >= 2 and server_mid_cell(proc, out), 120, "a trial under way"
        )
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        kept = finished_cells(out)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    said = (planted / "tune.log").read_text()
    assert proc.returncode == 130, said
    assert "interrupted: finished trials are kept in" in said, said
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    assert finished_cells(out) == kept  # nothing finished was lost or touched
    states = study_states(out)
    assert optuna.trial.TrialState.RUNNING not in states
    assert states.count(optuna.trial.TrialState.FAIL) == 1  # the interrupted trial, queued to be measured again
    assert states.count(optuna.trial.TrialState.COMPLETE) >= 1  # the first trial at least
    assert read_json(out / "cells" / underway / "cell.json")["status"] == "interrupted"

    real = tune_folder.run_cell  # the default runner's call, in the module that makes it
    measured: list[tuple[str, int]] = []  # (label, repeat) of each cell run

    def spied(handed: Path, **k: Any) -> object:
        cell = read_cell_spec(handed)
        measured.append((cell.server.label, cell.repeat))
        return real(handed, **k)

    monkeypatch.setattr(tune_folder, "run_cell", spied)
    tune_campaign(path, out_dir=out)
    # Nothing finished was measured again: its cell.json is the same file, its (label, repeat) not run.
    assert {n: (out / "cells" / n / "cell.json").stat().st_mtime_ns for n in kept} == kept
    assert not {(n.split("__")[0], 1) for n in kept} & set(measured)
    assert (underway.split("__")[0], 1) in measured and underway in finished_cells(out)  # measured now
    states = study_states(out)
    assert states.count(optuna.trial.TrialState.COMPLETE) == 4
    assert states.count(optuna.trial.TrialState.FAIL) == 1


def test_spaces_are_checked_against_the_backend_before_anything_starts(planted: Path, tiny_model: Path) -> None:
    spec = load_campaign(write_campaign(planted, tiny_model, knobs={"max_num_seqs": {"low": 0, "high": 8}}))
    with pytest.raises(SpecError, match=r"tune .*knobs.max_num_seqs: .*below the minimum.*narrow the range"):
        resolve_groups(spec, spec.tune)  # type: ignore[arg-type]
    spec = load_campaign(write_campaign(planted, tiny_model, only=["threads"]))
    with pytest.raises(SpecError, match="no server's backend maps threads"):
        resolve_groups(spec, spec.tune)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"tune.load: 3 is not a load of 'chat'"):
        load_campaign(write_campaign(planted, tiny_model, load=3))
    with pytest.raises(SpecError, match=r"tune\.knobs\.max_num_seqs: a range needs both low and high"):
        load_campaign(write_campaign(planted, tiny_model, knobs={"max_num_seqs": {"low": 1}}))


def test_shipped_spaces_follow_the_cost_order_and_their_constraints_bind() -> None:
    vllm = load_backend("vllm-cpu")
    assert vllm.tune is not None
    stages = [stage_of(k) for k in ordered(vllm.tune)]
    assert stages == sorted(stages, key=lambda s: (*COST_ORDER, "other").index(s))
    assert stages[0] == "caps"
    space = TuneSpace.model_validate(vllm.tune.model_dump())
    unchunked = {"chunked_prefill": False, "max_model_len": 2048, "max_num_batched_tokens": 512}
    assert broken_constraints(space, vllm, unchunked)
    assert not broken_constraints(space, vllm, {**unchunked, "chunked_prefill": True})
    assert not broken_constraints(space, vllm, {**unchunked, "max_num_batched_tokens": 4096})


def test_the_cli_names_a_bad_tune_section(planted: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bakeoff.cli.main import main

    path = write_campaign(planted, tiny_model, objective="fastest")
    assert main(["tune", str(path)]) == 2
    assert "tune.objective" in capsys.readouterr().err


def test_a_pareto_tune_keeps_both_figures(planted: Path, tiny_model: Path) -> None:
    path = write_campaign(planted, tiny_model, objective="pareto", trials=3, finalists=1, repeats=2, seed=5)
    tune_campaign(path, out_dir=planted / "out")
    result = read_json(planted / "out" / "tune.json")
    assert result["figure"] == "tok_s_per_gpu" and result["budget"]["prune"] is False
    (group,) = result["groups"]
    done = [t for t in group["trials"] if t["state"] in ("complete", "rejected")]
    assert done and all(len(t["values"]) == 2 for t in done)
    assert all(t["figures"]["tok_s_per_user"] > 0 and t["figures"]["tok_s_per_gpu"] > 0 for t in done)
    assert len(group["finalists"]) <= 1 and len(group["untuned"]["values"]) == 2


def test_a_trial_the_campaign_cannot_run_is_refused_before_it_is_written(planted: Path, tiny_model: Path) -> None:
    from bakeoff.campaign.tune import _add_server

    out = planted / "out"
    path = write_campaign(planted, tiny_model)
    spec = load_campaign(path)
    assert spec.tune is not None
    full, probe = tuning.trial_workloads(spec.workloads[0], 4, spec.tune)
    out.mkdir()
    source = out / "src.yaml"
    source.write_text(yaml.safe_dump(tuning._source_campaign(spec, full, probe, spec.tune)))
    prepare(source, out)
    before = (out / "campaign.yaml").read_text()
    bad = {"backend": "refplant", "label": "ref-bad", "knobs": {"max_num_seqs": 0}}
    with pytest.raises(SpecError, match="max_num_seqs"):
        _add_server(out, bad)
    assert (out / "campaign.yaml").read_text() == before


def test_a_rehearsed_gpu_tune_runs_end_to_end_tagged_and_claims_nothing(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The shipped GPU campaign, two of its frameworks at concurrency 1: the rehearsal's own scaling does the rest.
    raw = yaml.safe_load((REPO / "campaigns" / "gpu-7b-three-frameworks.yaml").read_text())
    raw["servers"] = raw["servers"][:2]
    raw["tune"].update(load=1, trials=1, prune=False)
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    report = tune_campaign(load_input(path, rehearse=True), out_dir=out)
    result = read_json(out / "tune.json")
    assert result["rehearsal"]["source_campaign"] == str(path) and "bakeoff tune" in result["rehearsal"]["gpu_host"]
    assert read_json(out / "rehearsal.json")["command"] == "tune"
    # Every measurement came from a stand-in and says so; the budget was the rehearsal's (2 repeats).
    summaries = [read_summary(p) for p in (out / "cells").glob("*/runs/*/summary.json")]
    assert len(summaries) == 2 * (1 + 1 + 2) and all(s.rehearsal for s in summaries)  # start, trial, repeats
    assert [g["group"] for g in result["groups"]] == ["vllm", "sglang"]
    assert all(len(g["chosen"]["values"]) == 2 and len(g["trials"]) == 1 for g in result["groups"])
    # Every line of progress and every section is tagged; no verdict or pick is presented as a finding.
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("tune ", REHEARSAL_TAG))]
    assert lines and all(line.startswith(REHEARSAL_TAG) for line in lines)
    text = report.read_text()
    assert text.startswith(f"# {REHEARSAL_TAG} Tune") and REHEARSAL_BANNER in text
    assert all(h.startswith(f"## {REHEARSAL_TAG}") for h in text.splitlines() if h.startswith("## "))
    assert re.search(rf"- tuned vs tuned \((vllm, sglang|sglang, vllm)\): {re.escape(NOT_JUDGED)}", text)
    assert text.count(NOT_JUDGED) >= 4  # both verdicts and both picks
    for claim in ("beats", "loses to", "matches", "is not told from", "**Pick"):
        assert claim not in text
    # ... yet the trial table (untuned start first), the plots and the winners' YAMLs are there.
    assert text.count("| untuned: the untuned start (repeat 1) |") == 2  # a trial-table row per group
    assert (out / "pareto.png").stat().st_size > 0 and (out / "trials.csv").is_file()
    best = out / "best" / "vllm.yaml"
    assert best.read_text().startswith(f"# {REHEARSAL_TAG}")
    assert load_campaign(best).servers[0].knobs == result["groups"][0]["chosen"]["knobs"]
    written = yaml.safe_load(best.read_text())  # for the GPU host: the original model and workloads
    assert written["model"]["path"] == "/models/llama-7b" and written["workloads"][0]["levels"] == [1, 8, 32, 128]


def test_a_verdict_with_no_ratio_shows_no_placeholder_for_one() -> None:
    against = {"group": "vllm", "outcome": "undecided", "change": None, "text": "undecided: within the SLO in 3 of 3"}
    result = {"tuned": {"best": "llamacpp", "against": [against]}}
    (line,) = tune_report._verdict_lines(result, "tuned", "tuned vs tuned")
    assert line == "- tuned vs tuned: llamacpp is not told from vllm (undecided: within the SLO in 3 of 3)", line
