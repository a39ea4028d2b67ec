"""The contract on disk between what measures and what reads.

Owns the per-request record (:mod:`.records`), the typed ``summary.json`` (:mod:`.summary`) and
``cell.json`` (:mod:`.cell_record`),
crash-safe run-folder writes (:mod:`.store`), the one metric table (:mod:`.metric_table`) and
its formulas (:mod:`.formulas`), and a
campaign folder's layout read back: typed cells and the campaign as run (:mod:`.layout`, its
view of ``campaign.yaml`` in :mod:`.campaign_copy`).
May import: the leaves (``errors``, ``paths``, ``schema``, ``console``) only.
"""
