"""What ``compare.ipynb`` shows, read-only over one campaign folder.

Owns the tables and figures, one module per section (:mod:`.frame`, :mod:`.setup`,
:mod:`.sweeps`, :mod:`.findings`, :mod:`.outcomes`; :mod:`.tables` is the notebooks' one import),
the explanation sections (:mod:`.explain`), the
cluster and trace-replay sections, figure conventions and the measured-apart check.
May import: ``analysis``, ``notebook`` and everything below; never ``history`` (a sibling).
"""
