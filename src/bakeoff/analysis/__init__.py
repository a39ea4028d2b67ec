"""Judgements over measured runs: noise, gates, verdicts, Pareto, roofline, diagnosis, advice.

Read-only over results: nothing here starts a server or writes a run.
May import: ``observe`` and everything below it; never ``notebook`` (a sibling).
"""
