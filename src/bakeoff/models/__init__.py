"""The model under test: generated, located, converted.

Owns the generated Llama presets (:mod:`.modelgen`), where a campaign's model comes from and
what a server needs to read it (:mod:`.model_source`), and GGUF conversion for llama.cpp.
May import: ``workloads``, ``results`` and the leaves.
"""
