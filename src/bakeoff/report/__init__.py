"""What ``compare.ipynb`` shows, read-only over one campaign folder.

Owns the tables and figures (:mod:`.tables`), the explanation sections (:mod:`.explain`), the
cluster and trace-replay sections, figure conventions and the measured-apart check.
May import: ``analysis``, ``notebook`` and everything below; never ``history`` (a sibling).
"""
