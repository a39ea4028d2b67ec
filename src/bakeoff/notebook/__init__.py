"""Running, guarding and exporting the papermill notebooks.

Owns notebook execution that Ctrl-C reaches (:mod:`.kernelrun`, with a kernel manager that
sends no SIGINT at shutdown, :mod:`.quiet_shutdown`), the parameter checks the notebooks run
first (:mod:`.guards`) and self-contained HTML export (:mod:`.htmlexport`).
May import: ``observe`` and everything below it; never ``analysis`` (a sibling).
"""
