"""bakeoff: head-to-head benchmarks of LLM serving frameworks, with notebook reports.

A regular package (not a namespace one), so :mod:`importlib.resources` hands back real
folders for what ships inside it (see :mod:`bakeoff.paths`). Importing it does nothing else.
"""
