"""The optimization ladder's keep/rollback logic and waterfall, on planted cells (known values)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from bakeoff.campaign.ladder import LadderSpec, StepOutcome, decide, outcome_of
from bakeoff.campaign.specs import load_campaign
from bakeoff.errors import SpecError
from bakeoff.results.layout import load_cells
from bakeoff.results.store import read_json
from history_planted import campaign_folder, summary
from ladder_planted import run_planted_ladder

SPEC = LadderSpec.model_validate(
    {"steps": [{"name": "x", "knobs": {"quantization": "q8_0"}}], "max_exact_drop": 0.05, "min_word_agreement": 0.5}
)


def _answers(n: int, drifted: int) -> dict[str, str]:
    """``n`` greedy outputs of four words, the first ``drifted`` of them different from the first word on."""
    return {f"i{k}": ("other words entirely here" if k < drifted else "the capital is Fibi") for k in range(n)}


def _outcome(label: str, tok_s: float, exact: float | None, drifted: int = 0, ran: bool = True) -> StepOutcome:
    return StepOutcome(label, {"step": label}, ran, output_tok_s=tok_s, exact=exact, answers=_answers(10, drifted))


def test_a_step_within_the_bound_is_kept_with_its_speedup() -> None:
    decision = decide(SPEC, _outcome("bf16", 100.0, 0.60), _outcome("int8", 150.0, 0.58, drifted=2))
    assert decision.kept and decision.reasons == []
    assert decision.speedup == pytest.approx(1.5)
    assert decision.exact_change == pytest.approx(-0.02)
    assert decision.word_agreement == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        (_outcome("int4", 200.0, 0.50), "exact-answer rate fell 10.0%"),
        (_outcome("int4", 200.0, 0.60, drifted=6), "word agreement with bf16 40.0%"),
        (_outcome("int4", 200.0, None), "no exact-answer rate"),
        (_outcome("int4", 0.0, None, ran=False), "did not run"),
        (_outcome("int4", 80.0, 0.60), "output tok/s -20.0% against bf16 (bound -5%)"),
    ],
)
def test_a_step_that_breaks_the_bound_is_rolled_back(step: StepOutcome, reason: str) -> None:
    decision = decide(SPEC, _outcome("bf16", 100.0, 0.60), step)
    assert not decision.kept
    assert any(reason in r for r in decision.reasons), decision.reasons


def test_a_step_that_raises_perplexity_past_the_bound_is_rolled_back_where_both_were_scored() -> None:
    base = replace(_outcome("bf16", 100.0, 0.60), perplexity=3.00)
    worse = decide(SPEC, base, replace(_outcome("int4", 150.0, 0.60), perplexity=3.30))  # +10%, bound 5%
    assert not worse.kept and worse.reasons == ["perplexity rose 10.0% (bound 5.0%)"]
    assert worse.perplexity_change == pytest.approx(0.10)
    assert decide(SPEC, base, replace(_outcome("int4", 150.0, 0.60), perplexity=3.09)).kept  # +3%
    # llama.cpp returns no prompt logprobs: an unscored step is judged on the other bounds alone.
    unscored = decide(SPEC, base, _outcome("int4", 150.0, 0.60))
    assert unscored.kept and unscored.perplexity_change is None


def test_a_slower_step_is_kept_only_where_the_campaign_says_speed_may_fall() -> None:
    slower = _outcome("kv8", 97.0, 0.60)  # 3% slower: within one repeat's noise
    assert decide(SPEC, _outcome("bf16", 100.0, 0.60), slower).kept
    for_memory = SPEC.model_copy(update={"min_speedup": None})
    assert decide(for_memory, _outcome("bf16", 100.0, 0.60), _outcome("kv8", 60.0, 0.60)).kept


def test_the_ladder_continues_from_the_last_kept_step(tmp_path: Path, tiny_model: Path) -> None:
    """``campaign run`` on a ladder, its cells planted (tests/ladder_planted.py): each step runs with
    the last kept step's knobs and its own, and is judged against that step."""
    steps = [
        {"name": "int8", "knobs": {"quantization": "q8_0"}},  # 150 tok/s: kept
        {"name": "int4", "knobs": {"quantization": "q4_0"}},  # 210 but exact falls 20 pts: rolled back
        {"name": "kv8", "knobs": {"kv_cache_dtype": "q8_0"}},  # on int8: 135, 10% slower: rolled back
        {"name": "seqs", "knobs": {"max_num_seqs": 8}},  # on int8 (not kv8): 165: kept
        {"name": "spec", "knobs": {"speculative": "ngram"}},  # its cell fails: rolled back
    ]
    out, measured, reports = run_planted_ladder(tmp_path, tiny_model, {"steps": steps})
    assert measured == [
        {},
        {"quantization": "q8_0"},
        {"quantization": "q4_0"},
        {"quantization": "q8_0", "kv_cache_dtype": "q8_0"},
        {"quantization": "q8_0", "max_num_seqs": 8},
        {"quantization": "q8_0", "max_num_seqs": 8, "speculative": "ngram"},
    ]
    stored = read_json(out / "ladder.json")
    decided = [(s["decision"]["step"], s["decision"]["kept"], s["decision"]["against"]) for s in stored["steps"]]
    assert decided == [
        ("int8", True, "bf16"),
        ("int4", False, "int8"),
        ("kv8", False, "int8"),
        ("seqs", True, "int8"),
        ("spec", False, "seqs"),
    ]
    reasons = {s["decision"]["step"]: s["decision"]["reasons"] for s in stored["steps"]}
    assert reasons["int4"] == ["exact-answer rate fell 20.0% (bound 5.0%)"]
    assert reasons["kv8"] == ["output tok/s -10.0% against int8 (bound -5%)"]
    assert reasons["spec"] == ["the step did not run (see its cell)"]
    assert stored["final"]["chain"] == ["bf16", "int8", "seqs"]
    assert "answers" not in stored["baseline"]
    text = (out / "ladder.md").read_text()
    assert "| int4 | rolled back | int8 | 210.0 | +40.0 |" in text  # against int8's 150 tok/s
    assert "| seqs | kept | int8 | 165.0 | +10.0 |" in text
    assert "`bf16` → `int8` → `seqs`" in text and "**Rolled back:** `int4`, `kv8`, `spec`" in text
    assert "+65% output tok/s against the baseline" in text
    # Every step is one more server of a plain campaign beside the ladder's folder, and one report at the end.
    derived = load_campaign(out / "ladder-campaign.yaml")
    assert derived.ladder is None and [s.label for s in derived.servers] == [
        "bf16",
        "int8",
        "int4",
        "kv8",
        "seqs",
        "spec",
    ]
    assert reports == [out]


def test_an_outcome_reads_the_cells_and_quality_of_a_campaign_folder(tmp_path: Path) -> None:
    runs = {"int8": [summary(10.0, 120.0, repeat=1), summary(12.0, 100.0, repeat=2)]}
    quality = {"int8": {"exact": 0.55}}
    folder = campaign_folder(tmp_path / "c", runs, quality=quality)
    cells = [c for c in load_cells(folder) if c.label == "int8"]
    scores: dict[str, Any] = read_json(cells[0].dir / "quality.json")
    scores["exact_by_group"] = {"trained-phrasing": 0.7}
    scores["answers"] = [{"id": "a", "output": "Fibi", "error": None}, {"id": "b", "output": "", "error": "x"}]
    outcome = outcome_of("int8", {"quantization": "q8_0"}, cells, scores)
    assert outcome.ran and outcome.output_tok_s == pytest.approx(110.0)  # the two repeats' mean
    assert outcome.tpot_ms_p50 == pytest.approx(11.0)
    assert outcome.exact == 0.55 and outcome.exact_by_group == {"trained-phrasing": 0.7}
    assert outcome.answers == {"a": "Fibi"}  # failed requests give no output to compare
    assert not outcome_of("int8", {}, [], None).ran


def _campaign(tmp_path: Path, **extra: Any) -> Path:
    body = {
        "name": "l",
        "model": {"preset": "trained", "draft_path": "trained-draft"},
        "servers": [{"backend": "llamacpp", "label": "bf16"}],
        "workloads": [{"kind": "concurrency", "name": "w", "levels": [1], "input_len": 8, "output_len": 8}],
        "quality": {"prompts": "trained", "endpoint": "completions"},
        "ladder": {"steps": [{"name": "int8", "knobs": {"quantization": "q8_0"}}]},
        **extra,
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_a_ladder_needs_one_baseline_server_and_quality(tmp_path: Path) -> None:
    spec = load_campaign(_campaign(tmp_path))
    assert spec.ladder is not None and spec.model.draft_path is not None
    assert spec.model.draft_path.name == "trained-draft" and spec.model.draft_path.is_absolute()
    two = [{"backend": "llamacpp", "label": "a"}, {"backend": "llamacpp", "label": "b"}]
    with pytest.raises(SpecError, match="only its baseline"):
        load_campaign(_campaign(tmp_path, servers=two))
    with pytest.raises(SpecError, match="add a quality section"):
        load_campaign(_campaign(tmp_path, quality=None))
    with pytest.raises(SpecError, match="must be unique"):
        steps = [{"name": "a", "knobs": {"max_num_seqs": 2}}, {"name": "a", "knobs": {"max_num_seqs": 3}}]
        load_campaign(_campaign(tmp_path, ladder={"steps": steps}))


def test_a_ladder_steps_knobs_are_checked_before_anything_runs(tmp_path: Path) -> None:
    from bakeoff.campaign.cells import expand

    bad = {
        "steps": [{"name": "ok", "knobs": {"quantization": "q8_0"}}, {"name": "bad", "knobs": {"quantization": "awq"}}]
    }
    with pytest.raises(SpecError, match=r"ladder.steps\[1\] \(bad\).*choose one of"):
        expand(load_campaign(_campaign(tmp_path, ladder=bad)), None)


def test_the_shipped_ladder_campaign_validates() -> None:
    from bakeoff.campaign.cells import expand
    from bakeoff.paths import shipped

    spec = load_campaign(shipped("campaigns") / "cpu-ladder.yaml")
    assert spec.ladder is not None
    cells = expand(spec, None)
    assert {c.server.label for c in cells} == {spec.servers[0].label}
