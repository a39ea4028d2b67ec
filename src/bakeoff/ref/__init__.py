"""The reference server: an OpenAI-compatible streaming server with exactly known timing and faults.

The oracle bakeoff's measurement is tested against, and the stand-in of each GPU framework
in a rehearsal (one wire profile per framework). Started by argv
(``python -m bakeoff.ref.server``); it imports nothing of the harness, so it can never share
a bug with what it tests (the import-linter contract in ``pyproject.toml`` holds this).
"""
