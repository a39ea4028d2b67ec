"""Rehearsals answer the quality set: right from a clean stand-in, a planted share wrong from a lossy one.

A rehearsal's stand-in would otherwise answer every quality prompt with filler. What is
asserted: each stand-in answer passes (or, planted wrong, fails) exactly the checks of its
item kind, scored by :mod:`bakeoff.campaign.quality` itself; which launches count as lossy
(quantized weights by knob or checkpoint, a KV cache in another type than the model's); that a
rehearsed server answers the set over HTTP with the rates :data:`BROKEN_EVERY` implies, its
prompt logprobs planted lower when lossy; and that a rehearsed campaign with a baseline shows
the agreement drop end to end.
"""

from __future__ import annotations

import json
import math
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.campaign_input import load_input
from bakeoff.campaign.execute import run_campaign
from bakeoff.campaign.quality import QUALITY_FILE, QualityItem, check, load_prompt_set, run_quality, score
from bakeoff.campaign.rehearsal import stand_in_answers
from bakeoff.measure.client import ClientSettings
from bakeoff.models.model_source import ModelSource
from bakeoff.report.tables import REHEARSAL_SUFFIX, quality_table
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import read_json
from bakeoff.serving.launchers import LaunchContext, start_server
from bakeoff.serving.stand_in_quality import (
    BROKEN_EVERY,
    CANNED_FILE,
    LOSSY_PROMPT_LOGPROB,
    PLANTED_FILE,
    PROMPT_LOGPROB,
    StandIn,
    canned_answers,
    lossy_settings,
)

REPO = Path(__file__).resolve().parents[1]
AWQ = REPO / "campaigns" / "gpu-7b-awq-int4.yaml"

# Items at the edges of what the stand-in has to satisfy: a bound on one side only, a JSON item
# without required keys, a palindrome exact answer (reversing it changes nothing), a
# multi-word answer, and more items of a kind than BROKEN_EVERY so breakage repeats.
EDGES = [
    {"id": "e-pal", "kind": "exact", "prompt": "Say level.", "answer": "level", "max_tokens": 4},
    {"id": "e-two", "kind": "exact", "prompt": "Which city?", "answer": "New York", "max_tokens": 4},
    {"id": "e-one", "kind": "exact", "prompt": "One letter?", "answer": "a", "max_tokens": 2},
    *({"id": f"e{n}", "kind": "exact", "prompt": f"What is {n} + {n}?", "answer": str(2 * n)} for n in range(6)),
    {"id": "j-none", "kind": "json", "prompt": "Any JSON object.", "max_tokens": 2},
    {"id": "j-many", "kind": "json", "prompt": "Five keys.", "required_keys": list("abcde"), "max_tokens": 1},
    {"id": "f-min", "kind": "free", "prompt": "At least 7 words.", "min_words": 7, "max_tokens": 7},
    {"id": "f-max", "kind": "free", "prompt": "At most 3 words.", "max_words": 3, "max_tokens": 16},
    {"id": "f-both", "kind": "free", "prompt": "Between 40 and 60.", "min_words": 40, "max_words": 60},
    {"id": "f-tight", "kind": "free", "prompt": "Exactly 2 words.", "min_words": 2, "max_words": 2},
]


def _edges() -> list[QualityItem]:
    return [QualityItem.model_validate(item) for item in EDGES]


def _answered(item: QualityItem, text: str) -> dict[str, Any]:
    """``item`` checked as the reference server would send ``text``: cut to max_tokens words, else stopped."""
    words = text.split()
    cut = len(words) > item.max_tokens
    shown = " ".join(words[: item.max_tokens]) if cut else text
    return check(item, RequestRecord(0, output_text=shown, finish_reason="length" if cut else "stop"))


def _passed(answer: dict[str, Any]) -> bool:
    """Whether an answer passes its kind's check (and nothing marks it truncated or refused)."""
    kind_check = {"exact": answer["exact"], "json": answer["valid_json"], "free": answer["length_ok"]}
    return bool(kind_check[answer["kind"]]) and not answer["truncated"] and not answer["refused"]


@pytest.mark.parametrize("items", [_edges(), load_prompt_set("default")], ids=["edges", "default"])
def test_each_stand_in_answer_passes_and_its_wrong_one_fails_its_kinds_check(items: list[QualityItem]) -> None:
    answers = stand_in_answers(items)
    asked = [i for i in items if i.kind != "perplexity"]  # scored by prompt logprobs: no answer planted
    assert [a.item_id for a in answers] == [i.id for i in asked]
    for item, answer in zip(asked, answers, strict=True):
        assert answer.prompt == item.prompt and answer.kind == item.kind
        assert _passed(_answered(item, answer.right)), (item.id, answer.right)
        assert not _passed(_answered(item, answer.wrong)), (item.id, answer.wrong)
        assert answer.wrong.split() != answer.right.split()  # a clean baseline disagrees with it too


def test_a_lossy_stand_in_breaks_every_nth_item_of_each_kind() -> None:
    items = _edges()
    answers = stand_in_answers(items)
    clean, none_broken = canned_answers(answers, lossy=False)
    assert none_broken == [] and clean == {a.prompt: a.right for a in answers}
    lossy, broken = canned_answers(answers, lossy=True)
    kinds = Counter(i.kind for i in items)
    assert len(broken) == sum(n // BROKEN_EVERY for n in kinds.values()) > 0
    assert Counter(i.kind for i in items if i.id in broken) == {
        k: n // BROKEN_EVERY for k, n in kinds.items() if n >= BROKEN_EVERY
    }
    assert [a.prompt for a in answers if lossy[a.prompt] != clean[a.prompt]] == [
        a.prompt for a in answers if a.item_id in broken
    ]
    # Scored by the quality module: each kind's rate moves by exactly its broken share.
    scored = score(
        [_answered(item, lossy[item.prompt]) for item in items], baseline={i.id: clean[i.prompt] for i in items}
    )
    assert scored["exact"] == 1 - (kinds["exact"] // BROKEN_EVERY) / kinds["exact"]
    assert scored["agreement"] == 1 - len(broken) / len(items)


def _folder(tmp_path: Path, name: str, files: dict[str, Any]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    for file, content in files.items():
        (folder / file).write_text(json.dumps(content))
    return str(folder)


def test_which_launches_count_as_lossy(tmp_path: Path) -> None:
    plain = _folder(tmp_path, "llama-7b-awq-looking", {"config.json": {"torch_dtype": "bfloat16"}})
    modelopt = _folder(
        tmp_path,
        "plain-name",
        {"config.json": {"torch_dtype": "float16"},
         "hf_quant_config.json": {"quantization": {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": "FP8"}}},
    )  # fmt: skip
    hf_gptq = _folder(tmp_path, "other-name", {"config.json": {"quantization_config": {"quant_method": "gptq"}}})
    fp16 = {"dtype": "float16", "quantization": "none", "kv_cache_dtype": "auto"}
    assert lossy_settings(fp16, None) == []
    assert lossy_settings({**fp16, "quantization": "awq"}, None) == ["weights: quantization awq"]
    assert lossy_settings({**fp16, "kv_cache_dtype": "fp8"}, None)[0].startswith("KV cache: kv_cache_dtype fp8")
    assert lossy_settings({**fp16, "kv_cache_dtype": "float16"}, None) == []  # the model's own type
    # dtype auto: the checkpoint's config says; a folder here is read, never judged by its name.
    assert lossy_settings({"dtype": "auto", "kv_cache_dtype": "bfloat16"}, plain) == []
    assert lossy_settings({"dtype": "auto", "kv_cache_dtype": "bfloat16"}, None) != []  # model dtype unknown
    found = lossy_settings({"dtype": "float16"}, modelopt)
    assert len(found) == 2 and "W4A16_AWQ" in found[0] and found[1].startswith("KV cache: fp8_e4m3")
    assert "gptq" in lossy_settings({}, hf_gptq)[0]
    # Not on this machine (a rehearsal's /models/...), or a Hugging Face id: the name says.
    assert "w4a16" in lossy_settings({}, "/models/llama-7b-modelopt-w4a16-awq")[0]
    assert "awq" in lossy_settings({}, "TheBloke/Llama-2-7B-AWQ")[0]
    assert lossy_settings({}, "/models/llama-7b") == [] and lossy_settings({}, "/models/drawquestion") == []


def _completions(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url + "/v1/completions", data=orjson.dumps(body), method="POST")
    with urllib.request.urlopen(request) as resp:
        result: dict[str, Any] = orjson.loads(resp.read())
    return result


def _rehearsed_quality(knobs: dict[str, Any], model: Path, run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """One vLLM server as a rehearsal launches it with the default set: its quality result and planted record."""
    backend = load_backend("vllm")
    server = ServerConfig(backend="vllm", label="vllm", knobs=knobs).for_rehearsal()
    stand_in = StandIn(answers=stand_in_answers(load_prompt_set("default")), checkpoint="/models/llama-7b")
    ctx = LaunchContext(
        server, backend, ModelSource(hf_id=None, local_dir=model), "llama-7b", run_dir, stand_in=stand_in
    )
    with start_server(ctx) as (handle, _):
        settings = ClientSettings(handle.base_url, handle.model, extra_body=dict(backend.request.extra_body))
        result = run_quality(
            settings,
            "default",
            concurrency=4,
            endpoint="chat",
            out=run_dir / QUALITY_FILE,
            prompt_logprobs=backend.prompt_logprobs,
        )
        prompt = "the cat sat on the mat"
        answer = _completions(
            handle.base_url, {"model": handle.model, "prompt": prompt, "max_tokens": 2, "prompt_logprobs": 0}
        )
        logprobs = {v["logprob"] for entry in answer["choices"][0]["prompt_logprobs"][1:] for v in entry.values()}
    planted = read_json(run_dir / PLANTED_FILE)
    assert read_json(run_dir / CANNED_FILE) == canned_answers(stand_in.answers, lossy=bool(planted["lossy"]))[0]
    assert logprobs == {planted["prompt_logprob"]}
    return result, planted


def test_a_rehearsed_server_answers_the_quality_set_clean_or_planted_wrong(tmp_path: Path, tiny_model: Path) -> None:
    items = [i for i in load_prompt_set("default") if i.kind != "perplexity"]  # asked; the rest are scored
    kinds = Counter(i.kind for i in items)
    clean, clean_planted = _rehearsed_quality({"dtype": "float16"}, tiny_model, tmp_path / "clean")
    assert clean_planted["lossy"] == [] and clean_planted["prompt_logprob"] == PROMPT_LOGPROB
    rates = clean["rates"]
    assert (rates["answered"], rates["failed"]) == (len(items), 0)
    assert (rates["exact"], rates["length_ok"], rates["invalid_json"], rates["truncated"], rates["refused"]) == (
        1,
        1,
        0,
        0,
        0,
    )
    # The held-out texts scored through the stand-in's prompt logprobs: the planted logprob, exactly.
    assert clean["rates"]["perplexity"] == pytest.approx(math.exp(-PROMPT_LOGPROB))

    lossy, planted = _rehearsed_quality({"dtype": "float16", "kv_cache_dtype": "fp8"}, tiny_model, tmp_path / "fp8")
    assert planted["lossy"] and planted["prompt_logprob"] == LOSSY_PROMPT_LOGPROB < PROMPT_LOGPROB
    rates = lossy["rates"]
    assert rates["perplexity"] == pytest.approx(math.exp(-LOSSY_PROMPT_LOGPROB))
    assert rates["perplexity"] > clean["rates"]["perplexity"]
    share = {kind: (n // BROKEN_EVERY) / n for kind, n in kinds.items()}
    assert rates["exact"] == 1 - share["exact"] < 1 and rates["length_ok"] == 1 - share["free"] < 1
    assert rates["invalid_json"] == share["json"] > 0 and rates["failed"] == 0
    # Against the clean stand-in's answers as the baseline, the broken items disagree.
    baseline = {a["id"]: a["output"] for a in clean["answers"]}
    against = score(lossy["answers"], baseline)
    assert against["agreement"] == 1 - len(planted["broken_items"]) / len(items) < 1
    assert against["word_agreement"] is not None and against["word_agreement"] < 1


def test_a_rehearsed_int4_campaign_shows_the_quality_drop_against_an_fp16_baseline(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The INT4 campaign's pre-quantized TensorRT-LLM server, rehearsed twice: once from the FP16
    checkpoint (the baseline run), once as shipped, with that run named as ``quality.baseline``."""
    raw = yaml.safe_load(AWQ.read_text())
    (trtllm,) = [s for s in raw["servers"] if s["backend"] == "trtllm" and "model_path" in s]
    fp16 = {**raw, "servers": [{**trtllm, "model_path": "/models/llama-7b"}]}
    (tmp_path / "fp16.yaml").write_text(yaml.safe_dump(fp16))
    baseline = run_campaign(
        load_input(tmp_path / "fp16.yaml", rehearse=True), out_dir=tmp_path / "fp16", cell_notebooks=False
    ).parent
    int4 = {**raw, "quality": {**raw["quality"], "baseline": str(baseline)}}
    (tmp_path / "int4.yaml").write_text(yaml.safe_dump(int4))
    folder = run_campaign(
        load_input(tmp_path / "int4.yaml", rehearse=True),
        out_dir=tmp_path / "int4",
        only=[trtllm["label"]],
        cell_notebooks=False,
    ).parent

    items = [i for i in load_prompt_set(raw["quality"]["prompts"]) if i.kind != "perplexity"]
    (before,) = [read_json(p) for p in (baseline / "cells").glob(f"*/{QUALITY_FILE}")]
    (after_path,) = list((folder / "cells").glob(f"*/{QUALITY_FILE}"))
    after, planted = read_json(after_path), read_json(after_path.parent / PLANTED_FILE)
    assert "pre-quantized" in planted["lossy"][0]  # read from the model_path: no quantization knob on TensorRT-LLM
    assert before["rates"]["exact"] == 1 and after["rates"]["exact"] < 1
    assert after["baseline_items"] == len(items)
    # TensorRT-LLM returns no prompt logprobs in vLLM's form: its perplexity says why it is missing.
    assert after["rates"]["perplexity"] is None and "TensorRT-LLM" in after["perplexity"]["why_not"]
    assert after["rates"]["agreement"] == 1 - len(planted["broken_items"]) / len(items) < 1
    # The report's quality table carries the rehearsal mark on every row, like its other tables.
    table = quality_table(folder)
    assert len(table) == 1 and all(str(s).endswith(REHEARSAL_SUFFIX) for s in table["server"])
    assert table["agreement %"].iloc[0] == pytest.approx(100 * after["rates"]["agreement"])
    assert "Quality (temperature 0" in (folder / "report.html").read_text()
