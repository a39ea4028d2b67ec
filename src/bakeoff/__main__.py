"""``python -m bakeoff``: the ``bakeoff`` command, for environments without its console script."""

from bakeoff.cli.main import main

raise SystemExit(main())
