"""Quality checks: planted answers through the reference server give the planted rates exactly."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from bakeoff.campaign.quality import (
    QUALITY_FILE,
    baseline_answers,
    check,
    gate,
    load_prompt_set,
    parse_json_answer,
    quality_settings,
    run_quality,
    score,
)
from bakeoff.errors import SpecError
from bakeoff.measure.client import ClientSettings
from bakeoff.report.tables import quality_table
from bakeoff.results.layout import QUALITY_RATES
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import read_json, write_json
from bakeoff.serving.reference import serve_reference

# id -> (item, planted answer). Two JSON answers are broken (one is not JSON, one is cut by
# max_tokens), one exact answer is wrong, one answer refuses, one free answer is cut short.
PLANTED: dict[str, tuple[dict[str, object], str]] = {
    "j1": ({"kind": "json", "required_keys": ["name", "age"], "max_tokens": 32}, '{"name": "Ada", "age": 36}'),
    "j2": (
        {"kind": "json", "required_keys": ["item"], "max_tokens": 32},
        '```json\n{"item": "pens", "quantity": 3}\n```',
    ),
    "j3": ({"kind": "json", "required_keys": ["city"], "max_tokens": 32}, "The city is Lyon."),
    "j4": ({"kind": "json", "required_keys": ["label"], "max_tokens": 3}, '{"label": "negative", "confidence": 0.9}'),
    "e1": ({"kind": "exact", "answer": "Paris", "max_tokens": 8}, "paris."),
    "e2": ({"kind": "exact", "answer": "42", "max_tokens": 8}, "42"),
    "e3": ({"kind": "exact", "answer": "INV-20931", "max_tokens": 8}, "I'm sorry, I can't help with that."),
    "f1": ({"kind": "free", "min_words": 3, "max_words": 10, "max_tokens": 40}, "Batching shares each weight read."),
    "f2": ({"kind": "free", "min_words": 5, "max_words": 50, "max_tokens": 4}, "one two three four five six seven"),
}


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A prompt set and the reference server's canned answers for it."""
    lines, canned = [], {}
    for item_id, (fields, answer) in PLANTED.items():
        prompt = f"question {item_id}: answer it"
        lines.append(orjson.dumps({"id": item_id, "prompt": prompt, **fields}).decode())
        canned[prompt] = answer
    prompts = tmp_path / "set.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    answers = tmp_path / "canned.json"
    answers.write_text(json.dumps(canned))
    return prompts, answers


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_planted_outputs_give_the_planted_rates(planted: tuple[Path, Path], tmp_path: Path, endpoint: str) -> None:
    prompts, canned = planted
    with serve_reference(ttft_ms=1, itl_ms=0, canned=canned, tokens_per_chunk=2) as url:
        settings = ClientSettings(url, "bakeoff-ref", extra_body={"ignore_eos": True}, min_tokens=True)
        result = run_quality(settings, str(prompts), concurrency=3, endpoint=endpoint, out=tmp_path / QUALITY_FILE)
    rates = result["rates"]
    assert (rates["items"], rates["answered"], rates["failed"]) == (9, 9, 0)
    assert rates["invalid_json"] == 2 / 4  # j3 is prose, j4 was cut after 3 tokens
    assert rates["truncated"] == 2 / 9  # j4 (cut before its JSON closed) and f2 (cut mid-text)
    assert rates["refused"] == 1 / 9
    assert rates["exact"] == 2 / 3
    assert rates["length_ok"] == 1 / 2
    assert rates["agreement"] is None  # no baseline named
    answers = {a["id"]: a for a in result["answers"]}
    assert answers["j1"]["output"] == '{"name": "Ada", "age": 36}' and answers["j1"]["finish_reason"] == "stop"
    assert answers["f2"]["output"] == "one two three four" and answers["f2"]["finish_reason"] == "length"
    assert read_json(tmp_path / QUALITY_FILE) == json.loads(orjson.dumps(result))


def test_agreement_is_the_share_of_identical_normalized_outputs(tmp_path: Path) -> None:
    answers = [
        {"id": "a", "kind": "free", "output": "Same  Text.", "error": None, "truncated": False, "refused": False,
         "length_ok": True, "valid_json": None, "exact": None},
        {"id": "b", "kind": "free", "output": "new", "error": None, "truncated": False, "refused": False,
         "length_ok": True, "valid_json": None, "exact": None},
        {"id": "c", "kind": "free", "output": "", "error": "connect"},
    ]  # fmt: skip
    rates = score(answers, baseline={"a": "same text", "b": "old", "c": "anything"})
    assert rates["agreement"] == 1 / 2 and rates["failed"] == 1
    # From a baseline campaign folder: the same cell's answers, else the same server's.
    write_json(tmp_path / "cells" / "srv__w1" / QUALITY_FILE, {"answers": answers})
    assert baseline_answers(tmp_path, "srv__w1", "srv") == {"a": "Same  Text.", "b": "new"}
    assert baseline_answers(tmp_path, "srv__other", "srv") == {"a": "Same  Text.", "b": "new"}
    assert baseline_answers(tmp_path, "x__w1", "x") is None
    assert baseline_answers(None, "srv__w1", "srv") is None


def test_random_text_is_scored_too_not_skipped() -> None:
    """A generated model's gibberish: every rate is computed, none left out."""
    items = [i for i in load_prompt_set("default") if i.kind != "perplexity"]  # scored, not asked
    record = RequestRecord(0, output_text=" w0 w1 w2 w3", finish_reason="length")
    answers = [check(item, record) for item in items]
    rates = score(answers)
    assert rates["invalid_json"] == 1.0 and rates["exact"] == 0.0 and rates["refused"] == 0.0
    assert rates["truncated"] == 1.0  # every answer ran into max_tokens without its expected end
    assert rates["length_ok"] == 0.0  # 4 words is below every free item's minimum


def test_the_shipped_set_has_every_kind() -> None:
    kinds = {item.kind for item in load_prompt_set("default")}
    assert kinds == {"json", "exact", "free", "perplexity"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "x", "kind": "exact", "prompt": "p"}', "needs 'answer'"),
        ('{"id": "x", "kind": "free", "prompt": "p"}', "'min_words' and/or 'max_words'"),
        ('{"id": "x", "kind": "json", "prompt": "p", "colour": 1}', "Extra inputs"),
        ("not json", "set.jsonl:1"),
    ],
)
def test_a_bad_prompt_set_is_refused_naming_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(SpecError, match=r"quality\.prompts") as caught:
        load_prompt_set(str(path))
    assert message in str(caught.value)


def test_missing_set_names_the_field() -> None:
    with pytest.raises(SpecError, match=r"quality.prompts: no prompt set .*nosuchset"):
        load_prompt_set("nosuchset")


def test_json_answers_may_sit_in_one_code_fence_but_must_hold_every_key() -> None:
    assert parse_json_answer('```json\n{"a": 1, "b": 2}\n```', ["a", "b"])
    assert not parse_json_answer('{"a": 1}', ["a", "b"])
    assert not parse_json_answer("[1, 2]", [])
    assert not parse_json_answer('{"a": 1', ["a"])


def test_quality_requests_let_the_model_stop() -> None:
    settings = ClientSettings("http://h:1", "m", extra_body={"ignore_eos": True, "top_k": 1}, min_tokens=True)
    free = quality_settings(settings)
    assert free.extra_body == {"top_k": 1} and free.min_tokens is False


def test_word_agreement_counts_leading_words_until_the_first_difference() -> None:
    from bakeoff.campaign.quality import word_agreement

    assert word_agreement("The capital of Duri is Fibi.", "the capital  of duri is fibi") == 1.0
    assert word_agreement("a b c d", "a b x d") == 2 / 4
    assert word_agreement("a b", "a b c d") == 2 / 4  # the longer output's words are the denominator
    assert word_agreement("x b c", "a b c") == 0.0  # drifting at once scores 0 whatever follows
    assert word_agreement("", "  ") == 1.0
    answers = [
        {"id": "a", "kind": "free", "output": "a b c d", "error": None, "truncated": False, "refused": False,
         "length_ok": True, "valid_json": None, "exact": None},
        {"id": "b", "kind": "free", "output": "a b", "error": None, "truncated": False, "refused": False,
         "length_ok": True, "valid_json": None, "exact": None},
    ]  # fmt: skip
    rates = score(answers, baseline={"a": "a b x d", "b": "a b"})
    assert rates["word_agreement"] == (0.5 + 1.0) / 2
    assert score(answers)["word_agreement"] is None


def test_exact_rates_per_group() -> None:
    from bakeoff.campaign.quality import QualityItem, exact_by_group

    items = [
        QualityItem(id="t1", kind="exact", prompt="q", answer="Fibi", group="trained-phrasing"),
        QualityItem(id="t2", kind="exact", prompt="q", answer="Sabela", group="trained-phrasing"),
        QualityItem(id="h1", kind="exact", prompt="q", answer="Fibi", group="held-out-phrasing"),
        QualityItem(id="h2", kind="exact", prompt="q", answer="Lofa", group="held-out-phrasing"),
        QualityItem(id="free", kind="free", prompt="q", max_words=9, group="continuation"),
    ]
    records = {
        "t1": RequestRecord(0, output_text=" Fibi", finish_reason="stop"),
        "t2": RequestRecord(1, output_text=" Sabela.", finish_reason="stop"),
        "h1": RequestRecord(2, output_text=" Duri", finish_reason="stop"),
        "h2": RequestRecord(3, error_kind="connect"),
        "free": RequestRecord(4, output_text="words", finish_reason="stop"),
    }
    answers = [check(item, records[item.id]) for item in items]
    by_group = exact_by_group(answers, items)
    # Failed requests are left out, never scored; free items have no exact rate.
    assert by_group == {"trained-phrasing": 1.0, "held-out-phrasing": 0.0}


def test_the_reports_quality_table_gives_perplexity_and_why_a_server_has_none(tmp_path: Path) -> None:
    rates = {"items": 4, "answered": 4, "failed": 0, **dict.fromkeys(QUALITY_RATES, 0.5)}
    scored = {"rates": {**rates, "perplexity": 3.15}, "perplexity": {"perplexity": 3.15, "why_not": None}}
    why = "llama.cpp does not return prompt logprobs (prompt_logprobs in its backend YAML)"
    unscored = {"rates": {**rates, "perplexity": None}, "perplexity": {"perplexity": None, "why_not": why}}
    for cell, result in (("vllm__sweep", scored), ("llamacpp__sweep", unscored)):
        write_json(tmp_path / "cells" / cell / QUALITY_FILE, result)
    table = quality_table(tmp_path).set_index("server")
    assert table.loc["vllm", "perplexity"] == 3.15 and table.loc["vllm", "exact %"] == 50.0
    assert table.loc["llamacpp", "perplexity not measured"] == why
    # Where every server was scored there is no column of blanks.
    write_json(tmp_path / "cells" / "llamacpp__sweep" / QUALITY_FILE, scored)
    assert "perplexity not measured" not in quality_table(tmp_path).columns


def test_a_tune_trial_whose_perplexity_rises_past_the_allowed_drop_fails_the_gate(tmp_path: Path) -> None:
    answers = [{"id": "e1", "kind": "exact", "output": "Fibi", "error": None}]
    rates = {"failed": 0, **dict.fromkeys(QUALITY_RATES)}

    def result(name: str, perplexity: float | None) -> Path:
        write_json(tmp_path / name, {"answers": answers, "rates": {**rates, "perplexity": perplexity}})
        return tmp_path / name

    untuned = result("untuned.json", 3.0)
    passed, why = gate(result("worse.json", 3.3), untuned, min_agreement=0.9, max_rate_drop=0.05)
    assert passed is False and why == "perplexity 3.300 vs 3.000 untuned (+10.0%)"
    assert gate(result("close.json", 3.1), untuned, min_agreement=0.9, max_rate_drop=0.05)[0] is True
    # A trial on a server without prompt logprobs is judged on its answers alone.
    assert gate(result("unscored.json", None), untuned, min_agreement=0.9, max_rate_drop=0.05)[0] is True
