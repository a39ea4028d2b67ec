"""Start a framework, watch it, stop it.

Owns backend specs and knobs (validated data), rendering one launch, local processes and
containers (runtime, images, the TensorRT-LLM engine build), the CPU engine's environment,
the GPU queries (``nvidia-smi`` and NVML, :mod:`.gpus`), pre-start GPU checks, the death
watch that ends a run, ``backends show`` and starting the reference server by argv. Holding a
launch against the framework's release (pre-flight parse, wheel audit) is :mod:`bakeoff.conformance`.
May import: ``measure``, ``models``, ``workloads``, ``results``, the leaves, and ``ref``'s option model.
"""
