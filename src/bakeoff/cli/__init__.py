"""The ``bakeoff`` command line: the parser and one handler module per command group.

May import: anything; nothing imports it but the console entry point and ``python -m bakeoff``.
"""
