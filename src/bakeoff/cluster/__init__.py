"""Campaigns on Ray: every cell a Ray task, and where their results are kept.

May import: ``campaign`` and everything below it.
"""
