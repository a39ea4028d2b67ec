"""Running, guarding and exporting the papermill notebooks.

Owns notebook execution that Ctrl-C reaches (:mod:`.kernelrun`, with a kernel manager that
sends no SIGINT at shutdown, :mod:`.quiet_shutdown`), the parameter checks the notebooks run
first (:mod:`.guards`) and self-contained HTML export (:mod:`.htmlexport`).
May import: ``observe`` and everything below it; never ``analysis`` (a sibling).

Importing this package keeps ``rfc3987_syntax`` from loading in this process: jsonschema
(under nbformat, which papermill, nbclient and nbconvert all import) loads it when installed
(``jupyterlab``, the ``lab`` extra, brings it along) only to offer an ``iri`` format check,
and it compiles 38 grammars as it loads, over 3 s of CPU in every process that runs or
exports a notebook. Nothing here checks formats: nbformat validates without a format checker.
"""

import sys

sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: "not installed" to import
