"""What server and host report during a run, and what produced the run.

Owns Prometheus scrapes and cache control (:mod:`.telemetry`), the once-a-second series
(:mod:`.telemetry_series`), host process and GPU probes (:mod:`.hoststats`) and a run's
origin: versions, machine, git revision (:mod:`.origin`).
May import: ``serving`` and everything below it.
"""
