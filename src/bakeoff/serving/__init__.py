"""Start a framework, watch it, stop it: the server lifecycle.

Owns starting a rendered launch (:mod:`.launchers`, one launcher per kind: local processes,
containers with their runtime and images, the TensorRT-LLM engine build, the rehearsal
stand-in and its quality answers, an external server), the started server as one typed
handle with what each launcher kind means (:mod:`.handle`), the CPU engine's environment, GPU
pinning, the death watch that ends a run, ``backends show`` and starting the reference server
by argv. What a backend and a launch *are* (specs, knobs, rendering) is :mod:`bakeoff.backends`;
the host's GPU and CPU checks are :mod:`bakeoff.host`; holding a launch against the framework's
release (pre-flight parse, wheel audit) is :mod:`bakeoff.conformance`.
May import: ``host``, ``backends``, ``measure``, ``models``, ``workloads``, ``results``, the leaves,
and ``ref``'s option model.
"""
