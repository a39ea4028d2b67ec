"""Quality checks: a faster configuration that breaks its outputs is a regression too.

A campaign's ``quality:`` names a fixed prompt set (``quality/NAME.jsonl``, shipped, or
any ``.jsonl`` file), one JSON object a line::

    {"id": "person-json", "kind": "json", "prompt": "...", "required_keys": ["name", "age"], "max_tokens": 96}
    {"id": "capital", "kind": "exact", "prompt": "...", "answer": "Paris", "max_tokens": 8}
    {"id": "summary", "kind": "free", "prompt": "...", "min_words": 20, "max_words": 120, "max_tokens": 256}
    {"id": "held-out-000", "kind": "perplexity", "prompt": "a held-out text the model is scored on"}

After a cell's speed runs, every item is sent to its server at temperature 0, through the
same streaming client as the measured load (without ``ignore_eos`` or ``min_tokens``: the
model must be free to stop), and scored into ``quality.json`` beside the cell:

==================== ===========================================================================
rate                 definition (over the items that got an answer; failed requests are counted
                     apart, never scored)
==================== ===========================================================================
invalid_json         ``json`` items whose output is not a JSON object holding every required key
                     (one surrounding Markdown code fence is allowed)
truncated            items stopped by ``max_tokens`` (``finish_reason == "length"``) before their
                     expected end: a ``json`` item that does not parse, an ``exact`` item without
                     its answer, any ``free`` item (its end is the model's own stop)
refused              outputs that open with a refusal (``REFUSAL`` patterns)
exact                ``exact`` items whose normalized output equals the normalized answer
length_ok            ``free`` items whose word count is within ``min_words``..``max_words``
agreement            items whose normalized output equals the baseline's for the same item
                     (``quality.baseline``: a campaign folder; the same cell, else the same server)
word_agreement       mean over those items of the share of words (whitespace-separated, after
                     normalizing) that match the baseline's in order before the first
                     difference: common leading words / the longer output's words (two empty
                     outputs agree fully). A greedy decode that drifts late scores near 1,
                     one that drifts at once near 0
==================== ===========================================================================

``perplexity`` items are not asked: their texts are scored by the server's prompt logprobs
into ``perplexity`` (exp of the mean negative logprob over their tokens; lower is better), on
backends that return them (:mod:`bakeoff.campaign.perplexity`), else None with the reason.

An item may name a ``group`` (``trained-phrasing``, ``long-context-recall``, ...): the
``exact`` rate is then also given per group (``exact_by_group`` beside ``rates``).

Normalized: stripped, lower-cased, whitespace collapsed, trailing ``.`` removed. A rate
whose denominator is 0 is ``None`` ("not measured"), never 0. The generated CPU models
emit random text: their rates are computed and shown like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bakeoff.campaign import perplexity
from bakeoff.campaign.runner import run_coroutine
from bakeoff.errors import SpecError
from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.measure.loadgen import closed_loop
from bakeoff.paths import shipped
from bakeoff.results.layout import QUALITY_FILE
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import read_json, write_json
from bakeoff.schema import Strict
from bakeoff.workloads.plans import PlannedRequest

REFUSAL = re.compile(
    r"^(i'?m sorry|i am sorry|sorry, (but )?i|i can(no|')t|i cannot|i won'?t|i will not|i'?m (not )?(un)?able to"
    r"|i am (not )?(un)?able to|as an ai\b)"
)


class QualityItem(BaseModel):
    """One prompt of a quality set and what its answer must satisfy."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    kind: Literal["json", "exact", "free", "perplexity"]
    prompt: str = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1)] = 128
    required_keys: list[str] = Field(default_factory=list)
    answer: str | None = None
    min_words: Annotated[int, Field(ge=0)] | None = None
    max_words: Annotated[int, Field(ge=1)] | None = None
    group: str | None = Field(default=None, min_length=1, description="exact rates are also given per group")

    @model_validator(mode="after")
    def _fields_for_kind(self) -> QualityItem:
        if self.kind == "exact" and not self.answer:
            raise ValueError("an 'exact' item needs 'answer'")
        if self.kind == "free" and self.min_words is None and self.max_words is None:
            raise ValueError("a 'free' item needs 'min_words' and/or 'max_words'")
        if self.kind != "json" and self.required_keys:
            raise ValueError("'required_keys' belongs to 'json' items")
        if self.kind == "perplexity" and (self.answer or self.min_words is not None or self.max_words is not None):
            raise ValueError("a 'perplexity' item is scored, not answered: it takes no 'answer' or word bounds")
        return self


def prompt_set_path(name: str) -> Path:
    """A shipped set by name (``default``), or a path to a ``.jsonl`` file."""
    if name.endswith(".jsonl") or "/" in name:
        return Path(name).expanduser()

    return shipped("quality") / f"{name}.jsonl"


def load_prompt_set(name: str, where: str = "quality.prompts") -> list[QualityItem]:
    """Read and check a prompt set; any problem is a :class:`SpecError` naming the line."""
    path = prompt_set_path(name)
    if not path.is_file():
        raise SpecError(f"{where}: no prompt set {path}; name a set in quality/ (e.g. default) or a .jsonl file")
    items: list[QualityItem] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(QualityItem.model_validate(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise SpecError(f"{where}: {path}:{number}: {detail}") from exc
    ids = [i.id for i in items]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if not items or repeated:
        raise SpecError(f"{where}: {path}: " + (f"repeated ids {repeated}" if repeated else "no items"))
    return items


def set_digest(name: str) -> str:
    return hashlib.sha256(prompt_set_path(name).read_bytes()).hexdigest()


def normalize(text: str) -> str:
    return " ".join(text.strip().lower().split()).rstrip(".").strip()


def parse_json_answer(text: str, required: Sequence[str]) -> bool:
    """A JSON object with every required key (one surrounding Markdown code fence allowed)."""
    body = text.strip()
    fenced = re.fullmatch(r"```[A-Za-z]*\s*\n?(.*?)\n?```", body, flags=re.DOTALL)
    if fenced:
        body = fenced.group(1).strip()
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, dict) and all(key in value for key in required)


def check(item: QualityItem, record: RequestRecord) -> dict[str, Any]:
    """One answer's checks; ``None`` where a check does not apply to the item's kind."""
    text = record.output_text
    answer: dict[str, Any] = {
        "id": item.id,
        "kind": item.kind,
        "output": text,
        "finish_reason": record.finish_reason,
        "error": record.error_kind,
    }
    if not record.ok:
        return answer
    valid = parse_json_answer(text, item.required_keys) if item.kind == "json" else None
    exact = normalize(text) == normalize(item.answer or "") if item.kind == "exact" else None
    length_ok = None
    if item.kind == "free":
        words = len(text.split())
        length_ok = (item.min_words is None or words >= item.min_words) and (
            item.max_words is None or words <= item.max_words
        )
    complete = {"json": valid, "exact": exact, "free": False}[item.kind]
    answer.update(
        valid_json=valid,
        exact=exact,
        length_ok=length_ok,
        truncated=record.finish_reason == "length" and not complete,
        refused=bool(REFUSAL.match(normalize(text))),
    )
    return answer


def _rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def word_agreement(output: str, baseline: str) -> float:
    """Common leading words of two normalized outputs / the longer one's words (1.0 if both empty)."""
    ours, theirs = normalize(output).split(), normalize(baseline).split()
    longest = max(len(ours), len(theirs))
    if longest == 0:
        return 1.0
    same = 0
    for mine, other in zip(ours, theirs, strict=False):
        if mine != other:
            break
        same += 1
    return same / longest


def exact_by_group(answers: list[dict[str, Any]], items: list[QualityItem]) -> dict[str, float | None]:
    """The exact rate of each item group (answered ``exact`` items only), groups in file order."""
    group_of = {i.id: i.group for i in items if i.group is not None and i.kind == "exact"}
    flags: dict[str, list[bool]] = {g: [] for g in group_of.values()}
    for answer in answers:
        group = group_of.get(answer["id"])
        if group is not None and answer["error"] is None:
            flags[group].append(bool(answer["exact"]))
    return {group: _rate(values) for group, values in flags.items()}


def score(answers: list[dict[str, Any]], baseline: dict[str, str] | None = None) -> dict[str, Any]:
    """The rates of one server's answers (see the module table); ``baseline``: item id -> output."""
    ok = [a for a in answers if a["error"] is None]
    json_items = [a for a in ok if a["kind"] == "json"]
    agreement = words = None
    if baseline is not None:
        shared = [a for a in ok if a["id"] in baseline]
        agreement = _rate([normalize(a["output"]) == normalize(baseline[a["id"]]) for a in shared])
        shares = [word_agreement(a["output"], baseline[a["id"]]) for a in shared]
        words = sum(shares) / len(shares) if shares else None
    return {
        "items": len(answers),
        "answered": len(ok),
        "failed": len(answers) - len(ok),
        "invalid_json": _rate([not a["valid_json"] for a in json_items]),
        "truncated": _rate([a["truncated"] for a in ok]),
        "refused": _rate([a["refused"] for a in ok]),
        "exact": _rate([a["exact"] for a in ok if a["kind"] == "exact"]),
        "length_ok": _rate([a["length_ok"] for a in ok if a["kind"] == "free"]),
        "agreement": agreement,
        "word_agreement": words,
    }


def planned(items: list[QualityItem], endpoint: str) -> list[PlannedRequest]:
    if endpoint == "chat":
        return [
            PlannedRequest(n, "chat", i.max_tokens, messages=[{"role": "user", "content": i.prompt}], group=i.id)
            for n, i in enumerate(items)
        ]
    return [PlannedRequest(n, "completions", i.max_tokens, prompt=i.prompt, group=i.id) for n, i in enumerate(items)]


def quality_settings(settings: ClientSettings) -> ClientSettings:
    """The measured load's client settings, minus what forces a length: the model must stop on its own."""
    extra = {k: v for k, v in settings.extra_body.items() if k != "ignore_eos"}
    return ClientSettings(
        base_url=settings.base_url,
        model=settings.model,
        extra_body=extra,
        request_timeout_s=settings.request_timeout_s,
        stall_timeout_s=settings.stall_timeout_s,
        count_tokens=settings.count_tokens,
        headers=settings.headers,
        min_tokens=False,
    )


async def ask(settings: ClientSettings, requests: list[PlannedRequest], concurrency: int) -> list[RequestRecord]:
    """Every request through the streaming client, ``concurrency`` at a time, in request order."""
    records: list[RequestRecord] = []
    async with StreamingClient(quality_settings(settings)) as client:
        await closed_loop(client, requests, concurrency, records.append)
    return sorted(records, key=lambda r: r.request_id)


def baseline_answers(baseline_dir: Path | None, cell_id: str, server_label: str) -> dict[str, str] | None:
    """Item id -> output from a baseline campaign folder: the same cell, else the same server."""
    if baseline_dir is None:
        return None
    exact = baseline_dir / "cells" / cell_id / QUALITY_FILE
    candidates = [exact] if exact.is_file() else sorted(baseline_dir.glob(f"cells/{server_label}__*/{QUALITY_FILE}"))
    if not candidates:
        return None
    return {a["id"]: a["output"] for a in read_json(candidates[0])["answers"] if a["error"] is None}


def run_quality(
    settings: ClientSettings,
    prompts: str,
    *,
    concurrency: int,
    endpoint: str,
    out: Path,
    baseline: dict[str, str] | None = None,
    prompt_logprobs: bool = False,
    backend: str = "this server",
) -> dict[str, Any]:
    """Ask every item of the set, score the answers and write ``out`` (atomically); return it.

    ``prompt_logprobs``: the server returns them (the backend's flag), so the set's perplexity
    items are scored; ``backend`` names it where they are not.
    """
    every = load_prompt_set(prompts)
    items = [i for i in every if i.kind != "perplexity"]
    box: list[list[RequestRecord]] = []

    async def go() -> None:
        box.append(await ask(settings, planned(items, endpoint), concurrency) if items else [])

    run_coroutine(go())
    answers = [check(item, record) for item, record in zip(items, box[0], strict=True)]
    scored = perplexity.measure(
        settings, [i.prompt for i in every if i.kind == "perplexity"], supported=prompt_logprobs, backend=backend
    )
    result = {
        "prompt_set": prompts,
        "prompt_set_sha256": set_digest(prompts),
        "endpoint": endpoint,
        "temperature": 0.0,
        "rates": {**score(answers, baseline), "perplexity": scored["perplexity"]},
        "exact_by_group": exact_by_group(answers, items),
        "baseline_items": len(baseline) if baseline is not None else None,
        "perplexity": scored,
        "answers": answers,
    }
    write_json(out, result)
    return result


def check_spec(spec: QualitySpec) -> None:
    """Before any server starts: the prompt set reads, and a named baseline folder exists."""
    load_prompt_set(spec.prompts)
    if spec.baseline is not None and not (spec.baseline / "cells").is_dir():
        raise SpecError(
            f"quality.baseline: {spec.baseline} is not a campaign folder (no cells/ in it); "
            "name the reports/NAME folder of an earlier run"
        )


def measure_cell(
    spec: QualitySpec,
    settings: ClientSettings,
    cell_dir: Path,
    cell_id: str,
    *,
    prompt_logprobs: bool = False,
    backend: str = "this server",
) -> dict[str, Any]:
    """A campaign cell's quality run into ``cell_dir/quality.json``, against the baseline if one is named."""
    label = cell_id.split("__", 1)[0]
    baseline = baseline_answers(spec.baseline, cell_id, label)
    return run_quality(
        settings,
        spec.prompts,
        concurrency=spec.concurrency,
        endpoint=spec.endpoint,
        out=cell_dir / QUALITY_FILE,
        baseline=baseline,
        prompt_logprobs=prompt_logprobs,
        backend=backend,
    )


class QualitySpec(Strict):
    """A fixed prompt set run at temperature 0 on every server after its speed runs."""

    prompts: str = Field(default="default", description="a set shipped in quality/ (by name) or a .jsonl file")
    baseline: Path | None = Field(
        default=None, description="a campaign folder whose quality answers the new ones are compared with"
    )
    concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    endpoint: Literal["chat", "completions"] = "chat"


def gate(trial: Path, untuned: Path, min_agreement: float, max_rate_drop: float) -> tuple[bool | None, str]:
    """A tune trial's quality against its untuned configuration's: (passed, why); None when not measured.

    It passes when at least ``min_agreement`` of the items both answered get the same normalized
    output, no pass rate (exact, length_ok) falls by more than ``max_rate_drop``, no failure
    rate (invalid_json, truncated, refused) rises by more, the perplexity (where both measured
    it) rises by no more than that share of the untuned one, and no more requests fail.
    """
    if not trial.is_file() or not untuned.is_file():
        return None, "not measured"
    mine, theirs = read_json(trial), read_json(untuned)
    ours = {a["id"]: a for a in mine["answers"] if a["error"] is None}
    shared = [a for a in theirs["answers"] if a["error"] is None and a["id"] in ours]
    problems = []
    agreement = _rate([normalize(ours[a["id"]]["output"]) == normalize(a["output"]) for a in shared])
    if agreement is not None and agreement < min_agreement:
        problems.append(f"agreement with the untuned answers {agreement:.0%} < {min_agreement:.0%}")
    rates, base = mine["rates"], theirs["rates"]
    for key, sign in (("exact", -1), ("length_ok", -1), ("invalid_json", 1), ("truncated", 1), ("refused", 1)):
        if rates[key] is not None and base[key] is not None and sign * (rates[key] - base[key]) > max_rate_drop:
            problems.append(f"{key} {rates[key]:.0%} vs {base[key]:.0%} untuned")
    if rates["failed"] > base["failed"]:
        problems.append(f"{rates['failed']} requests failed ({base['failed']} untuned)")
    mine_ppl, base_ppl = rates.get("perplexity"), base.get("perplexity")
    if mine_ppl is not None and base_ppl is not None and mine_ppl > base_ppl * (1 + max_rate_drop):
        problems.append(f"perplexity {mine_ppl:.3f} vs {base_ppl:.3f} untuned (+{mine_ppl / base_ppl - 1:.1%})")
    if problems:
        return False, "; ".join(problems)
    return True, f"agreement {agreement:.0%}" if agreement is not None else "no shared answers"
