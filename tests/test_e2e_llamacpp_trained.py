"""llama.cpp on the trained model, for real: INT4 weights answer the exam, speculation is counted.

One server (Q4_0 weights, the trained-draft model proposing 4 tokens a step) started through
the process launcher exactly as a campaign starts it, asked the trained model's exam items at
temperature 0; its own /metrics must show draft tokens proposed and accepted. llama.cpp starts
in about a second, so this test starts its own server rather than sharing one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import prerequisites
from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.quality import ask, check, load_prompt_set, planned
from bakeoff.measure.client import ClientSettings
from bakeoff.models.model_source import ModelSource
from bakeoff.models.presets import preset_is_ready
from bakeoff.observe.telemetry import scrape, speculative_from_counters
from bakeoff.paths import models_dir
from bakeoff.serving.launchers import LaunchContext, start_server

pytestmark = pytest.mark.e2e


def _trained(preset: str) -> Path:
    folder = models_dir() / preset
    if not preset_is_ready(folder, preset):
        pytest.fail(f"models/{preset} missing: run `bakeoff model make --preset trained`")
    return folder


def test_int4_weights_with_a_draft_answer_and_report_acceptance(tmp_path: Path) -> None:
    prerequisites.llama_server()
    backend = load_backend("llamacpp")
    knobs = {"quantization": "q4_0", "speculative": "draft", "max_num_seqs": 2, "max_model_len": 512}
    ctx = LaunchContext(
        server=ServerConfig(backend="llamacpp", label="q4", knobs=knobs),
        backend=backend,
        source=ModelSource(hf_id=None, local_dir=_trained("trained")),
        served_name="trained",
        run_dir=tmp_path,
        draft_dir=_trained("trained-draft"),
    )
    exam = load_prompt_set("trained")
    # Short answers end after a token or two (nothing left to draft); continuations run 48 tokens.
    items = [i for i in exam if i.group == "trained-phrasing"][:12] + [i for i in exam if i.group == "continuation"][:8]
    with start_server(ctx) as (handle, launch):
        assert "--model-draft" in launch.argv and launch.argv[launch.argv.index("--model") + 1].endswith("q4_0.gguf")
        assert handle.weight_types is not None and handle.weight_types.get("Q4_0", 0) > 0
        before = scrape(handle.base_url, backend)
        settings = ClientSettings(base_url=handle.base_url, model="trained")
        records = asyncio.run(ask(settings, planned(items, "completions"), concurrency=2))
        after = scrape(handle.base_url, backend)
    answers = [check(item, record) for item, record in zip(items, records, strict=True) if item.kind == "exact"]
    exact = sum(bool(a["exact"]) for a in answers) / len(answers)
    assert exact > 0.5, [a["output"] for a in answers]  # chance is 1 in 120
    drafted = speculative_from_counters(before, after, backend)
    assert drafted is not None and drafted["draft_tokens"] > 0 and drafted["accepted_tokens"] > 0
