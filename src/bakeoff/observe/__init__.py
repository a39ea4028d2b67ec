"""What server and host report during a run, and what produced the run.

Owns Prometheus scrapes and cache control (:mod:`.telemetry`), the once-a-second series
(:mod:`.telemetry_series`), the host's process probe (:mod:`.hoststats`; the GPUs are asked
through :mod:`bakeoff.host.gpus`) and a run's origin: versions, machine, git revision
(:mod:`.origin`).
May import: ``serving`` and everything below it.
"""
