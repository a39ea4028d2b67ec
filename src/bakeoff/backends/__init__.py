"""The backend model: what a framework is and how one launch of it reads, as validated data.

Owns backend specs and their knob vocabulary (:mod:`.spec`, the ``backends/*.yaml`` files), knob
values checked and filled (:mod:`.knobs`), one KV-pool intent mapped to each framework's own
memory knob (:mod:`.kv_pool`), a campaign's ``servers:`` entry (:mod:`.server_config`),
the space ``bakeoff tune`` searches (:mod:`.tune_space`) and one launch or engine build rendered
for one knob set (:mod:`.launch_render`). Nothing here starts, asks or measures anything: starting
a rendered launch is :mod:`bakeoff.serving`, checking it against this host is :mod:`bakeoff.host`.
May import: ``measure``, ``models`` and everything below them.
"""
