"""Runs over time: archives, the DuckDB index, baselines, compare gates and the trend report.

May import: ``analysis``, ``notebook`` and everything below; never ``report`` (a sibling).
"""
