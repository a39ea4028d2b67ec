"""Orchestration: a campaign's spec, its cells, running them, resuming, rehearsing, scheduling.

Owns the campaign spec that composes every stage's section, the cells and their checks, one
cell handed over (:mod:`.cell_spec`: the typed ``cell_spec.json`` a notebook kernel, a Ray task
or a tune trial reads) and measured (:mod:`.cell_run`), the campaign driven (:mod:`.execute`),
the tuner (:mod:`.tune`, a package of one module per stage), the runner of plans against one
server, the cold-cache restart policy, quality checks, resume state, rehearsals (a transform of
the spec made once, :mod:`.campaign_input`, carried by the servers' launcher), recurring
schedules (cron/systemd/CI) and the campaign's estimates and progress lines.
May import: every stage below it (``report``, ``history`` and down).
"""
