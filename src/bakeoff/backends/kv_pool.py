"""One KV-pool intent for every GPU framework: the memory-share knob each reads differently, mapped.

The vocabulary knob ``gpu_memory_utilization`` reaches the frameworks under different
meanings, which each backend YAML declares as the knob's ``memory_basis``:

- ``total`` (vLLM ``--gpu-memory-utilization``): a share of the GPU's total memory for
  everything the instance holds, weights, activation peak and KV cache; the pool is what is
  left of that budget after the weights and activations;
- ``total_static`` (SGLang ``--mem-fraction-static``): a share of total memory for the weights
  and the KV pool; activations and CUDA graphs live outside it;
- ``free_after_load`` (TensorRT-LLM ``kv_cache_config.free_gpu_memory_fraction``): a share of
  the memory still free once the weights and runtime buffers are placed.

So one number for all three sizes three different pools. A campaign's ``kv_pool`` section
(:class:`KvPool`) states the pool once, as a share of each GPU's memory, with the facts the
mapping needs (the GPU's memory, the weights per GPU, the activation reserve), and
:func:`kv_pool_value` gives each basis the value that yields that pool:

- ``total``: (weights + activations + pool) / GPU memory
- ``total_static``: (weights + pool) / GPU memory
- ``free_after_load``: pool / (GPU memory - weights - activations)

:func:`apply_kv_pool` writes those values into each server's knobs at expansion (a server that
also sets ``gpu_memory_utilization`` is refused: two statements of one pool), and
:func:`kv_pool_settings` lists them beside the intent for the launch steps and the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, model_validator

from bakeoff.backends.spec import BackendSpec, KnobValue, MemoryBasis
from bakeoff.errors import KnobError
from bakeoff.schema import Strict

KNOB = "gpu_memory_utilization"
BASIS_TEXT: dict[MemoryBasis, str] = {
    "total": "share of total GPU memory for weights + activations + KV cache",
    "total_static": "share of total GPU memory for weights + KV pool (activations outside)",
    "free_after_load": "share of the memory free after weights and runtime buffers",
}


class KvPool(Strict):
    """The KV pool a campaign wants on every GPU server, and the facts that size it per framework."""

    share_of_gpu: Annotated[float, Field(gt=0, lt=1)] = Field(
        description="the KV pool as a share of each GPU's total memory, e.g. 0.5"
    )
    gpu_memory_gib: Annotated[float, Field(gt=0)] = Field(description="each GPU's total memory, GiB (nvidia-smi)")
    weights_gib: Annotated[float, Field(gt=0)] = Field(description="the model's weights on each GPU, GiB")
    activations_gib: Annotated[float, Field(ge=0)] = Field(
        description="activations, CUDA graphs and runtime buffers on each GPU, GiB (vLLM's start log says its peak)"
    )

    @property
    def pool_gib(self) -> float:
        return self.share_of_gpu * self.gpu_memory_gib

    @model_validator(mode="after")
    def _fits(self) -> KvPool:
        used = self.weights_gib + self.activations_gib + self.pool_gib
        if used > self.gpu_memory_gib:
            raise ValueError(
                f"weights {self.weights_gib:g} + activations {self.activations_gib:g} + KV pool "
                f"{self.pool_gib:g} GiB exceed the GPU's {self.gpu_memory_gib:g} GiB; lower share_of_gpu"
            )
        return self

    def text(self) -> str:
        return (
            f"KV pool {self.share_of_gpu:.0%} of each GPU's {self.gpu_memory_gib:g} GiB ({self.pool_gib:.1f} GiB), "
            f"beside {self.weights_gib:g} GiB of weights and {self.activations_gib:g} GiB of activations"
        )


def kv_pool_value(basis: MemoryBasis, pool: KvPool) -> float:
    """The value of a ``basis`` memory knob that gives ``pool``, rounded down to 0.001 (never a larger pool)."""
    gpu, weights, acts = pool.gpu_memory_gib, pool.weights_gib, pool.activations_gib
    if basis == "total":
        value = (weights + acts + pool.pool_gib) / gpu
    elif basis == "total_static":
        value = (weights + pool.pool_gib) / gpu
    else:
        value = pool.pool_gib / (gpu - weights - acts)
    return math.floor(value * 1000 + 1e-9) / 1000


@dataclass(frozen=True)
class KvPoolSetting:
    """One server's value for the campaign's KV-pool intent, in its framework's own terms."""

    server: str
    backend: str
    target: str  # the native flag or config key
    basis: MemoryBasis
    value: float

    def text(self) -> str:
        return f"{self.server}: {self.target} {self.value:g} ({BASIS_TEXT[self.basis]})"


def _basis(backend: BackendSpec, where: str) -> MemoryBasis:
    spec = backend.knobs.get(KNOB)
    if spec is None or spec.memory_basis is None:
        raise KnobError(
            f"{where}: kv_pool sizes the KV pool through {KNOB}, which backend {backend.name!r} "
            "does not map with a memory_basis; leave this server out or drop kv_pool"
        )
    return spec.memory_basis


def kv_pool_settings(pool: KvPool, servers: list[tuple[str, BackendSpec]]) -> list[KvPoolSetting]:
    """Each (label, backend)'s native knob and value for ``pool``."""
    out = []
    for label, backend in servers:
        basis = _basis(backend, label)
        spec = backend.knobs[KNOB]
        target = spec.flag or spec.config_key or spec.env or KNOB
        out.append(KvPoolSetting(label, backend.name, target, basis, kv_pool_value(basis, pool)))
    return out


def apply_kv_pool(
    pool: KvPool | None, servers: list[tuple[str, BackendSpec, dict[str, KnobValue]]]
) -> list[dict[str, KnobValue]]:
    """Each server's knobs with its framework's value for ``pool`` set; unchanged without a pool."""
    if pool is None:
        return [dict(knobs) for _, _, knobs in servers]
    out = []
    for label, backend, knobs in servers:
        if KNOB in knobs:
            raise KnobError(
                f"{label}: knobs.{KNOB} and kv_pool both size the KV pool; keep kv_pool (one intent, "
                "mapped per framework) or drop it"
            )
        (setting,) = kv_pool_settings(pool, [(label, backend)])
        out.append({**knobs, KNOB: setting.value})
    return out
