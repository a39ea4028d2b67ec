"""Size what an engine's memory should be: its weights and its KV pool, as the server reports them.

A soak asks how much of the memory an engine holds neither its weights nor its KV pool
explain, and whether that share grows (the seed's fragmentation trap). This module sizes the
two constant parts once, on the started server, before the load (:func:`account`):

- **weights**: the model files the launch command names (a ``.gguf`` file, or a folder's
  ``*.safetensors``), else the campaign's model folder;
- **KV pool**: vLLM says it in ``vllm:cache_config_info``: ``kv_cache_memory_bytes`` and
  ``kv_cache_size_tokens`` (0.32 on CPU, sized from ``VLLM_CPU_KVCACHE_SPACE``), else
  ``num_gpu_blocks`` x ``block_size`` tokens. Otherwise tokens times the bytes one token's K and
  V take (2 x layers x KV heads x head size x the cache type's bytes, from the model's
  ``config.json``; a cache type of ``auto`` is the served ``--dtype``: vLLM-CPU at float32 keeps
  a float32 cache, twice the checkpoint's bf16). llama.cpp's ``/props`` gives ``n_ctx`` *per
  slot* and ``total_slots``: with ``--kv-unified`` (as bakeoff launches it) and no per-slot cap,
  every slot may fill the one pool, so the pool is ``n_ctx``; with ``--kv-unified-per-slot N``
  the pool is slots x N rounded up to 256 cells (seen on a real server: 4 x 874 = 3496 -> 3584),
  and ``n_ctx`` is N, not the pool.

The engine's memory over time is the telemetry series' (``rss_bytes`` or, on GPUs,
``gpu_mem_used_bytes``), read by :mod:`bakeoff.analysis.soak`. Nothing here raises: a part
that cannot be sized is None, with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from prometheus_client.parser import text_string_to_metric_families

from bakeoff.backends.spec import BackendSpec
from bakeoff.measure import control
from bakeoff.results.memory import MemoryAccount, MemorySource

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


class VllmPool(NamedTuple):
    tokens: int
    cache_dtype: str
    bytes: int | None  # the server's own figure (kv_cache_memory_bytes), where it gives one
    said: str


def _label_int(labels: Mapping[str, str], name: str) -> int | None:
    try:
        value = int(labels[name])
    except (KeyError, ValueError):  # absent, or vLLM's "None"
        return None
    return value if value > 0 else None


def vllm_pool(metrics_text: str) -> VllmPool | None:
    """The KV pool from vLLM's ``cache_config_info`` labels, when it has them."""
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:
        return None
    for family in families:
        if not family.name.endswith("cache_config_info"):
            continue
        for sample in family.samples:
            labels = sample.labels
            blocks, block = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
            tokens = _label_int(labels, "kv_cache_size_tokens")
            said = f"kv_cache_size_tokens = {tokens}"
            if tokens is None and blocks is not None and block is not None:
                tokens, said = blocks * block, f"num_gpu_blocks x block_size = {blocks * block}"
            if tokens is None:
                continue
            size = _label_int(labels, "kv_cache_memory_bytes")
            if size is not None:
                said += f", kv_cache_memory_bytes = {size}"
            return VllmPool(tokens, labels.get("cache_dtype", "auto"), size, "vllm:cache_config_info: " + said)
    return None


def _pad(tokens: int, to: int = 256) -> int:
    return -(-tokens // to) * to


def llamacpp_pool(props: Mapping[str, Any], argv: Sequence[str]) -> tuple[int, str] | None:
    """llama.cpp's pool in tokens (from ``/props`` and the launch flags), and how it was found."""
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    slots = props.get("total_slots")
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        return None
    said = f"/props default_generation_settings.n_ctx = {n_ctx} tokens per slot"
    per_slot, ctx_size = _flag_value(argv, "--kv-unified-per-slot"), _flag_value(argv, "--ctx-size")
    if "--kv-unified" not in argv:
        if not isinstance(slots, int) or slots <= 0:
            return None
        return n_ctx * slots, f"{said} x total_slots {slots} (a slice each)"
    if ctx_size is not None and ctx_size.isdigit() and int(ctx_size) > 0:
        return _pad(int(ctx_size)), f"--ctx-size {ctx_size} (padded to 256 cells; {said})"
    if per_slot is not None and per_slot.isdigit() and isinstance(slots, int) and slots > 0:
        pool = _pad(slots * int(per_slot))
        return pool, f"{said}; the pool: total_slots {slots} x --kv-unified-per-slot {per_slot}, padded to 256 = {pool}"
    return n_ctx, f"{said}, one unified pool every slot may fill"


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
    said_bytes: int | None = None
    if backend.metrics.path:
        answer = control.call(root + backend.metrics.path, headers=headers, timeout_s=5.0)
        vllm = vllm_pool(answer.text) if answer.status == 200 else None
        if vllm is not None:
            pool, cache_type, said_bytes, pool_from = vllm
            if cache_type in ("auto", ""):  # the cache takes the served dtype (vLLM's --dtype), else the checkpoint's
                cache_type = _flag_value(argv, "--dtype") or "auto"
    if pool is None:
        answer = control.call(root + "/props", headers=headers, timeout_s=5.0)
        if answer.status == 200:
            with _quiet():
                found = llamacpp_pool(orjson.loads(answer.body), argv)
                if found is not None:
                    pool, pool_from = found
                    cache_type = _flag_value(argv, "--cache-type-k") or "f16"
    per_token, per_token_from = kv_bytes_per_token(model_dir, cache_type)
    if said_bytes is not None and pool:  # the server's own size is the figure; per token follows from it
        per_token, per_token_from = said_bytes / pool, "bytes per token from the server's own size"
    elif per_token is None:
        notes.append(f"KV bytes per token: {per_token_from}")
    pool_bytes = said_bytes
    if pool_bytes is None and pool is not None and per_token is not None:
        pool_bytes = round(pool * per_token)
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
