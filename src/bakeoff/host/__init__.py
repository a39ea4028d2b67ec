"""This host checked against a launch: its CPU's instruction sets, its GPUs and their driver.

Owns the GPU queries (``nvidia-smi`` and NVML, :mod:`.gpus`), the pre-start GPU checks (driver
CUDA against the image, KV-cache and model dtypes, draft models: :mod:`.gpu_checks`) and the CPU
engines' instruction-set checks (:mod:`.cpu_checks`): each a pure check over what the host
reports, asked in one place, so tests stand recorded outputs in for a GPU host. ``bakeoff doctor``
(:mod:`bakeoff.doctor`) composes them with the container runtime's facts before a run.
May import: ``backends`` and everything below it.
"""
