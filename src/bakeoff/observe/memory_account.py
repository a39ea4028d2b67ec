"""Size what an engine's memory should be: its weights and its KV pool, as the server reports them.

A soak asks how much of the memory an engine holds neither its weights nor its KV pool
explain, and whether that share grows (the seed's fragmentation trap). This module sizes the
two constant parts once, on the started server, before the load (:func:`account`):

- **weights**: the model files the launch command names (a ``.gguf`` file, or a folder's
  ``*.safetensors``), else the campaign's model folder;
- **KV pool**: tokens the server set aside, times the bytes one token's K and V take
  (2 x layers x KV heads x head size x the cache type's bytes, from the model's
  ``config.json``). vLLM says its pool in ``vllm:cache_config_info`` (``num_gpu_blocks`` x
  ``block_size``: on CPU too, sized from ``VLLM_CPU_KVCACHE_SPACE``); llama.cpp in ``/props``
  (``n_ctx``: with ``--kv-unified``, as bakeoff launches it, one pool every slot shares).

The engine's memory over time is the telemetry series' (``rss_bytes`` or, on GPUs,
``gpu_mem_used_bytes``), read by :mod:`bakeoff.analysis.soak`. Nothing here raises: a part
that cannot be sized is None, with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from bakeoff.measure import control
from bakeoff.results.memory import MemoryAccount, MemorySource
from bakeoff.serving.backends import BackendSpec

# Bytes per element of the KV cache types the backends take (llama.cpp's q8_0: 34 bytes / 32 values).
_KV_TYPE_BYTES = {
    "float32": 4.0, "f32": 4.0, "float16": 2.0, "f16": 2.0, "half": 2.0, "bfloat16": 2.0, "bf16": 2.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "int8": 1.0, "int8_per_token_head": 1.0,
    "q8_0": 34 / 32, "q4_0": 18 / 32,
}  # fmt: skip


def weights_size(argv: Sequence[str], model_dir: Path | None) -> tuple[int | None, str]:
    """Bytes of the weights the launch loads, and which files were counted."""
    for arg in argv:
        path = Path(arg)
        if arg.endswith(".gguf") and path.is_file():
            return path.stat().st_size, str(path)
    candidates = [Path(a) for a in argv if "/" in a] + ([model_dir] if model_dir is not None else [])
    for folder in candidates:
        if folder.is_dir():
            files = sorted(folder.glob("*.safetensors"))
            if files:
                return sum(f.stat().st_size for f in files), f"{folder}/*.safetensors ({len(files)} files)"
    return None, "no .gguf file or *.safetensors folder in the launch command or the model folder"


def kv_bytes_per_token(model_dir: Path | None, cache_type: str) -> tuple[float | None, str]:
    """One token's K and V over every layer, from ``config.json`` and the cache type."""
    config = model_dir / "config.json" if model_dir is not None else None
    if config is None or not config.is_file():
        return None, "no config.json to read the model's layers and KV heads from"
    cfg: dict[str, Any] = json.loads(config.read_text())
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"config.json lacks {exc} for the KV size"
    kind = cache_type if cache_type not in ("auto", "") else str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
    size = _KV_TYPE_BYTES.get(kind.lower())
    if size is None:
        return None, f"KV cache type {kind!r}: its bytes per value are not known to bakeoff"
    return 2 * layers * kv_heads * head_dim * size, f"2 x {layers} layers x {kv_heads} KV heads x {head_dim} x {kind}"


def _vllm_pool(metrics_text: str) -> tuple[int, str] | None:
    """(pool tokens, cache type) from vLLM's ``cache_config_info`` labels, when it has them."""
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return None
    for family in families:
        if not family.name.endswith("cache_config_info"):
            continue
        for sample in family.samples:
            labels = sample.labels
            try:
                blocks, block = int(labels["num_gpu_blocks"]), int(labels["block_size"])
            except (KeyError, ValueError):
                continue
            return blocks * block, labels.get("cache_dtype", "auto")
    return None


def _llamacpp_pool(props: Mapping[str, Any]) -> int | None:
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def account(
    base_url: str,
    backend: BackendSpec,
    argv: Sequence[str],
    model_dir: Path | None,
    *,
    source: MemorySource,
    headers: Mapping[str, str] | None = None,
) -> MemoryAccount:
    """The weights and KV pool of the server at ``base_url``, started with ``argv``."""
    weights, weights_from = weights_size(argv, model_dir)
    notes: list[str] = []
    pool: int | None = None
    cache_type = "auto"
    pool_from = "the server reports no KV pool size bakeoff reads (vLLM's cache_config_info, llama.cpp's /props)"
    root = base_url.rstrip("/")
    if backend.metrics.path:
        answer = control.call(root + backend.metrics.path, headers=headers, timeout_s=5.0)
        found = _vllm_pool(answer.text) if answer.status == 200 else None
        if found is not None:
            pool, cache_type = found
            pool_from = f"vllm:cache_config_info: num_gpu_blocks x block_size = {pool} tokens"
    if pool is None:
        answer = control.call(root + "/props", headers=headers, timeout_s=5.0)
        if answer.status == 200:
            with _quiet():
                pool = _llamacpp_pool(orjson.loads(answer.body))
            if pool is not None:
                pool_from = f"/props default_generation_settings.n_ctx = {pool} tokens"
                cache_type = _flag_value(argv, "--cache-type-k") or "f16"
    per_token, per_token_from = kv_bytes_per_token(model_dir, cache_type)
    if per_token is None:
        notes.append(f"KV bytes per token: {per_token_from}")
    pool_bytes = round(pool * per_token) if pool is not None and per_token is not None else None
    if pool_bytes is not None:
        pool_from += f"; {per_token_from}"
    return MemoryAccount(
        source=source,
        weights_bytes=weights,
        weights_from=weights_from,
        kv_pool_bytes=pool_bytes,
        kv_pool_tokens=pool,
        kv_bytes_per_token=per_token,
        kv_pool_from=pool_from,
        notes=notes,
    )


class _quiet:
    """A body that is not the JSON expected leaves the pool unsized, not the run failed."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, (orjson.JSONDecodeError, AttributeError, TypeError))
