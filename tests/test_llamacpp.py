"""llama.cpp backend: GGUF conversion, the backend YAML, and one real streamed request.

The e2e test converts ``models/tiny`` to GGUF, starts the native ``llama-server`` through
``run_local_process`` with the launch rendered from ``backends/llamacpp.yaml``, streams one
completion over raw ``http.client``, checks llama.cpp tokenizes exactly like the HF
tokenizer (the converter's pre-tokenizer fallback is what makes that true), and checks
that no server process outlives the context manager. Without the binary (``make llamacpp``,
part of ``make test``) it fails, naming the target.
"""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path
from typing import Any

import psutil
import pytest
from tokenizers import Tokenizer

import prerequisites
from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.models.gguf import (
    convert_to_gguf,
    gguf_is_fresh,
    llama_server_path,
    pre_tokenizer_from_config,
)
from bakeoff.serving.process import free_port, run_local_process

SERVER = llama_server_path()
MAX_TOKENS = 16
# Spaces, newlines, digits, punctuation, contractions and multi-byte text: the cases where
# pre-tokenizers differ.
TOKENIZE_PROBE = "Hello  world!\n\n  3.14 or 333333? I've 'RE sure -- ünïcödé 我想 🚀 tabs\t\tend "


def _byte_level(**pre: Any) -> dict[str, Any]:
    return {
        "normalizer": None,
        "model": {"type": "BPE"},
        "pre_tokenizer": {"type": "ByteLevel", **pre},
    }


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (_byte_level(add_prefix_space=False, use_regex=True), "gpt-2"),
        (
            {
                **_byte_level(),
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}]},
            },
            "gpt-2",
        ),
        (_byte_level(add_prefix_space=True), None),  # GPT-2 pre-type adds no space
        (_byte_level(use_regex=False), None),  # no split at all: not GPT-2
        ({**_byte_level(), "normalizer": {"type": "NFC"}}, None),
        ({**_byte_level(), "model": {"type": "Unigram"}}, None),
        ({**_byte_level(), "pre_tokenizer": {"type": "Metaspace"}}, None),
    ],
)
def test_pre_tokenizer_from_config(tmp_path: Path, spec: dict[str, Any], expected: str | None) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    assert pre_tokenizer_from_config(path) == expected


def test_generated_tokenizer_is_gpt2_pre_tokenized(tiny_model: Path) -> None:
    assert pre_tokenizer_from_config(tiny_model / "tokenizer.json") == "gpt-2"


def test_backend_yaml_renders() -> None:
    backend = load_backend("llamacpp")
    launch = render_launch(
        backend,
        {"max_num_seqs": 8, "prefix_caching": False, "max_model_len": 1024},
        model="/m/model-bf16.gguf",
        served_model_name="tiny",
        port=8123,
    )
    argv = launch.argv
    assert argv[0] == "llama-server"
    assert argv[argv.index("--model") + 1] == "/m/model-bf16.gguf"
    assert argv[argv.index("--alias") + 1] == "tiny"
    assert argv[argv.index("--parallel") + 1] == "8"
    assert argv[argv.index("--kv-unified-per-slot") + 1] == "1024"
    assert {"--metrics", "--kv-unified", "--no-cache-prompt"} <= set(argv)
    assert argv[argv.index("--cache-ram") + 1] == "0"
    assert backend.model_format == "gguf"


@pytest.mark.parametrize(("dtype", "native"), [("q8_0", "q8_0"), ("bfloat16", "bf16"), ("auto", None)])
def test_kv_cache_dtype_sets_k_and_v(dtype: str, native: str | None) -> None:
    launch = render_launch(
        load_backend("llamacpp"), {"kv_cache_dtype": dtype}, model="/m.gguf", served_model_name="t", port=1
    )
    argv = launch.argv
    if native is None:
        assert "--cache-type-k" not in argv and "--cache-type-v" not in argv
    else:
        assert argv[argv.index("--cache-type-k") + 1] == native
        assert argv[argv.index("--cache-type-v") + 1] == native


def _sse_events(resp: http.client.HTTPResponse) -> list[dict[str, Any]]:
    """Parse an SSE body into its JSON ``data:`` payloads, stopping at ``[DONE]``."""
    events: list[dict[str, Any]] = []
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            break
        events.append(json.loads(payload))
    return events


def _post(port: int, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _server_processes(port: int) -> list[psutil.Process]:
    """llama-server processes serving ``port`` (other runs may serve other ports)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and Path(cmdline[0]).name == "llama-server" and str(port) in cmdline:
            found.append(proc)
    return found


@pytest.mark.e2e
def test_llamacpp_streams_a_completion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> None:
    """The GGUF conversion and a bare launch of the rendered argv; its own server: it starts in about a second."""
    prerequisites.llama_server()
    model_dir = tiny_model
    gguf = convert_to_gguf(model_dir)
    assert gguf_is_fresh(model_dir, gguf)
    # The YAML runs `llama-server` from PATH; the install links it into the venv's bin.
    monkeypatch.setenv("PATH", f"{SERVER.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    backend = load_backend("llamacpp")
    port = free_port()
    launch = render_launch(
        backend,
        {"max_num_seqs": 2, "threads": 2},
        model=str(gguf),
        served_model_name="tiny",
        port=port,
    )
    body = {
        "model": "tiny",
        "prompt": "Ba ke ro fi lo mu",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        **backend.request.extra_body,
    }
    with run_local_process(launch, port=port, served_model_name="tiny", run_dir=tmp_path) as handle:
        assert handle.pid is not None and _server_processes(port)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200, resp.read()[:500]
            events = _sse_events(resp)
        finally:
            conn.close()
        status, raw = _post(port, "/tokenize", {"content": TOKENIZE_PROBE, "add_special": False})
        assert status == 200
        served_ids = json.loads(raw)["tokens"]

    content = [e for e in events if e.get("choices") and e["choices"][0].get("text")]
    assert content, f"no content chunks in {events[:3]}"
    # Usage rides in the chunk that carries finish_reason (usage_in_stream: finish_chunk).
    finish = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
    assert len(finish) == 1 and finish[0] is events[-1]
    assert finish[0]["choices"][0]["finish_reason"] == "length"
    usage = finish[0]["usage"]
    assert usage["completion_tokens"] == MAX_TOKENS
    assert "cached_tokens" in usage["prompt_tokens_details"]

    hf_ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(TOKENIZE_PROBE).ids
    assert served_ids == hf_ids, "llama.cpp tokenizes differently from the HF tokenizer"

    leftovers = _server_processes(port)
    assert not leftovers, f"llama-server still running after exit: {[p.pid for p in leftovers]}"
    assert not psutil.pid_exists(handle.pid) or psutil.Process(handle.pid).status() == psutil.STATUS_ZOMBIE
